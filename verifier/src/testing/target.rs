//! A target that writes a fixed answer, records its calls, and fails as a test says.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;

use crate::error::TargetError;
use crate::targets::{
    Continuation, ContinuationRequest, StreamChunk, TargetClient, TargetFacts, TargetTimings,
    TokenStream, WindowRequest, WindowScore,
};
use crate::tokenizer::Tokenizer;

use super::tokens::*;

/// How a scripted target behaves.
#[derive(Debug, Clone, Default)]
pub enum TargetFault {
    /// Answers.
    #[default]
    None,
    /// Every call fails with this status.
    Status(u16),
    /// Calls after the first `n` fail with 500.
    FailAfter(usize),
    /// Every call takes this long.
    Delay(Duration),
}

/// A target that writes `answer` then `<|im_end|>`, by position after the prompt, and records
/// every call. Streamed calls deliver one token per chunk and count the tokens generated, so a
/// test can see that a cancelled stream stopped the generation.
#[derive(Debug)]
pub struct ScriptedTarget {
    answer: Vec<u32>,
    fault: TargetFault,
    tokenizer: Option<Tokenizer>,
    calls: Mutex<Vec<ContinuationRequest>>,
    token_delay: Duration,
    generated: std::sync::Arc<AtomicUsize>,
    windows: Option<Mutex<Vec<WindowRequest>>>,
    windows_cached: bool,
    /// Its window calls read stale rows from its cache and are made again without it, as
    /// vLLM's token-in endpoint's are when a window row sits at a cached position.
    windows_stale: bool,
    timings: bool,
    alternative: f32,
    /// Its second choice at each answer position, reported where top log-probabilities are
    /// asked for.
    second: Vec<u32>,
    /// Where it keeps to a set of tokens (`None`: it cannot): its own best at each answer
    /// position among those it does not report.
    picks: Option<Vec<u32>>,
    eager: bool,
    facts: TargetFacts,
    /// `None`: it says `facts`; otherwise it fails to say anything, counting the asks here.
    facts_fail: Option<std::sync::Arc<AtomicUsize>>,
    /// The answers it was told are over, in order.
    done: Mutex<Vec<u64>>,
    /// Where it warms prompts ([`TargetClient::warm`]): how long a warm takes.
    warm_delay: Option<Duration>,
    warms: Mutex<Vec<ContinuationRequest>>,
    /// Warms running now (one that was dropped unfinished is not).
    warms_running: std::sync::Arc<AtomicUsize>,
}

/// Counts a warm as running while it lives.
struct Running(std::sync::Arc<AtomicUsize>);

