//! What the text-level targets share (`openai_text`, `chat_prefix`): the exact token prefix
//! turned into text and cut at its last clean boundary, and the target's text turned back
//! into the draft's token ids.
//!
//! Token healing: an answer that ends mid-word ("def is_pal") makes a model that reads it as
//! text continue oddly, because its tokenizer splits the unfinished word differently from how
//! it would have written it. So the last pre-tokenizer piece of the answer ("pal") is held
//! back: the target is sent the answer up to the piece before, and its text must start with
//! the held-back piece, which is then dropped (it was emitted already). When the target writes
//! something else there, the call is made again with the whole answer, unhealed. Coming back,
//! the text is tokenized with the draft's tokenizer a piece at a time, so the ids are those of
//! the text tokenized whole, and the seam with the emitted answer is canonical whenever the
//! tokenizer puts a boundary there.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};

use super::{Continuation, ContinuationRequest, StreamChunk, TokenStream};
use crate::error::{EngineError, TargetError};
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;

/// A continuation request as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextPrefix {
    /// The prompt as the draft rendered it (the chat template's text, special tokens included).
    pub prompt: String,
    /// The answer so far, up to its last clean boundary: what the target is sent.
    pub answer: String,
    /// The rest of the answer, already emitted: the target's text must start with it.
    pub held_back: String,
    /// Draft tokens in `held_back`: a call asks for that many more tokens.
    pub held_back_tokens: u32,
}

impl TextPrefix {
    /// The request's prefix as text, with the answer's last piece held back when `heal`. The
    /// prompt is the draft's rendering, or the chat messages rendered with `template` (the
    /// target's own chat template) when both are given.
    pub fn of(tokenizer: &Tokenizer, req: &ContinuationRequest, heal: bool, template: Option<&ChatTemplate>) -> Result<Self, TargetError> {
        let split = req.prompt_len.min(req.prefix.len());
        let prompt = match (template, &req.messages) {
            (Some(t), Some(m)) => t.render(m).map_err(|e| TargetError::Protocol(format!("rendering the target's chat template: {e}")))?,
            _ => tokenizer.decode_with_specials(&req.prefix[..split]).map_err(tokenizer_failed)?,
        };
        let answer = tokenizer.decode(&req.prefix[split..]).map_err(tokenizer_failed)?;
        let cut = if heal { tokenizer.last_piece_start(&answer).map_err(tokenizer_failed)? } else { answer.len() };
        let held_back_tokens = tokenizer.encode(&answer[cut..]).map_err(tokenizer_failed)?.len() as u32;
        Ok(Self { prompt, held_back: answer[cut..].to_string(), answer: answer[..cut].to_string(), held_back_tokens })
    }

    /// What the target's text must start with: the held-back piece, and before it the whole
    /// answer sent when the server `echoes` a continued message (llama-server's assistant
    /// prefill answers with the message's content followed by the continuation).
    pub fn expected(&self, echoes: bool) -> String {
        if echoes { format!("{}{}", self.answer, self.held_back) } else { self.held_back.clone() }
    }

    /// The same request with nothing held back.
    pub fn unhealed(&self) -> Self {
        Self { prompt: self.prompt.clone(), answer: format!("{}{}", self.answer, self.held_back), held_back: String::new(), held_back_tokens: 0 }
    }
}

fn tokenizer_failed(e: EngineError) -> TargetError {
    TargetError::Protocol(format!("re-tokenizing the target's text: {e}"))
}

/// Turns a target's streamed text into the draft's token ids, a pre-tokenizer piece at a time
/// (the last piece may still grow, so it waits for more text or the end).
#[derive(Debug)]
pub struct Retokenizer {
    tokenizer: Tokenizer,
    /// Text from the start of the held-back piece (or of the continuation) that has not been
    /// turned into ids yet, except its first `done` bytes, which are emitted text.
    buf: String,
    done: usize,
    held_back: String,
    confirmed: bool,
}

