//! Context-mixing text coding (stream version 2, docs/INTEGER_GPT2.md §13): a bit-level
//! coder that mixes adaptive context models, a match model and the integer GPT-2, in
//! integers, in order, in independent blocks or in strands.
pub mod coder;
pub mod lm_bits;
pub mod logistic;
pub mod predictor;
pub mod strand_tables;
pub mod strands;
pub mod stream;