impl Running {
    fn new(n: &std::sync::Arc<AtomicUsize>) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Self(n.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ScriptedTarget {
    /// A target that writes `text` (bytes of the tiny tokenizer). Its tokenizer check
    /// answers with `tokenizer` when given, else says it cannot tokenize.
    pub fn says(text: &str, tokenizer: Option<Tokenizer>) -> Self {
        Self {
            answer: text.bytes().map(u32::from).collect(),
            fault: TargetFault::None,
            tokenizer,
            calls: Mutex::new(Vec::new()),
            token_delay: Duration::ZERO,
            generated: Default::default(),
            windows: None,
            windows_cached: true,
            windows_stale: false,
            timings: false,
            alternative: 0.0,
            second: Vec::new(),
            picks: None,
            eager: false,
            facts: TargetFacts::default(),
            facts_fail: None,
            done: Mutex::new(Vec::new()),
            warm_delay: None,
            warms: Mutex::new(Vec::new()),
            warms_running: Default::default(),
        }
    }

    /// The same target warming prompts, as llama-server does on a named slot: each warm takes
    /// `delay`, and reports its prompt computed at 1 ms a token.
    pub fn with_warms(mut self, delay: Duration) -> Self {
        self.warm_delay = Some(delay);
        self
    }

    /// Warms asked so far.
    pub fn warm_calls(&self) -> Vec<ContinuationRequest> {
        self.warms
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Warms running now.
    pub fn warms_running(&self) -> usize {
        self.warms_running.load(Ordering::SeqCst)
    }

    /// The same target unable to say what it is (a `/props` that answers 404 behind a proxy,
    /// say); `asked` counts how often it was asked.
    pub fn failing_to_describe_itself(mut self, asked: std::sync::Arc<AtomicUsize>) -> Self {
        self.facts_fail = Some(asked);
        self
    }

    /// The same target saying it holds `n` positions per request (as llama-server's `/props`
    /// and vLLM's `max_model_len` do).
    pub fn with_context_length(mut self, n: usize) -> Self {
        self.facts.context_length = Some(n);
        self
    }

    /// The same target saying it writes at most `n` answers at once (llama-server's slots).
    pub fn with_parallel(mut self, n: usize) -> Self {
        self.facts.parallel = Some(n);
        self
    }

    /// The same target saying whether it takes images (as llama-server's `/props` does).
    pub fn taking_images(mut self, images: bool) -> Self {
        self.facts.images = Some(images);
        self
    }

    /// The same target saying whether it takes audio (as llama-server's `/props` does).
    pub fn taking_audio(mut self, audio: bool) -> Self {
        self.facts.audio = Some(audio);
        self
    }

    /// The same target giving a window token other than its own this probability (its own
    /// token the rest), where windows ask for its top log-probabilities: what a relaxed rule
    /// judges.
    pub fn with_alternatives(mut self, p: f32) -> Self {
        self.alternative = p;
        self
    }

    /// The same target with `text`'s byte at each answer position as its second choice there,
    /// reported (with its own) where a continuation asks for top log-probabilities.
    pub fn with_second_choices(mut self, text: &str) -> Self {
        self.second = text.bytes().map(u32::from).collect();
        self
    }

    /// The same target keeping a call's token to the set it is given
    /// ([`ContinuationRequest::allowed`]), as llama-server does with a logit bias: the first of
    /// its own token (its end, past its answer), its second choice and `text`'s byte at that
    /// answer position that the set holds (else the set's first).
    pub fn with_picks(mut self, text: &str) -> Self {
        self.picks = Some(text.bytes().map(u32::from).collect());
        self
    }

    /// The same target reporting each call's compute as llama-server does: in a last event
    /// of its own after a stream's tokens (1 ms per prompt token processed, 10 ms per token
    /// generated; every prompt token counts as processed).
    pub fn with_timings(mut self) -> Self {
        self.timings = true;
        self
    }

    /// The same target, able to score windows of draft tokens (as vLLM with prompt
    /// log-probabilities is).
    pub fn with_windows(mut self) -> Self {
        self.windows = Some(Mutex::new(Vec::new()));
        self
    }

    /// The same target, its window calls not served from its prompt cache (as vLLM's are
    /// not: a request for prompt log-probabilities skips reading it).
    pub fn with_uncached_windows(mut self) -> Self {
        self.windows_cached = false;
        self
    }

    /// The same target, its window calls made twice: once from its cache, whose rows were
    /// stale (it served the whole prefix), and again without it (see `targets::token_in`).
    pub fn with_stale_windows(mut self) -> Self {
        self.windows_stale = true;
        self
    }

    /// Windows scored so far.
    pub fn window_calls(&self) -> Vec<WindowRequest> {
        self.windows
            .as_ref()
            .map(|w| {
                w.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone()
            })
            .unwrap_or_default()
    }

    /// The same target generating a streamed call's tokens all at once, before they are read
    /// (a fast server whose stream is read more slowly than it writes: a backlog on the wire).
    pub fn with_eager_streams(mut self) -> Self {
        self.eager = true;
        self
    }

    /// The same target generating one streamed token every `delay`.
    pub fn with_token_delay(mut self, delay: Duration) -> Self {
        self.token_delay = delay;
        self
    }

    /// Tokens generated for streamed calls so far (a dropped stream generates no more).
    pub fn streamed_tokens(&self) -> usize {
        self.generated.load(Ordering::SeqCst)
    }

    /// The same target with a fault.
    pub fn with_fault(mut self, fault: TargetFault) -> Self {
        self.fault = fault;
        self
    }

    /// Fails or delays the `n`-th call as the fault says.
    async fn act_out_fault(&self, n: usize) -> Result<(), TargetError> {
        match self.fault {
            TargetFault::Status(status) => Err(TargetError::Status {
                status,
                body: "scripted failure".into(),
            }),
            TargetFault::FailAfter(k) if n > k => Err(TargetError::Status {
                status: 500,
                body: "scripted failure".into(),
            }),
            TargetFault::Delay(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The answers it was told are over ([`TargetClient::answer_done`]), in order.
    pub fn answers_done(&self) -> Vec<u64> {
        self.done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Calls so far.
    pub fn calls(&self) -> Vec<ContinuationRequest> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

#[async_trait]
impl TargetClient for ScriptedTarget {
    async fn stream_tokens(&self, req: &ContinuationRequest) -> Result<TokenStream, TargetError> {
        let all = self.continue_tokens(req).await?;
        let (delay, generated) = (self.token_delay, self.generated.clone());
        let (last, eos) = (all.tokens.len(), all.stopped_on_eos);
        let usage = all.timings.map(|t| StreamChunk {
            timings: Some(t),
            ..StreamChunk::default()
        });
        let alternatives = all.top_logprobs;
        let chunk = move |i: usize, token: u32| StreamChunk {
            tokens: vec![token],
            stopped_on_eos: eos && i + 1 == last,
            top_logprobs: alternatives
                .get(i)
                .map(|a| vec![a.clone()])
                .unwrap_or_default(),
            ..StreamChunk::default()
        };
        if self.eager {
            generated.fetch_add(last, Ordering::SeqCst);
            let chunks = all
                .tokens
                .into_iter()
                .enumerate()
                .map(|(i, t)| Ok(chunk(i, t)));
            return Ok(Box::pin(futures::stream::iter(
                chunks.chain(usage.map(Ok)).collect::<Vec<_>>(),
            )));
        }
        // `then` runs each step only when the stream is polled: a dropped stream generates no more.
        let chunks =
            futures::stream::iter(all.tokens.into_iter().enumerate()).then(move |(i, token)| {
                let generated = generated.clone();
                let c = chunk(i, token);
                async move {
                    tokio::time::sleep(delay).await;
                    generated.fetch_add(1, Ordering::SeqCst);
                    Ok(c)
                }
            });
        // The usage event comes after the tokens, as llama-server's last event does.
        Ok(Box::pin(chunks.chain(futures::stream::iter(usage.map(Ok)))))
    }

    async fn continue_tokens(
        &self,
        req: &ContinuationRequest,
    ) -> Result<Continuation, TargetError> {
        let n = {
            let mut calls = self
                .calls
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            calls.push(req.clone());
            calls.len()
        };
        self.act_out_fault(n).await?;
        let start = req.prefix.len() - answer_position(&req.prefix);
        if let Some(picks) = self.picks.as_ref().filter(|_| !req.allowed.is_empty()) {
            // Past its answer's end its own pick is the end, where the set holds it.
            let own = self.answer.get(start).copied().or(Some(IM_END));
            let pick = own
                .into_iter()
                .chain(
                    [&self.second, picks]
                        .iter()
                        .filter_map(|r| r.get(start).copied()),
                )
                .find(|t| req.allowed.contains(t))
                .unwrap_or(req.allowed[0]);
            return Ok(Continuation {
                tokens: vec![pick],
                stopped_on_eos: pick == IM_END,
                ..Continuation::default()
            });
        }
        let mut tokens = Vec::new();
        let mut stopped_on_eos = false;
        for i in start..start + req.max_tokens as usize {
            match self.answer.get(i) {
                Some(&t) => tokens.push(t),
                None => {
                    tokens.push(IM_END);
                    stopped_on_eos = true;
                    break;
                }
            }
        }
        let timings = self.timings.then(|| TargetTimings {
            prompt_tokens: req.prefix.len() as u64,
            prompt_ms: req.prefix.len() as f64,
            predicted_tokens: tokens.len() as u64,
            predicted_ms: 10.0 * tokens.len() as f64,
        });
        let top_logprobs = if req.top_logprobs > 0 && !self.second.is_empty() {
            (start..)
                .zip(&tokens)
                .map(|(i, &t)| {
                    let mut top = vec![(t, -0.1)];
                    top.extend(self.second.get(i).map(|&s| (s, -2.5)));
                    top
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Continuation {
            tokens,
            stopped_on_eos,
            timings,
            top_logprobs,
            ..Continuation::default()
        })
    }

    fn windows_read_cache(&self) -> bool {
        self.windows_cached
    }

    fn picks_among_tokens(&self) -> bool {
        self.picks.is_some()
    }

    async fn score_window(&self, req: &WindowRequest) -> Result<Option<WindowScore>, TargetError> {
        let Some(log) = &self.windows else {
            return Ok(None);
        };
        let n = {
            let mut log = log
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            log.push(req.clone());
            if self.windows_stale {
                // The same call made again without the cache.
                log.push(req.clone());
            }
            log.len()
        };
        self.act_out_fault(n).await?;
        let start = req.prefix.len() - answer_position(&req.prefix);
        let top: Vec<u32> = (0..=req.window.len())
            .map(|i| self.answer.get(start + i).copied().unwrap_or(IM_END))
            .collect();
        let margins = req
            .window
            .iter()
            .zip(&top)
            .map(|(w, t)| Some(if w == t { 0.0 } else { 1.0 }))
            .collect();
        // Sampled decoding: a target that always writes its answer puts all its probability on
        // the answer's token.
        let logprobs = if req.sampling.is_some() {
            top[..req.window.len()]
                .iter()
                .map(|&t| vec![(t, 0.0)])
                .collect()
        } else if req.top_logprobs > 0 {
            let p = self.alternative;
            req.window
                .iter()
                .zip(&top)
                .map(|(&w, &t)| {
                    if w == t || p <= 0.0 {
                        vec![(t, 0.0)]
                    } else {
                        vec![(w, p.ln()), (t, (1.0 - p).ln())]
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        let prefix = u32::try_from(req.prefix.len()).unwrap_or(u32::MAX);
        Ok(Some(WindowScore {
            top,
            margins,
            logprobs,
            cached_prompt_tokens: self.windows_stale.then_some(0),
            stale_cached: self.windows_stale.then_some(prefix),
            refused: false,
        }))
    }

    async fn tokenize(&self, text: &str) -> Result<Option<Vec<u32>>, TargetError> {
        match &self.tokenizer {
            Some(t) => t
                .encode(text)
                .map(Some)
                .map_err(|e| TargetError::Protocol(e.to_string())),
            None => Ok(None),
        }
    }

    async fn facts(&self) -> Result<TargetFacts, TargetError> {
        match &self.facts_fail {
            None => Ok(self.facts),
            Some(asked) => {
                asked.fetch_add(1, Ordering::SeqCst);
                Err(TargetError::Status {
                    status: 404,
                    body: "scripted: no /props here".into(),
                })
            }
        }
    }

    fn answer_done(&self, answer: u64) {
        self.done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(answer);
    }

    fn warms(&self) -> bool {
        self.warm_delay.is_some()
    }

    async fn warm(&self, req: &ContinuationRequest) -> Result<Option<Continuation>, TargetError> {
        let Some(delay) = self.warm_delay else {
            return Ok(None);
        };
        self.warms
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(req.clone());
        let _running = Running::new(&self.warms_running);
        tokio::time::sleep(delay).await;
        Ok(Some(Continuation {
            timings: Some(TargetTimings {
                prompt_tokens: req.prefix.len() as u64,
                prompt_ms: req.prefix.len() as f64,
                ..TargetTimings::default()
            }),
            cached_prompt_tokens: Some(0),
            ..Continuation::default()
        }))
    }

    async fn health(&self) -> Result<(), TargetError> {
        match self.fault {
            TargetFault::Status(status) => Err(TargetError::Status {
                status,
                body: "scripted failure".into(),
            }),
            _ => Ok(()),
        }
    }
}
