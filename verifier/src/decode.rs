//! Sequential approximate verification: draft a token, score it, emit it when the verifier
//! accepts; on rejection ask the target to continue the exact token prefix, emit its
//! tokens and feed them to the draft's KV cache. Bails out to the target for the rest of
//! the answer when rejections exceed the policy's budget.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc;

use crate::draft::{Draft, PositionOutput};
use crate::error::{EngineError, TargetError};
use crate::sampling::{Sampler, SamplingParams};
use crate::stop::{StopMatcher, StopResult};
use crate::target::{ContinuationRequest, TargetClient};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::verify::{Features, Verifier, accepts};

/// Who produced a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The local draft, accepted by the verifier.
    Draft,
    /// The remote target.
    Target,
}

/// One streamed token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    /// Token id; `None` for the final event that releases held-back text.
    pub id: Option<u32>,
    /// Text this token completes (empty while a character or a possible stop string is incomplete).
    pub text: String,
    /// Producer.
    pub source: Source,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// End-of-sequence token or a stop sequence.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The receiver went away.
    Cancelled,
}

/// When to give up on drafting and let the target finish.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BailoutBudget {
    /// Decisions looked at.
    pub window: usize,
    /// Bail out when more than this fraction of them were rejections.
    pub max_rejection_rate: f32,
}

/// One generation's parameters.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt token ids (chat template already applied).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// Shared by draft and target.
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Verifier threshold (see [`accepts`]).
    pub threshold: f32,
    /// Tokens taken from each target call after a rejection.
    pub correction_tokens: u32,
    /// Bail-out budget; `None` never bails out.
    pub bailout: Option<BailoutBudget>,
    /// Model id the client asked for, passed on to the target.
    pub model: Option<String>,
}

/// What one generation cost.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens (end-of-sequence not counted).
    pub completion_tokens: u32,
    /// Draft tokens accepted and emitted.
    pub draft_tokens: u32,
    /// Target tokens emitted.
    pub target_tokens: u32,
    /// Calls made to the target.
    pub target_calls: u32,
    /// Draft tokens the verifier rejected.
    pub verifier_rejections: u32,
    /// True when the rejection budget ran out and the target finished the answer.
    pub bailed_out: bool,
    /// Input tokens sent to the target over all calls (each call re-sends the prefix).
    pub target_input_tokens: u64,
    /// Of those, tokens a prompt cache could reuse (prefix shared with the previous call).
    pub target_cacheable_input_tokens: u64,
    /// Time spent in draft inference.
    #[serde(serialize_with = "secs")]
    pub draft_time: Duration,
    /// Time spent waiting for the target.
    #[serde(serialize_with = "secs")]
    pub target_wait: Duration,
    /// Time to the first emitted token.
    #[serde(serialize_with = "secs")]
    pub time_to_first_token: Duration,
    /// Lengths of runs of consecutive accepted draft tokens.
    #[serde(skip)]
    pub accepted_runs: Vec<u32>,
    /// Why it ended.
    pub finish_reason: Option<FinishReason>,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// Draft model, tokenizer and target: everything a generation needs but the verifier.
#[derive(Debug, Clone)]
pub struct Engine {
    tokenizer: Tokenizer,
    target: Arc<dyn TargetClient>,
    eos: Vec<u32>,
}

/// Fixed text that exercises specials, code, whitespace runs and multi-byte characters.
const PROBE: &str = "<|im_start|>user\nfn main() {\n    println!(\"héllo, 世界 🚀\");\n}\t  x = 3.14e-2<|im_end|>\n";

