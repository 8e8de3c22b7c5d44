//! What the text-level targets share (`openai_text`, `chat_prefix`): one client,
//! [`TextTarget`], over a [`TextWire`] that says what differs between them (the path, the
//! prompt or the messages, how an event carries its text); the exact token prefix turned into
//! text and cut at its last clean boundary; and the target's text turned back into the
//! draft's token ids.
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

use async_trait::async_trait;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use super::{
    Continuation, ContinuationRequest, StreamChunk, TargetClient, TargetConfig, TokenStream,
    get_ok, http_client, join, post_sse,
};
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
    /// The request's prefix as text, with the answer's last piece held back. The prompt is the
    /// draft's rendering, or the chat messages rendered with `template` (the target's own chat
    /// template) when both are given.
    pub fn of(
        tokenizer: &Tokenizer,
        req: &ContinuationRequest,
        template: Option<&ChatTemplate>,
    ) -> Result<Self, TargetError> {
        let split = req.prompt_len.min(req.prefix.len());
        let prompt = match (template, &req.messages) {
            (Some(t), Some(m)) => t.render(m).map_err(|e| {
                TargetError::Protocol(format!("rendering the target's chat template: {e}"))
            })?,
            _ => tokenizer
                .decode_with_specials(&req.prefix[..split])
                .map_err(tokenizer_failed)?,
        };
        let answer = tokenizer
            .decode(&req.prefix[split..])
            .map_err(tokenizer_failed)?;
        let cut = tokenizer
            .last_piece_start(&answer)
            .map_err(tokenizer_failed)?;
        let held_back_tokens = tokenizer
            .encode(&answer[cut..])
            .map_err(tokenizer_failed)?
            .len() as u32;
        Ok(Self {
            prompt,
            held_back: answer[cut..].to_string(),
            answer: answer[..cut].to_string(),
            held_back_tokens,
        })
    }

    /// What the target's text must start with: the held-back piece, and before it the whole
    /// answer sent when the server `echoes` a continued message (llama-server's assistant
    /// prefill answers with the message's content followed by the continuation).
    pub fn expected(&self, echoes: bool) -> String {
        if echoes {
            format!("{}{}", self.answer, self.held_back)
        } else {
            self.held_back.clone()
        }
    }

    /// The same request with nothing held back.
    pub fn unhealed(&self) -> Self {
        Self {
            prompt: self.prompt.clone(),
            answer: format!("{}{}", self.answer, self.held_back),
            held_back: String::new(),
            held_back_tokens: 0,
        }
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
        Self {
            tokenizer,
            buf: String::new(),
            done: 0,
            confirmed: held_back.is_empty(),
            held_back,
        }
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
        let cut = self
            .tokenizer
            .last_piece_start(&self.buf)
            .map_err(tokenizer_failed)?;
        if cut <= self.done {
            return Ok(Some(Vec::new()));
        }
        let ids = self
            .tokenizer
            .encode_tail(&self.buf[..cut], self.done)
            .map_err(tokenizer_failed)?;
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
        let ids = self
            .tokenizer
            .encode_tail(&self.buf, self.done)
            .map_err(tokenizer_failed)?;
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
pub type OpenText = Arc<
    dyn Fn(TextPrefix) -> Pin<Box<dyn Future<Output = Result<TextStream, TargetError>> + Send>>
        + Send
        + Sync,
>;

/// What differs between the text-level kinds.
pub trait TextWire: std::fmt::Debug + Clone + Send + Sync + 'static {
    /// Path under the base URL.
    const PATH: &'static str;
    /// The kind's own body fields: the prompt text, or the messages and how the last one is
    /// marked.
    fn fields(
        &self,
        req: &ContinuationRequest,
        p: &TextPrefix,
        body: &mut Value,
    ) -> Result<(), TargetError>;
    /// One streamed event as text.
    fn piece(v: &Value) -> TextChunk;
    /// The server's text starts with the answer it was sent (see [`TextPrefix::expected`]).
    fn echoes(&self) -> bool {
        false
    }
    /// The target's own chat template, for the prompt text.
    fn template(&self) -> Option<Arc<ChatTemplate>> {
        None
    }
}

