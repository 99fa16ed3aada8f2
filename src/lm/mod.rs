//! Integer-only GPT-2 text codec (the Taco method). See docs/INTEGER_GPT2.md.
pub mod cm;
pub mod convert;
pub mod equalize;
pub mod match_model;
pub mod range_coder;
pub mod text_codec;
pub mod tokenizer;