impl Retokenizer {
    /// A re-tokenizer expecting the target's text to start with `held_back`.
    pub fn new(tokenizer: Tokenizer, held_back: String) -> Self {
        Self { tokenizer, buf: String::new(), done: 0, confirmed: held_back.is_empty(), held_back }
    }

    /// Takes more text; the ids it completes, or `None` when the text does not start with the
    /// held-back piece (the target diverged from the emitted answer).
    pub fn push(&mut self, text: &str) -> Result<Option<Vec<u32>>, TargetError> {
        self.buf.push_str(text);
        if !self.confirmed {
            if self.buf.len() < self.held_back.len() {
                return Ok(self.held_back.starts_with(self.buf.as_str()).then(Vec::new));
            }
            if !self.buf.starts_with(self.held_back.as_str()) {
                return Ok(None);
            }
            self.confirmed = true;
            self.done = self.held_back.len();
        }
        let cut = self.tokenizer.last_piece_start(&self.buf).map_err(tokenizer_failed)?;
        if cut <= self.done {
            return Ok(Some(Vec::new()));
        }
        let ids = self.tokenizer.encode_tail(&self.buf[..cut], self.done).map_err(tokenizer_failed)?;
        self.buf.drain(..cut);
        self.done = 0;
        Ok(Some(ids))
    }

    /// The text ended: the ids of whatever is left, or `None` when it ended before the
    /// held-back piece was written.
    pub fn finish(&mut self) -> Result<Option<Vec<u32>>, TargetError> {
        if !self.confirmed {
            return Ok(None);
        }
        if self.buf.len() <= self.done {
            return Ok(Some(Vec::new()));
        }
        let ids = self.tokenizer.encode_tail(&self.buf, self.done).map_err(tokenizer_failed)?;
        self.buf.clear();
        self.done = 0;
        Ok(Some(ids))
    }
}

/// One piece of a target's streamed text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TextChunk {
    /// New text.
    pub text: String,
    /// Set on the last piece: true when the target stopped by itself (end of sequence), false
    /// at its token limit.
    pub finished: Option<bool>,
    /// Cached prompt tokens, when the target reports them (its usage).
    pub cached_prompt_tokens: Option<u32>,
}

/// A target's text as it arrives.
pub type TextStream = Pin<Box<dyn Stream<Item = Result<TextChunk, TargetError>> + Send>>;

/// Opens a text stream for a prefix (one call to the target).
pub type OpenText = Arc<dyn Fn(TextPrefix) -> Pin<Box<dyn Future<Output = Result<TextStream, TargetError>> + Send>> + Send + Sync>;

/// How a text-level target is called.
#[derive(Clone)]
pub struct TextCall {
    /// Opens one call.
    pub open: OpenText,
    /// Hold back the answer's last piece (token healing).
    pub heal: bool,
    /// The server's text starts with the answer it was sent (see [`TextPrefix::expected`]).
    pub echoes: bool,
    /// The target's chat template, for the prompt text.
    pub template: Option<Arc<ChatTemplate>>,
}

/// A continuation from a text-level target: healed first, and asked again without healing
/// when the target diverged from the held-back piece.
pub async fn continuation(tokenizer: &Tokenizer, req: &ContinuationRequest, call: TextCall) -> Result<Continuation, TargetError> {
    let mut s = token_stream(tokenizer.clone(), req, call).await?;
    let mut c = Continuation::default();
    while let Some(chunk) = s.next().await {
        let chunk = chunk?;
        c.tokens.extend(chunk.tokens);
        c.stopped_on_eos |= chunk.stopped_on_eos;
        c.cached_prompt_tokens = chunk.cached_prompt_tokens.or(c.cached_prompt_tokens);
        c.extra_calls += chunk.extra_calls;
    }
    c.tokens.truncate(req.max_tokens as usize);
    Ok(c)
}

struct Streaming {
    tokenizer: Tokenizer,
    call: TextCall,
    prefix: TextPrefix,
    upstream: TextStream,
    retok: Retokenizer,
    finished: Option<bool>,
    cached: Option<u32>,
    extra_calls: u32,
    ended: bool,
}

