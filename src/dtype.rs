//! Element types lockstep understands, and the facts the codecs need about each one.

use crate::{Error, Result};

/// A tensor element type. Float types go through the ULP-residual codec; the others through
/// the generic byte path (stored losslessly, never rejected).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F64,
    F32,
    F16,
    BF16,
    /// float8 E4M3FN: 4 exponent bits, 3 mantissa bits, no infinities.
    F8E4M3,
    /// float8 E5M2: 5 exponent bits, 2 mantissa bits.
    F8E5M2,
    Bool,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
}

/// Where the exponent field sits in a float's bit pattern.
#[derive(Clone, Copy, Debug)]
pub struct FloatLayout {
    /// Total width w in bits (8, 16, 32 or 64).
    pub width: u32,
    /// Bit index of the exponent field's least significant bit (= mantissa width).
    pub mantissa_bits: u32,
    /// Width of the exponent field.
    pub exponent_bits: u32,
}

impl DType {
    pub const ALL: [DType; 15] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
        DType::I64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::U64 | DType::I64 => 8,
            DType::F32 | DType::U32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::U16 | DType::I16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::Bool | DType::U8 | DType::I8 => 1,
        }
    }

    /// The bit layout of a float type; `None` for integer and bool types.
    pub fn float_layout(self) -> Option<FloatLayout> {
        let (width, mantissa_bits, exponent_bits) = match self {
            DType::F64 => (64, 52, 11),
            DType::F32 => (32, 23, 8),
            DType::F16 => (16, 10, 5),
            DType::BF16 => (16, 7, 8),
            DType::F8E4M3 => (8, 3, 4),
            DType::F8E5M2 => (8, 2, 5),
            _ => return None,
        };
        Some(FloatLayout {
            width,
            mantissa_bits,
            exponent_bits,
        })
    }

    pub fn is_float(self) -> bool {
        self.float_layout().is_some()
    }

    /// The one-byte code stored in blobs (docs/FORMAT.md). Never reuse a code.
    pub fn code(self) -> u8 {
        match self {
            DType::F64 => 1,
            DType::F32 => 2,
            DType::F16 => 3,
            DType::BF16 => 4,
            DType::F8E4M3 => 5,
            DType::F8E5M2 => 6,
            DType::Bool => 16,
            DType::U8 => 17,
            DType::I8 => 18,
            DType::U16 => 19,
            DType::I16 => 20,
            DType::U32 => 21,
            DType::I32 => 22,
            DType::U64 => 23,
            DType::I64 => 24,
        }
    }

    pub fn from_code(code: u8) -> Result<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.code() == code)
            .ok_or_else(|| Error::format("tensor blob", format!("unknown dtype code {code}")))
    }

    /// The name safetensors uses in its JSON header.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F64 => "F64",
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            DType::Bool => "BOOL",
            DType::U8 => "U8",
            DType::I8 => "I8",
            DType::U16 => "U16",
            DType::I16 => "I16",
            DType::U32 => "U32",
            DType::I32 => "I32",
            DType::U64 => "U64",
            DType::I64 => "I64",
        }
    }

    pub fn from_safetensors_name(name: &str) -> Result<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.safetensors_name() == name)
            .ok_or_else(|| Error::Unsupported(format!("safetensors dtype {name}")))
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.safetensors_name())
    }
}
