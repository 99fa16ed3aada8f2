//! Outlier-channel equalization (docs/INTEGER_GPT2.md §7).
use super::convert::{convert_bytes, Equalization};
use super::model_file::Model;
use crate::Result;

pub fn convert_equalized(config_text: &str, st_bytes: &[u8]) -> Result<Model> {
    convert_bytes(config_text, st_bytes, None::<&Equalization>)
}
