//! The integer GPT-2's format facts: the `.lsm` model file and the fixed-point arithmetic
//! every device computes with (docs/INTEGER_GPT2.md).

pub mod fixed;
pub mod model_file;