enum Step {
    Emit(StreamChunk),
    Diverged,
    Pending,
}

impl Streaming {
    /// Reads one upstream piece.
    async fn step(&mut self) -> Result<Step, TargetError> {
        let Some(piece) = self.upstream.next().await else {
            self.ended = true;
            return Ok(match self.retok.finish()? {
                None => Step::Diverged,
                Some(tokens) => Step::Emit(StreamChunk {
                    tokens,
                    stopped_on_eos: self.finished == Some(true),
                    cached_prompt_tokens: self.cached,
                    extra_calls: std::mem::take(&mut self.extra_calls),
                }),
            });
        };
        let piece = piece?;
        self.finished = piece.finished.or(self.finished);
        self.cached = piece.cached_prompt_tokens.or(self.cached);
        Ok(match self.retok.push(&piece.text)? {
            None => Step::Diverged,
            Some(tokens) if tokens.is_empty() => Step::Pending,
            Some(tokens) => Step::Emit(StreamChunk { tokens, extra_calls: std::mem::take(&mut self.extra_calls), ..StreamChunk::default() }),
        })
    }

    /// Drops the healed call and asks again with the whole answer (once: a target whose
    /// answer does not start with what it was sent is broken, not diverging).
    async fn restart(&mut self) -> Result<(), TargetError> {
        if self.prefix.held_back.is_empty() {
            return Err(TargetError::Protocol("the target's text does not continue the answer it was sent".into()));
        }
        self.prefix = self.prefix.unhealed();
        self.retok = Retokenizer::new(self.tokenizer.clone(), self.prefix.expected(self.call.echoes));
        self.upstream = (self.call.open)(self.prefix.clone()).await?;
        self.finished = None;
        self.ended = false;
        self.extra_calls += 1;
        Ok(())
    }
}