impl Engine {
    /// An engine; `eos` lists the ids that end a generation.
    pub fn new(tokenizer: Tokenizer, target: Arc<dyn TargetClient>, eos: Vec<u32>) -> Self {
        Self { tokenizer, target, eos }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The target.
    pub fn target(&self) -> &Arc<dyn TargetClient> {
        &self.target
    }

    /// Refuses approximate mode when draft and target tokenize a probe text differently.
    /// Returns `Ok(false)` when the target has no tokenize endpoint to compare with.
    pub async fn check_tokenizer(&self) -> Result<bool, EngineError> {
        let ours = self.tokenizer.encode(PROBE)?;
        match self.target.tokenize(PROBE).await? {
            None => Ok(false),
            Some(theirs) if theirs == ours => Ok(true),
            Some(theirs) => Err(EngineError::TokenizerMismatch(format!(
                "probe text gives {} draft tokens and {} target tokens (first difference at {})",
                ours.len(),
                theirs.len(),
                ours.iter().zip(&theirs).take_while(|(a, b)| a == b).count()
            ))),
        }
    }

    /// Runs one generation, sending tokens to `tx` as they are decided. Dropping the receiver
    /// stops all work, including a target call in flight.
    pub async fn generate(
        &self,
        lease: &dyn Draft,
        verifier: &dyn Verifier,
        req: GenerateRequest,
        tx: mpsc::Sender<TokenEvent>,
    ) -> Result<Stats, EngineError> {
        let mut run = Run::new(self, req, tx);
        let t = Instant::now();
        let mut out = lease.prefill(run.req.prompt.clone()).await?;
        run.stats.draft_time += t.elapsed();
        let mut sampler = Sampler::new(run.req.sampling);
        let mut window = run.req.bailout.map(RejectionWindow::new);
        let mut accepted_run = 0u32;
        let result = loop {
            if run.remaining() == 0 {
                break FinishReason::Length;
            }
            let proposal = sampler.pick(&out.logits);
            let accepted = decide(verifier, &out, run.req.threshold);
            let over_budget = window.as_mut().is_some_and(|w| w.push(!accepted));
            let (produced, verdict) = if accepted {
                accepted_run += 1;
                (vec![proposal], run.emit(&[proposal], Source::Draft).await?)
            } else {
                run.stats.verifier_rejections += 1;
                if accepted_run > 0 {
                    run.stats.accepted_runs.push(std::mem::take(&mut accepted_run));
                }
                if over_budget {
                    // Too many rejections: one call lets the target write the rest.
                    run.stats.bailed_out = true;
                    let n = run.remaining();
                    let reason = run.call_target(n).await?;
                    break reason.unwrap_or(if run.remaining() == 0 { FinishReason::Length } else { FinishReason::Stop });
                }
                let n = run.req.correction_tokens.max(1).min(run.remaining());
                let verdict = run.call_target(n).await?;
                (run.last_target_tokens.clone(), verdict)
            };
            if let Some(reason) = verdict {
                break reason;
            }
            let t = Instant::now();
            out = lease
                .extend(produced, false)
                .await?
                .pop()
                .ok_or_else(|| EngineError::Draft("no output after extend".into()))?;
            run.stats.draft_time += t.elapsed();
        };
        if accepted_run > 0 {
            run.stats.accepted_runs.push(accepted_run);
        }
        run.finish(result).await
    }
}

/// The last `window` accept/reject decisions.
struct RejectionWindow {
    budget: BailoutBudget,
    rejected: VecDeque<bool>,
}

impl RejectionWindow {
    fn new(budget: BailoutBudget) -> Self {
        Self { budget, rejected: VecDeque::with_capacity(budget.window + 1) }
    }

    /// Records a decision; true when a full window holds more rejections than the budget allows.
    fn push(&mut self, rejected: bool) -> bool {
        self.rejected.push_back(rejected);
        if self.rejected.len() > self.budget.window {
            self.rejected.pop_front();
        }
        let n = self.rejected.iter().filter(|r| **r).count();
        self.rejected.len() >= self.budget.window.max(1) && n as f32 > self.budget.max_rejection_rate * self.budget.window as f32
    }
}

fn decide(verifier: &dyn Verifier, out: &PositionOutput, threshold: f32) -> bool {
    // The dial's ends do not need the verifier (nor the feature computation).
    if threshold <= 0.0 || threshold >= 1.0 {
        return accepts(0.0, threshold);
    }
    accepts(verifier.p_accept(&Features::from_output(out)), threshold)
}

/// State of one generation.
struct Run<'a> {
    engine: &'a Engine,
    req: GenerateRequest,
    tx: mpsc::Sender<TokenEvent>,
    emitted: Vec<u32>,
    decoder: StreamDecoder,
    stop: StopMatcher,
    stats: Stats,
    started: Instant,
    last_prefix_len: u64,
    last_target_tokens: Vec<u32>,
    last_source: Source,
    hit_stop_sequence: bool,
}

impl<'a> Run<'a> {
    fn new(engine: &'a Engine, req: GenerateRequest, tx: mpsc::Sender<TokenEvent>) -> Self {
        let stats = Stats { prompt_tokens: req.prompt.len() as u32, ..Stats::default() };
        Self {
            engine,
            decoder: StreamDecoder::new(engine.tokenizer.clone()),
            stop: StopMatcher::new(req.stop.clone()),
            req,
            tx,
            emitted: Vec::new(),
            stats,
            started: Instant::now(),
            last_prefix_len: 0,
            last_target_tokens: Vec::new(),
            last_source: Source::Draft,
            hit_stop_sequence: false,
        }
    }