/// A text-level target. Every call is streamed (a non-streamed continuation collects it), so
/// the healing check stops a diverging answer at its first characters; the text is
/// re-tokenized with the draft's tokenizer, so the target's own tokenizer does not matter.
#[derive(Debug, Clone)]
pub struct TextTarget<W> {
    cfg: TargetConfig,
    http: reqwest::Client,
    tokenizer: Tokenizer,
    pub(super) wire: W,
}

impl<W: TextWire> TextTarget<W> {
    /// A client for `cfg.base_url` speaking `wire`, re-tokenizing with `tokenizer`.
    pub(super) fn with_wire(
        cfg: TargetConfig,
        tokenizer: Tokenizer,
        wire: W,
    ) -> Result<Self, TargetError> {
        Ok(Self {
            http: http_client(&cfg)?,
            cfg,
            tokenizer,
            wire,
        })
    }

    /// The body of one call: the sampling shared by the kinds, the kind's own fields, the
    /// cache hints.
    fn body(
        &self,
        req: &ContinuationRequest,
        p: &TextPrefix,
        key: &str,
    ) -> Result<Value, TargetError> {
        let s = req.sampling;
        let mut body = json!({
            "model": req.model.as_deref().unwrap_or(&self.cfg.model),
            // The held-back piece is written again; allow for it.
            "max_tokens": req.max_tokens + p.held_back_tokens,
            "temperature": s.temperature.max(0.0),
            "top_p": s.top_p,
            "stream": true,
            // The usage (with the cached prompt tokens) comes in a last chunk.
            "stream_options": {"include_usage": true},
        });
        if let Some(seed) = s.seed {
            body["seed"] = json!(seed as i64);
        }
        self.wire.fields(req, p, &mut body)?;
        self.cfg.cache_hints.apply_to_body(&mut body, key);
        Ok(body)
    }

    fn call(&self, req: &ContinuationRequest) -> TextCall {
        let this = self.clone();
        let req = req.clone();
        let open: OpenText = Arc::new(move |p: TextPrefix| {
            let this = this.clone();
            let key = req.cache_key();
            let body = this.body(&req, &p, &key);
            Box::pin(async move {
                let body = body?;
                let header = this.cfg.cache_hints.header(&key);
                let url = join(&this.cfg.base_url, W::PATH);
                let events = post_sse(&this.http, &this.cfg, &url, &body, header.as_ref()).await?;
                Ok(Box::pin(events.map(|ev| ev.map(|v| W::piece(&v)))) as TextStream)
            })
        });
        TextCall {
            open,
            echoes: self.wire.echoes(),
            template: self.wire.template(),
        }
    }
}

#[async_trait]
impl<W: TextWire> TargetClient for TextTarget<W> {
    async fn continue_tokens(
        &self,
        req: &ContinuationRequest,
    ) -> Result<Continuation, TargetError> {
        continuation(&self.tokenizer, req, self.call(req)).await
    }

    async fn stream_tokens(&self, req: &ContinuationRequest) -> Result<TokenStream, TargetError> {
        token_stream(self.tokenizer.clone(), req, self.call(req)).await
    }

    async fn tokenize(&self, _: &str) -> Result<Option<Vec<u32>>, TargetError> {
        // Text goes both ways: the target's tokenizer does not need to match.
        Ok(None)
    }

    async fn health(&self) -> Result<(), TargetError> {
        get_ok(&self.http, &self.cfg, &join(&self.cfg.base_url, "models")).await
    }
}

/// How a text-level target is called.
#[derive(Clone)]
struct TextCall {
    /// Opens one call.
    open: OpenText,
    /// The server's text starts with the answer it was sent (see [`TextPrefix::expected`]).
    echoes: bool,
    /// The target's chat template, for the prompt text.
    template: Option<Arc<ChatTemplate>>,
}