/// A text-level target's answer as a stream of the draft's token ids. Dropping it drops the
/// upstream stream, which closes the connection and stops the target.
pub async fn token_stream(tokenizer: Tokenizer, req: &ContinuationRequest, call: TextCall) -> Result<TokenStream, TargetError> {
    let prefix = TextPrefix::of(&tokenizer, req, call.heal, call.template.as_deref())?;
    let upstream = (call.open)(prefix.clone()).await?;
    let retok = Retokenizer::new(tokenizer.clone(), prefix.expected(call.echoes));
    let state = Streaming { tokenizer, call, prefix, upstream, retok, finished: None, cached: None, extra_calls: 0, ended: false };
    Ok(Box::pin(futures::stream::unfold(Some(state), |state| async move {
        let mut st = state?;
        loop {
            if st.ended {
                return None;
            }
            match st.step().await {
                Ok(Step::Emit(chunk)) => return Some((Ok(chunk), Some(st))),
                Ok(Step::Pending) => {}
                Ok(Step::Diverged) => {
                    tracing::debug!(held_back = %st.prefix.held_back, "the target did not write the held-back text; asking again unhealed");
                    if let Err(e) = st.restart().await {
                        return Some((Err(e), None));
                    }
                }
                Err(e) => return Some((Err(e), None)),
            }
        }
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::tiny_tokenizer_spec;

    /// Bytes, plus merges that make "Hello" one token and "Hel" two ("He", "l"): the
    /// tokenization of "Hel" + "lo" differs from that of "Hel" followed by that of "lo".
    fn merging_tokenizer() -> Tokenizer {
        let mut spec = tiny_tokenizer_spec();
        let mut vocab = spec["model"]["vocab"].as_object_mut().map(std::mem::take).unwrap_or_default();
        for (i, t) in ["He", "ll", "Hell", "Hello"].iter().enumerate() {
            vocab.insert((*t).to_string(), serde_json::json!(300 + i));
        }
        spec["model"]["vocab"] = serde_json::Value::Object(vocab);
        spec["model"]["merges"] = serde_json::json!(["H e", "l l", "He ll", "Hell o"]);
        Tokenizer::from_json(&spec.to_string()).unwrap_or_else(|e| unreachable!("{e}"))
    }

    fn ids(t: &Tokenizer, s: &str) -> Vec<u32> {
        t.encode(s).unwrap_or_default()
    }

    fn request(t: &Tokenizer, prompt: &str, answer: &str) -> ContinuationRequest {
        let p = ids(t, prompt);
        let mut prefix = p.clone();
        prefix.extend(ids(t, answer));
        ContinuationRequest { prompt_len: p.len(), ..ContinuationRequest::greedy(prefix, 8) }
    }

    #[test]
    fn the_answer_is_cut_before_its_last_piece() {
        let t = merging_tokenizer();
        let p = TextPrefix::of(&t, &request(&t, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "print(x) Hel"), true, None).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(p.prompt, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        assert_eq!((p.answer.as_str(), p.held_back.as_str()), ("print(x)", " Hel"));
        assert_eq!(p.unhealed().answer, "print(x) Hel");
        let empty = TextPrefix::of(&t, &request(&t, "<|im_start|>", ""), true, None).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!((empty.answer.as_str(), empty.held_back.as_str()), ("", ""));
    }

    #[test]
    fn a_seam_inside_a_token_is_tokenized_alone() {
        let t = merging_tokenizer();
        // The answer ends in "Hel" (two tokens); the target, sent the text before it, writes
        // "Hello world". The seam falls inside the token "Hello", so the text after it is
        // tokenized on its own; the text is exact either way.
        let mut r = Retokenizer::new(t.clone(), "Hel".into());
        let mut out = Vec::new();
        for piece in ["He", "llo", " wor", "ld"] {
            out.extend(r.push(piece).unwrap_or_default().unwrap_or_else(|| unreachable!("diverged")));
        }
        out.extend(r.finish().unwrap_or_default().unwrap_or_else(|| unreachable!("diverged")));
        assert_eq!(t.decode(&out).unwrap_or_default(), "lo world");
        assert_eq!(out, ids(&t, "lo world"));
    }

    #[test]
    fn pieces_after_the_seam_are_tokenized_whole() {
        let t = merging_tokenizer();
        let mut r = Retokenizer::new(t.clone(), " Hel".into());
        let mut out = Vec::new();
        for piece in [" H", "el", "lo", " Hello", "!"] {
            out.extend(r.push(piece).unwrap_or_default().unwrap_or_else(|| unreachable!("diverged")));
        }
        out.extend(r.finish().unwrap_or_default().unwrap_or_else(|| unreachable!("diverged")));
        // " Hello Hello!" tokenized whole, minus the emitted " Hel": the seam is inside the
        // piece " Hello", so what follows it is tokenized alone ("lo"), then whole pieces.
        assert_eq!(t.decode(&out).unwrap_or_default(), "lo Hello!");
        let whole = ids(&t, " Hello!");
        assert!(out.ends_with(&whole), "{out:?} should end with {whole:?}");
    }

    #[test]
    fn pieces_are_emitted_only_once_complete() {
        let t = merging_tokenizer();
        let mut r = Retokenizer::new(t.clone(), String::new());
        // "Hell" could still become "Hello": nothing yet.
        assert_eq!(r.push("Hell").unwrap_or_default(), Some(vec![]));
        assert_eq!(r.push("o").unwrap_or_default(), Some(vec![]));
        // A new piece starts: "Hello" is complete, as one token.
        assert_eq!(r.push(" x").unwrap_or_default(), Some(ids(&t, "Hello")));
        assert_eq!(r.finish().unwrap_or_default(), Some(ids(&t, " x")));
    }

    #[test]
    fn a_target_that_writes_something_else_is_a_divergence() {
        let t = merging_tokenizer();
        let mut r = Retokenizer::new(t.clone(), " Hel".into());
        assert_eq!(r.push(" H").unwrap_or_default(), Some(vec![]));
        assert_eq!(r.push("i there").unwrap_or_default(), None);
        let mut early = Retokenizer::new(t, " Hel".into());
        assert_eq!(early.push(" H").unwrap_or_default(), Some(vec![]));
        assert_eq!(early.finish().unwrap_or_default(), None);
    }
}
