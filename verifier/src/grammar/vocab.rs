//! The draft's vocabulary as llguidance sees it: every token id's bytes (from the draft's own
//! `tokenizer.json`, special tokens marked so that no text can spell them), padded to the
//! draft's logit width, and the draft's tokenizer for the forced text.

use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::error::EngineError;
use crate::tokenizer::Tokenizer;

/// A [`TokenizerEnv`] over the draft's tokenizer.
struct DraftVocab {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for DraftVocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Forced text is the grammar's, never a chat turn: special-token text stays text.
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer.encode_plain(text).unwrap_or_default()
        })
    }
}

/// The environment llguidance compiles grammars against. `width` is the draft's logit count,
/// which can exceed the tokenizer's vocabulary (Qwen2.5 pads 151,665 tokens to 151,936): the
/// ids past it get bytes no text has, so a mask never allows them. `eos` are the ids that end
/// an answer; the grammar allows them only where the answer may end.
pub fn tok_env(tokenizer: &Tokenizer, width: usize, eos: &[u32]) -> Result<TokEnv, EngineError> {
    let spec = tokenizer.spec_json()?;
    let mut bytes = llguidance::token_bytes_from_tokenizer_json(&spec)
        .map_err(|e| EngineError::Tokenizer(format!("token bytes for the grammar: {e}")))?;
    if bytes.len() > width {
        return Err(EngineError::Tokenizer(format!(
            "the tokenizer has {} tokens and the draft only {width} logits",
            bytes.len()
        )));
    }
    while bytes.len() < width {
        let mut name = format!(".<[{}]>", bytes.len()).into_bytes();
        name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
        bytes.push(name);
    }
    let Some(&first) = eos.first() else {
        return Err(EngineError::Tokenizer(
            "no end-of-sequence token for the grammar".into(),
        ));
    };
    if let Some(&outside) = eos.iter().find(|&&t| t as usize >= width) {
        return Err(EngineError::Tokenizer(format!(
            "end-of-sequence id {outside} is outside the draft's {width} logits"
        )));
    }
    let info = TokRxInfo::new(width as u32, first);
    let trie = TokTrie::from(&info, &bytes).with_eos_tokens(eos);
    Ok(Arc::new(DraftVocab {
        trie,
        tokenizer: tokenizer.clone(),
    }))
}
