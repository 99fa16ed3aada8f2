//! GPT-2 byte-level BPE (tiktoken-rs's embedded r50k_base, offline). Any byte string
//! round-trips: valid UTF-8 runs go through BPE, every other byte becomes its single-byte token.

use std::sync::LazyLock;

use tiktoken_rs::CoreBPE;

use crate::{Error, Result};

/// GPT-2's vocabulary size (50,256 BPE tokens plus `<|endoftext|>`).
pub const VOCAB: u32 = 50257;
/// `<|endoftext|>`: the context every segment starts from.
pub const EOT: u32 = 50256;

struct Tok {
    bpe: &'static CoreBPE,
    byte_token: [u32; 256],
    /// bytes of every token id
    bytes: Vec<Vec<u8>>,
}

static TOK: LazyLock<std::result::Result<Tok, String>> = LazyLock::new(|| {
    let bpe = tiktoken_rs::r50k_base_singleton();
    let mut bytes = Vec::with_capacity(VOCAB as usize);
    let mut byte_token = [u32::MAX; 256];
    for id in 0..VOCAB {
        let b = bpe
            .decode_bytes(&[id])
            .map_err(|e| format!("token {id}: {e:?}"))?;
        if b.len() == 1 && byte_token[b[0] as usize] == u32::MAX {
            byte_token[b[0] as usize] = id;
        }
        bytes.push(b);
    }
    if byte_token.contains(&u32::MAX) {
        return Err("r50k_base lacks a single-byte token".into());
    }
    Ok(Tok {
        bpe,
        byte_token,
        bytes,
    })
});

fn tok() -> Result<&'static Tok> {
    TOK.as_ref()
        .map_err(|e| Error::Invalid(format!("tokenizer: {e}")))
}

/// Tokenize any bytes. `<|endoftext|>` in the text is ordinary text.
pub fn encode(data: &[u8]) -> Result<Vec<u32>> {
    let t = tok()?;
    let mut out = Vec::with_capacity(data.len() / 3 + 1);
    for chunk in data.utf8_chunks() {
        if !chunk.valid().is_empty() {
            out.extend(t.bpe.encode_ordinary(chunk.valid()));
        }
        out.extend(chunk.invalid().iter().map(|&b| t.byte_token[b as usize]));
    }
    Ok(out)
}

/// Bytes of one token (`None` for ids outside the vocabulary).
pub fn token_bytes(id: u32) -> Option<&'static [u8]> {
    tok().ok()?.bytes.get(id as usize).map(|v| v.as_slice())
}

/// Concatenate the bytes of tokens.
pub fn decode(tokens: &[u32]) -> Result<Vec<u8>> {
    let t = tok()?;
    let mut out = Vec::new();
    for &id in tokens {
        let b = t.bytes.get(id as usize).ok_or_else(|| {
            Error::format(
                "token stream",
                format!("token id {id} outside the vocabulary"),
            )
        })?;
        out.extend_from_slice(b);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_ids_and_binary_roundtrip() {
        assert_eq!(encode(b"hello world").unwrap(), vec![31373, 995]);
        let bin: Vec<u8> = (0..=255u8).chain([0xff, 0xfe, b'a', 0xc3]).collect();
        assert_eq!(decode(&encode(&bin).unwrap()).unwrap(), bin);
        let s = "<|endoftext|> na\u{ef}ve \u{2713}\r\n\t".as_bytes();
        assert_eq!(decode(&encode(s).unwrap()).unwrap(), s);
        assert!(decode(&[VOCAB]).is_err());
    }
}