    fn remaining(&self) -> u32 {
        self.req.max_tokens.saturating_sub(self.emitted.len() as u32)
    }

    /// Emits tokens; `Ok(Some(reason))` when one of them ends the generation.
    async fn emit(&mut self, ids: &[u32], source: Source) -> Result<Option<FinishReason>, EngineError> {
        for &id in ids {
            if self.engine.eos.contains(&id) {
                return Ok(Some(FinishReason::Stop));
            }
            if self.emitted.is_empty() {
                self.stats.time_to_first_token = self.started.elapsed();
            }
            self.emitted.push(id);
            self.last_source = source;
            self.stats.completion_tokens += 1;
            // Counted here, with completion_tokens, so an end-of-sequence token (never
            // emitted) is counted by neither and the three always add up.
            match source {
                Source::Draft => self.stats.draft_tokens += 1,
                Source::Target => self.stats.target_tokens += 1,
            }
            let delta = self.decoder.push(id)?;
            let (text, stop) = match self.stop.push(&delta) {
                StopResult::Continue(t) => (t, false),
                StopResult::Stop(t) => (t, true),
            };
            if self.tx.send(TokenEvent { id: Some(id), text, source }).await.is_err() {
                return Ok(Some(FinishReason::Cancelled));
            }
            if stop {
                self.hit_stop_sequence = true;
                return Ok(Some(FinishReason::Stop));
            }
            if self.remaining() == 0 {
                return Ok(Some(FinishReason::Length));
            }
        }
        Ok(None)
    }

    /// Asks the target for `n` tokens after the current prefix and emits them.
    /// `Ok(Some(reason))` when the generation ends there.
    async fn call_target(&mut self, n: u32) -> Result<Option<FinishReason>, EngineError> {
        let mut prefix = self.req.prompt.clone();
        prefix.extend_from_slice(&self.emitted);
        let len = prefix.len() as u64;
        self.stats.target_calls += 1;
        self.stats.target_input_tokens += len;
        self.stats.target_cacheable_input_tokens += self.last_prefix_len.min(len);
        self.last_prefix_len = len;
        let creq = ContinuationRequest { prefix, max_tokens: n, sampling: self.req.sampling, model: self.req.model.clone() };
        let t = Instant::now();
        let cont = tokio::select! {
            c = self.engine.target.continue_tokens(&creq) => c?,
            // The client went away: abandon the call instead of waiting for it.
            _ = self.tx.closed() => return Ok(Some(FinishReason::Cancelled)),
        };
        self.stats.target_wait += t.elapsed();
        self.last_prefix_len += cont.tokens.len() as u64;
        if cont.tokens.is_empty() && !cont.stopped_on_eos {
            return Err(TargetError::Protocol("target returned no tokens".into()).into());
        }
        self.last_target_tokens = cont.tokens.clone();
        if let Some(r) = self.emit(&cont.tokens, Source::Target).await? {
            return Ok(Some(r));
        }
        if cont.stopped_on_eos {
            return Ok(Some(FinishReason::Stop));
        }
        Ok(None)
    }

    async fn finish(mut self, reason: FinishReason) -> Result<Stats, EngineError> {
        if reason != FinishReason::Cancelled && !self.hit_stop_sequence {
            // Whatever was held back (an incomplete character, a possible stop string) is text.
            let tail = self.decoder.flush()?;
            let text = match self.stop.push(&tail) {
                StopResult::Continue(t) => t + &self.stop.finish(),
                StopResult::Stop(t) => t,
            };
            if !text.is_empty() {
                let _ = self.tx.send(TokenEvent { id: None, text, source: self.last_source }).await;
            }
        }
        self.stats.finish_reason = Some(reason);
        Ok(self.stats)
    }
}

#[cfg(test)]
mod scripted_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejection_window_needs_a_full_window_over_budget() {
        let mut w = RejectionWindow::new(BailoutBudget { window: 4, max_rejection_rate: 0.5 });
        // Three rejections, but the window is not full yet.
        assert!(!w.push(true) && !w.push(true) && !w.push(true));
        // Full: 3 of 4 rejected > 0.5 * 4.
        assert!(w.push(false));
        let mut w = RejectionWindow::new(BailoutBudget { window: 4, max_rejection_rate: 0.5 });
        // Exactly at the budget (2 of 4) is allowed; old decisions slide out.
        assert!(!w.push(true) && !w.push(false) && !w.push(true) && !w.push(false));
        assert!(!w.push(false) && !w.push(true) && !w.push(true), "false, false, true, true is at the budget");
        assert!(w.push(true), "false, true, true, true is over it");
    }
}