/// A continuation from a text-level target: healed first, and asked again without healing
/// when the target diverged from the held-back piece.
async fn continuation(
    tokenizer: &Tokenizer,
    req: &ContinuationRequest,
    call: TextCall,
) -> Result<Continuation, TargetError> {
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
                    // Text-level providers report no compute.
                    timings: None,
                    top_logprobs: Vec::new(),
                }),
            });
        };
        let piece = piece?;
        self.finished = piece.finished.or(self.finished);
        self.cached = piece.cached_prompt_tokens.or(self.cached);
        Ok(match self.retok.push(&piece.text)? {
            None => Step::Diverged,
            Some(tokens) if tokens.is_empty() => Step::Pending,
            Some(tokens) => Step::Emit(StreamChunk {
                tokens,
                extra_calls: std::mem::take(&mut self.extra_calls),
                ..StreamChunk::default()
            }),
        })
    }

    /// Drops the healed call and asks again with the whole answer (once: a target whose
    /// answer does not start with what it was sent is broken, not diverging).
    async fn restart(&mut self) -> Result<(), TargetError> {
        if self.prefix.held_back.is_empty() {
            return Err(TargetError::Protocol(
                "the target's text does not continue the answer it was sent".into(),
            ));
        }
        self.prefix = self.prefix.unhealed();
        self.retok = Retokenizer::new(
            self.tokenizer.clone(),
            self.prefix.expected(self.call.echoes),
        );
        self.upstream = (self.call.open)(self.prefix.clone()).await?;
        self.finished = None;
        self.ended = false;
        self.extra_calls += 1;
        Ok(())
    }
}

/// A text-level target's answer as a stream of the draft's token ids. Dropping it drops the
/// upstream stream, which closes the connection and stops the target.
async fn token_stream(
    tokenizer: Tokenizer,
    req: &ContinuationRequest,
    call: TextCall,
) -> Result<TokenStream, TargetError> {
    let prefix = TextPrefix::of(&tokenizer, req, call.template.as_deref())?;
    let upstream = (call.open)(prefix.clone()).await?;
    let retok = Retokenizer::new(tokenizer.clone(), prefix.expected(call.echoes));
    let state = Streaming {
        tokenizer,
        call,
        prefix,
        upstream,
        retok,
        finished: None,
        cached: None,
        extra_calls: 0,
        ended: false,
    };
    Ok(Box::pin(futures::stream::unfold(
        Some(state),
        |state| async move {
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
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::merging_tokenizer;

    fn ids(t: &Tokenizer, s: &str) -> Vec<u32> {
        t.encode(s).unwrap_or_default()
    }

    fn request(t: &Tokenizer, prompt: &str, answer: &str) -> ContinuationRequest {
        let p = ids(t, prompt);
        let mut prefix = p.clone();
        prefix.extend(ids(t, answer));
        ContinuationRequest {
            prompt_len: p.len(),
            ..ContinuationRequest::greedy(prefix, 8)
        }
    }

    #[test]
    fn the_answer_is_cut_before_its_last_piece() {
        let t = merging_tokenizer();
        let p = TextPrefix::of(
            &t,
            &request(
                &t,
                "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
                "print(x) Hel",
            ),
            None,
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(
            p.prompt,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            (p.answer.as_str(), p.held_back.as_str()),
            ("print(x)", " Hel")
        );
        assert_eq!(p.unhealed().answer, "print(x) Hel");
        let empty = TextPrefix::of(&t, &request(&t, "<|im_start|>", ""), None)
            .unwrap_or_else(|e| unreachable!("{e}"));
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
            out.extend(
                r.push(piece)
                    .unwrap_or_default()
                    .unwrap_or_else(|| unreachable!("diverged")),
            );
        }
        out.extend(
            r.finish()
                .unwrap_or_default()
                .unwrap_or_else(|| unreachable!("diverged")),
        );
        assert_eq!(t.decode(&out).unwrap_or_default(), "lo world");
        assert_eq!(out, ids(&t, "lo world"));
    }

    #[test]
    fn pieces_after_the_seam_are_tokenized_whole() {
        let t = merging_tokenizer();
        let mut r = Retokenizer::new(t.clone(), " Hel".into());
        let mut out = Vec::new();
        for piece in [" H", "el", "lo", " Hello", "!"] {
            out.extend(
                r.push(piece)
                    .unwrap_or_default()
                    .unwrap_or_else(|| unreachable!("diverged")),
            );
        }
        out.extend(
            r.finish()
                .unwrap_or_default()
                .unwrap_or_else(|| unreachable!("diverged")),
        );
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
