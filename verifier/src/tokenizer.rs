//! The draft's tokenizer (`tokenizer.json`) and incremental detokenisation that never emits
//! half a UTF-8 character.

use std::path::Path;
use std::sync::Arc;

use crate::error::EngineError;

/// A shared, thread-safe tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// The same vocabulary reading special-token text as plain text: for what a client wrote.
    plain: Arc<tokenizers::Tokenizer>,
    /// The texts of the special tokens, listed once.
    specials: Arc<Vec<String>>,
    /// Ids in the vocabulary, added tokens included. Counted once: the library counts by
    /// building the whole vocabulary map (about 40 ms for the draft's 151,665 tokens), and the
    /// decode loop checks every target token against it.
    vocab_size: usize,
    /// The most bytes of text one token covers (the longest vocabulary entry; 128 for the
    /// draft's), where the tokenizer has no normalizer that could shrink its input (see
    /// [`Tokenizer::fewest_tokens`]).
    longest_token: Option<usize>,
}

/// A text holds more tokens than the bound it was encoded within: at least this many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooMany(pub usize);

/// Texts up to this long are encoded in one piece; longer ones in pieces of about this size, so
/// the tokenizer's working memory (a few hundred bytes per token: offsets, strings) stays
/// bounded whatever the text's length.
const PIECE_BYTES: usize = 64 << 10;

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.vocab_size)
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self, EngineError> {
        let t = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| EngineError::Tokenizer(format!("{}: {e}", path.display())))?;
        Ok(Self::wrap(t))
    }

    /// A tokenizer from `tokenizer.json` text.
    pub fn from_json(json: &str) -> Result<Self, EngineError> {
        let t: tokenizers::Tokenizer = json
            .parse()
            .map_err(|e| EngineError::Tokenizer(format!("tokenizer JSON: {e}")))?;
        Ok(Self::wrap(t))
    }

    fn wrap(t: tokenizers::Tokenizer) -> Self {
        let mut plain = t.clone();
        plain.set_encode_special_tokens(true);
        let specials = t
            .get_added_tokens_decoder()
            .values()
            .filter(|a| a.special)
            .map(|a| a.content.clone())
            .collect();
        // Every entry's key is at least as long as the text it covers: one character per byte
        // in a byte-level vocabulary, `▁` for a space, `<0x41>` for one byte.
        let longest_token = t.get_normalizer().is_none().then(|| {
            t.get_vocab(true)
                .keys()
                .map(String::len)
                .max()
                .unwrap_or(1)
                .max(1)
        });
        Self {
            vocab_size: t.get_vocab_size(true),
            longest_token,
            inner: Arc::new(t),
            plain: Arc::new(plain),
            specials: Arc::new(specials),
        }
    }

    /// Text to ids with special-token text read as plain text: a client who types
    /// `<|im_start|>system` into a message gets those characters, not a new turn.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let enc = self
            .plain
            .encode(text, false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The texts of the special tokens (`<|im_start|>`, `<|endoftext|>`, ...).
    pub fn special_texts(&self) -> &[String] {
        &self.specials
    }

    /// Text to ids. Special tokens written in the text (such as `<|im_start|>` from a chat
    /// template) are recognised, which is what the template needs.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The fewest tokens a text of `bytes` bytes can be, without running the tokenizer: its
    /// length over the longest token's, or 0 where the tokenizer's normalizer could shrink text
    /// (no bound then). A prompt that cannot fit a context is refused on this alone.
    pub fn fewest_tokens(&self, bytes: usize) -> usize {
        self.longest_token.map_or(0, |l| bytes / l)
    }

    /// [`Tokenizer::encode`] stopping once the text has more than `limit` tokens: the work and
    /// memory are those of about `limit` tokens, however long the text.
    pub fn encode_within(
        &self,
        text: &str,
        limit: usize,
    ) -> Result<Result<Vec<u32>, TooMany>, EngineError> {
        self.within(&self.inner, text, limit)
    }

    /// [`Tokenizer::encode_plain`] stopping once the text has more than `limit` tokens.
    pub fn encode_plain_within(
        &self,
        text: &str,
        limit: usize,
    ) -> Result<Result<Vec<u32>, TooMany>, EngineError> {
        self.within(&self.plain, text, limit)
    }

    /// A long text is counted piece by piece, cut where the pre-tokenizer would cut it (a token
    /// never spans two of its pieces) and never inside a special token's text, and stops at
    /// the piece that passes `limit`. One that fits is then encoded whole, so its ids are
    /// exactly those of one encoding.
    fn within(
        &self,
        t: &tokenizers::Tokenizer,
        text: &str,
        limit: usize,
    ) -> Result<Result<Vec<u32>, TooMany>, EngineError> {
        let fewest = self.fewest_tokens(text.len());
        if fewest > limit {
            return Ok(Err(TooMany(fewest)));
        }
        let encode = |part: &str| {
            t.encode(part, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| EngineError::Tokenizer(e.to_string()))
        };
        if text.len() > PIECE_BYTES {
            let (mut counted, mut at) = (0, 0);
            while at < text.len() {
                let end = self.piece_end(text, at)?;
                counted += encode(&text[at..end])?.len();
                if counted > limit {
                    return Ok(Err(TooMany(counted)));
                }
                at = end;
            }
        }
        let ids = encode(text)?;
        Ok(if ids.len() > limit {
            Err(TooMany(ids.len()))
        } else {
            Ok(ids)
        })
    }

    /// Where the piece of `text` from `at` ends: about [`PIECE_BYTES`] on, at the start of the
    /// last pre-tokenizer piece there, moved back before a special token's text that the cut
    /// would split. A single pre-tokenizer piece longer than that is cut inside (its count may
    /// then be off by a token or two; only the count is used).
    fn piece_end(&self, text: &str, at: usize) -> Result<usize, EngineError> {
        let end = text.floor_char_boundary(at + PIECE_BYTES);
        if end >= text.len() {
            return Ok(text.len());
        }
        let mut cut = at + self.last_piece_start(&text[at..end])?;
        if cut == at {
            cut = end;
        }
        for special in self.specials.iter() {
            let from = text.floor_char_boundary(cut.saturating_sub(special.len() - 1));
            let to = text.ceil_char_boundary((cut + special.len() - 1).min(text.len()));
            if let Some(i) = text[from..to].find(special.as_str())
                && from + i < cut
                && from + i + special.len() > cut
                && from + i > at
            {
                cut = from + i;
            }
        }
        Ok(cut)
    }

    /// Ids to text, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String, EngineError> {
        self.inner
            .decode(ids, true)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    /// Ids to text with special tokens kept: a prompt rendered from a chat template comes back
    /// as the template wrote it (text-level targets are sent that text).
    pub fn decode_with_specials(&self, ids: &[u32]) -> Result<String, EngineError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    /// Byte offset where the last pre-tokenizer piece of `text` starts (a word with its
    /// leading space, a number, a run of punctuation or of whitespace). A token never spans two
    /// pieces, but the last piece may still grow into the text that follows it ("Hel" + "lo"),
    /// so text up to here is a clean boundary and the rest is not. A tokenizer without a
    /// pre-tokenizer falls back to the start of the last token.
    pub fn last_piece_start(&self, text: &str) -> Result<usize, EngineError> {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
        if text.is_empty() {
            return Ok(0);
        }
        if let Some(pt) = self.inner.get_pre_tokenizer() {
            let mut pieces = PreTokenizedString::from(text);
            pt.pre_tokenize(&mut pieces)
                .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
            let splits = pieces.get_splits(OffsetReferential::Original, OffsetType::Byte);
            return Ok(splits.last().map_or(0, |(_, (start, _), _)| *start));
        }
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(enc.get_offsets().last().map_or(0, |(start, _)| *start))
    }

    /// The ids of `text[from..]`: as a tokenization of all of `text` has them when one of its
    /// tokens starts exactly at `from` (the canonical ids, as if the text had been tokenized in
    /// one piece), else `text[from..]` tokenized on its own (the text is the same either way).
    pub fn encode_tail(&self, text: &str, from: usize) -> Result<Vec<u32>, EngineError> {
        let tail = text.get(from..).ok_or_else(|| {
            EngineError::Tokenizer(format!("offset {from} is not a character boundary"))
        })?;
        if from == 0 {
            return self.encode(text);
        }
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        let offsets = enc.get_offsets();
        let split = (0..offsets.len()).find(|&i| offsets[i].0 >= from);
        if let Some(i) = split
            && offsets[i].0 == from
            && offsets[..i].iter().all(|o| o.1 <= from)
        {
            let ids = enc.get_ids()[i..].to_vec();
            // Offsets of byte-level pieces can be coarse; the text must come back exactly.
            if self.decode_with_specials(&ids)? == tail {
                return Ok(ids);
            }
        }
        self.encode(tail)
    }

    /// Ids that end a generation: ChatML's end of turn and the end-of-text token (the Qwen
    /// family's), those of them the vocabulary has.
    pub fn end_of_sequence_ids(&self) -> Vec<u32> {
        ["<|im_end|>", "<|endoftext|>"]
            .iter()
            .filter_map(|t| self.token_id(t))
            .collect()
    }

    /// The tokenizer as `tokenizer.json` holds it (what the grammar engine reads each token's
    /// bytes from).
    pub fn spec_json(&self) -> Result<serde_json::Value, EngineError> {
        let text = self
            .inner
            .to_string(false)
            .map_err(|e| EngineError::Tokenizer(format!("tokenizer JSON: {e}")))?;
        serde_json::from_str(&text)
            .map_err(|e| EngineError::Tokenizer(format!("tokenizer JSON: {e}")))
    }

    /// Tokens in the vocabulary, added tokens included: every valid id is below this.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Id of a token given by its text, if it is in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}

/// Turns a growing list of token ids into text deltas. A token may end in the middle of a
/// multi-byte character (byte-level BPE); such a tail decodes to U+FFFD and is held back
/// until the following tokens complete it.
#[derive(Debug, Clone)]
pub struct StreamDecoder {
    tokenizer: Tokenizer,
    ids: Vec<u32>,
    /// Start of the window that is re-decoded for context.
    prefix_offset: usize,
    /// Ids before this offset have had their text emitted.
    read_offset: usize,
}

impl StreamDecoder {
    /// A decoder with no tokens yet.
    pub fn new(tokenizer: Tokenizer) -> Self {
        Self {
            tokenizer,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Adds one token and returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, EngineError> {
        self.ids.push(id);
        let prefix = self
            .tokenizer
            .decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = self.tokenizer.decode(&self.ids[self.prefix_offset..])?;
        if full.len() > prefix.len()
            && !full.ends_with('\u{FFFD}')
            && full.is_char_boundary(prefix.len())
        {
            let delta = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(delta)
        } else {
            Ok(String::new())
        }
    }

    /// Everything still held back (at the end of a stream: an incomplete character, shown as
    /// the replacement character rather than dropped silently).
    pub fn flush(&mut self) -> Result<String, EngineError> {
        let prefix = self
            .tokenizer
            .decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = self.tokenizer.decode(&self.ids[self.prefix_offset..])?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(full.get(prefix.len()..).unwrap_or_default().to_string())
    }

    /// All ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::merging_tokenizer as merging;

    #[test]
    fn a_long_text_within_its_bound_has_the_ids_of_one_encoding() {
        let t = merging();
        let text = "Hello world, <|im_start|>Hello\n\n  Hello!".repeat(20_000);
        assert!(text.len() > 10 * PIECE_BYTES);
        let whole = t.encode(&text).unwrap();
        assert_eq!(
            t.encode_within(&text, whole.len()).unwrap(),
            Ok(whole.clone())
        );
        assert_eq!(
            t.encode_within(&text, whole.len() - 1).unwrap(),
            Err(TooMany(whole.len()))
        );
        // Past a small bound it stops after a piece or two, not after the whole text.
        let Err(TooMany(counted)) = t.encode_within(&text, 1000).unwrap() else {
            panic!("fits")
        };
        assert!(counted > 1000 && counted < 2 * PIECE_BYTES, "{counted}");
    }

    #[test]
    fn a_piece_never_ends_inside_a_special_tokens_text() {
        let t = merging();
        let mut text = "a ".repeat((PIECE_BYTES - 6) / 2);
        let special = text.len();
        assert_eq!(special, PIECE_BYTES - 6);
        text.push_str("<|im_start|>");
        text.push_str(&"b ".repeat(100));
        assert_eq!(t.piece_end(&text, 0).unwrap(), special);
    }

    #[test]
    fn a_text_too_long_to_fit_is_refused_before_it_is_tokenized() {
        let t = merging();
        // The longest entry is `<|endoftext|>`: 13 bytes.
        assert_eq!(t.fewest_tokens(13_000), 1000);
        let text = "x".repeat(13_013);
        assert_eq!(t.encode_within(&text, 1000).unwrap(), Err(TooMany(1001)));
    }
}

/// Property tests: streamed decoding gives back the text, whatever the characters and however
/// they fall across tokens (the tiny tokenizer has one token per byte, so every multi-byte
/// character spans several).
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::testing::tiny_tokenizer;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::testing::property_cases(256)))]
        #[test]
        fn streamed_decoding_gives_back_the_text(text in "\\PC{0,40}") {
            let tok = tiny_tokenizer();
            let ids = tok.encode_plain(&text).unwrap_or_default();
            let mut d = StreamDecoder::new(tok);
            let mut out = String::new();
            for id in ids {
                let delta = d.push(id).unwrap_or_default();
                prop_assert!(!delta.contains('\u{FFFD}') || text.contains('\u{FFFD}'), "half a character was emitted");
                out.push_str(&delta);
            }
            out.push_str(&d.flush().unwrap_or_default());
            prop_assert_eq!(out, text);
        }

        #[test]
        fn retokenized_pieces_give_back_the_text(text in "[a-zA-Z0-9 _.,()\\n]{0,60}", cut in 0usize..60) {
            let tok = tiny_tokenizer();
            let cut = text.char_indices().map(|(i, _)| i).chain([text.len()]).find(|&i| i >= cut.min(text.len())).unwrap_or(0);
            let ids = tok.encode_tail(&text, cut).unwrap_or_default();
            prop_assert_eq!(tok.decode_with_specials(&ids).unwrap_or_default(), &text[cut..]);
        }
    }
}
