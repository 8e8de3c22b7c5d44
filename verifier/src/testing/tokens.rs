//! A byte-level tokenizer built in memory, and where a scripted answer starts.

use serde_json::{Value, json};

use crate::tokenizer::Tokenizer;

/// Ids of the tiny tokenizer's special tokens (the 256 byte tokens come first).
pub const END_OF_TEXT: u32 = 256;
/// `<|im_start|>`: where a scripted answer begins.
pub const IM_START: u32 = 257;
/// `<|im_end|>`: end of turn.
pub const IM_END: u32 = 258;
/// Vocabulary size of the tiny tokenizer.
pub const VOCAB: usize = 259;
/// Positions the scripted draft takes.
pub const CONTEXT: usize = 2048;
/// Width of the scripted draft's hidden state.
pub const HIDDEN: usize = 8;

/// GPT-2's byte-to-character table, which byte-level BPE vocabularies are written in.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (u32::from(b'!')..=u32::from(b'~'))
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut table = vec!['\0'; 256];
    for (b, c) in printable.into_iter().zip(chars) {
        table[b as usize] = char::from_u32(c).unwrap_or('\0');
    }
    table
}

/// The `tokenizer.json` of [`tiny_tokenizer`], for tests that add merges to it.
pub fn tiny_tokenizer_spec() -> Value {
    let vocab: serde_json::Map<String, Value> = byte_chars()
        .into_iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), json!(i)))
        .collect();
    let special = |id: u32, content: &str| json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(END_OF_TEXT, "<|endoftext|>"), special(IM_START, "<|im_start|>"), special(IM_END, "<|im_end|>")],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": []},
    })
}

/// A byte-level tokenizer: one token per byte (id = byte value), plus `<|endoftext|>`,
/// `<|im_start|>` and `<|im_end|>`. Multi-byte characters span several tokens, as they do in
/// the real draft's vocabulary.
pub fn tiny_tokenizer() -> Tokenizer {
    match Tokenizer::from_json(&tiny_tokenizer_spec().to_string()) {
        Ok(t) => t,
        // The specification above is fixed; failing to load it is a bug in this file.
        #[allow(clippy::panic)]
        Err(e) => panic!("tiny tokenizer: {e}"),
    }
}

/// [`tiny_tokenizer`] plus merges that make "Hello" one token and "Hel" two ("He", "l"): the
/// tokenization of "Hel" + "lo" differs from that of "Hel" followed by that of "lo", and a cut
/// inside "Hello" changes the ids.
pub fn merging_tokenizer() -> Tokenizer {
    let mut spec = tiny_tokenizer_spec();
    let mut vocab = spec["model"]["vocab"]
        .as_object_mut()
        .map(std::mem::take)
        .unwrap_or_default();
    for (i, t) in ["He", "ll", "Hell", "Hello"].iter().enumerate() {
        vocab.insert((*t).to_string(), json!(300 + i));
    }
    spec["model"]["vocab"] = Value::Object(vocab);
    spec["model"]["merges"] = json!(["H e", "l l", "He ll", "Hell o"]);
    match Tokenizer::from_json(&spec.to_string()) {
        Ok(t) => t,
        // The specification above is fixed; failing to load it is a bug in this file.
        #[allow(clippy::panic)]
        Err(e) => panic!("merging tokenizer: {e}"),
    }
}

/// Where the answer starts: just after the last `<|im_start|>`, else after everything.
pub(super) fn answer_position(seq: &[u32]) -> usize {
    seq.len()
        - seq
            .iter()
            .rev()
            .position(|&t| t == IM_START)
            .unwrap_or(seq.len())
}
