//! Incremental detokenisation with the real tokenizer: multi-byte characters split across
//! byte-level tokens are never emitted in halves.

// Tests fail by panicking; helpers here are test code too.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod common;

use approxy_verifier::tokenizer::StreamDecoder;

#[test]
fn multibyte_characters_stream_whole() {
    let tok = common::tokenizer();
    let text = "héllo 世界 🚀🦀 naïve — ñandú 👩‍💻 done";
    let ids = tok.encode(text).unwrap_or_else(|e| panic!("{e}"));
    // At least one character must span several tokens, or this test proves nothing.
    let pieces: Vec<String> = ids
        .iter()
        .map(|&i| tok.decode(&[i]).unwrap_or_default())
        .collect();
    assert!(
        pieces.iter().any(|p| p.contains('\u{FFFD}')),
        "no split character in {pieces:?}"
    );
    let mut d = StreamDecoder::new(tok.clone());
    let mut out = String::new();
    for &id in &ids {
        let delta = d.push(id).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            !delta.contains('\u{FFFD}'),
            "half a character emitted: {delta:?}"
        );
        out.push_str(&delta);
    }
    out.push_str(&d.flush().unwrap_or_else(|e| panic!("{e}")));
    assert_eq!(out, text);
}
