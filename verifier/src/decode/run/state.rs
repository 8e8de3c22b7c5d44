//! One generation's state, and what every stage asks of it: what was emitted, the calls left,
//! the draft's turn.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::decode::engine::Engine;
use crate::decode::repeats::LoopWatch;
use crate::decode::request::{GenerateRequest, Source, TokenEvent};
use crate::decode::stats::Stats;
use crate::decode::warm::WarmCall;
use crate::draft::PositionOutput;
use crate::grammar::fence::FenceReader;
use crate::grammar::tools::CallRepeats;
use crate::grammar::{Constraint, JsonPlace};
use crate::stop::StopMatcher;
use crate::targets::{TargetClient, next_answer};
use crate::tokenizer::StreamDecoder;
use crate::verify::{Context, Record};

/// Tokens a call asked for `asked` may still generate once `arrived` have come.
pub(super) fn unwritten(asked: u32, arrived: usize) -> u64 {
    u64::from(asked).saturating_sub(arrived as u64)
}

/// Awaits a target call, adding the time to `waited`, unless the client goes away first
/// (`None`): the call in flight is then dropped instead of waited for, which also closes its
/// connection and stops the target.
pub(super) async fn unless_client_gone<T>(
    tx: &mpsc::Sender<TokenEvent>,
    waited: &mut Duration,
    call: impl Future<Output = T>,
) -> Option<T> {
    let t = Instant::now();
    let out = tokio::select! {
        v = call => Some(v),
        _ = tx.closed() => None,
    };
    *waited += t.elapsed();
    out
}

/// An answer's id in its target calls; when the answer is over, however it ends, the target
/// client hears of it (llama-server's slot it held is free again).
pub(super) struct Answer<'a> {
    pub(super) target: &'a dyn TargetClient,
    pub(super) id: u64,
}

impl Drop for Answer<'_> {
    fn drop(&mut self) {
        self.target.answer_done(self.id);
    }
}

/// State of one generation.
pub(super) struct Run<'a> {
    pub(super) engine: &'a Engine,
    pub(super) answer: Answer<'a>,
    pub(super) req: GenerateRequest,
    pub(super) tx: mpsc::Sender<TokenEvent>,
    pub(super) emitted: Vec<u32>,
    pub(super) decoder: StreamDecoder,
    pub(super) stop: StopMatcher,
    pub(super) stats: Stats,
    pub(super) started: Instant,
    pub(super) last_prefix_len: u64,
    pub(super) last_target_tokens: Vec<u32>,
    /// Set when the target answered a window call with "cannot".
    pub(super) windows_unsupported: bool,
    pub(super) last_source: Source,
    pub(super) hit_stop_sequence: bool,
    /// The draft's tokens since the target's last say, watched for a runaway loop.
    pub(super) loops: LoopWatch,
    /// A JSON answer's reader of its fence, which the client is not sent and stop strings
    /// are not matched against.
    pub(super) fence: Option<FenceReader>,
    /// A JSON answer's text as sent, to tell whether a stop string left it whole.
    pub(super) json_sent: Option<String>,
    /// The call in flight has reported its cached prompt tokens.
    pub(super) call_reported: bool,
    /// The answer's context, kept when the verifier reads it.
    pub(super) context: Option<Context>,
    /// The grammar the answer follows (structured output), if any.
    pub(super) grammar: Option<Constraint>,
    /// Set when the grammar refused the target's next token: the draft writes that position
    /// under the grammar, unjudged, so every round makes progress.
    pub(super) draft_owns_next: bool,
    /// Where the answer may call tools several times: its calls, each a stop string for the
    /// rest of the answer, so that a repeated call ends it.
    pub(super) repeats: Option<CallRepeats>,
    /// Where in the JSON answer the next token goes, kept where the model judges by place.
    pub(super) place: Option<JsonPlace>,
    /// The prompt on its way to the target's cache, until the first call (see `warm`).
    pub(super) warm: Option<WarmCall>,
}

impl<'a> Run<'a> {
    pub(super) fn new(
        engine: &'a Engine,
        mut req: GenerateRequest,
        tx: mpsc::Sender<TokenEvent>,
        keep_context: bool,
    ) -> Self {
        let grammar = req.constraint.take();
        let place =
            (grammar.is_some() && req.settings.json_thresholds.is_some()).then(JsonPlace::new);
        let json_with_stops =
            grammar.as_ref().is_some_and(Constraint::json) && !req.stop.is_empty();
        let stats = Stats {
            prompt_tokens: req.prompt.len() as u32,
            ..Stats::default()
        };
        Self {
            engine,
            answer: Answer {
                target: &*engine.target,
                id: next_answer(),
            },
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
            loops: LoopWatch::default(),
            fence: grammar
                .as_ref()
                .is_some_and(Constraint::fenced)
                .then(FenceReader::default),
            json_sent: json_with_stops.then(String::new),
            call_reported: false,
            context: keep_context.then(Context::new),
            // Windows are scored on the draft's free run ahead, which no grammar checks.
            windows_unsupported: grammar.is_some(),
            repeats: grammar
                .as_ref()
                .is_some_and(Constraint::several_calls)
                .then(CallRepeats::default),
            place,
            grammar,
            draft_owns_next: false,
            warm: None,
        }
    }

    /// True when the next target call is the last the request may make (it then writes the
    /// rest of the answer).
    pub(super) fn next_call_is_the_last(&self) -> bool {
        self.req
            .settings
            .max_target_calls
            .is_some_and(|cap| self.calls_capped() + 1 >= cap)
    }

    /// True when the request has made every target call it may: only after a grammar refused
    /// part of the last one (without a grammar that call writes the rest of the answer).
    pub(super) fn calls_exhausted(&self) -> bool {
        self.req
            .settings
            .max_target_calls
            .is_some_and(|cap| self.calls_capped() >= cap)
    }

    /// The calls the cap counts: all but the warm.
    pub(super) fn calls_capped(&self) -> u32 {
        self.stats.target_calls - self.stats.target_warms - self.stats.span_continuations
    }

    /// True once, after the grammar refused a target token (see `draft_owns_next`).
    pub(super) fn take_draft_turn(&mut self) -> bool {
        std::mem::take(&mut self.draft_owns_next)
    }

    /// What the draft thought where `token` is emitted after output `out` (`entropy` when
    /// known already), for the context; `None` when no context is kept.
    pub(super) fn record(
        &self,
        out: &PositionOutput,
        token: u32,
        entropy: Option<f32>,
    ) -> Option<Record> {
        self.context
            .as_ref()
            .map(|_| Record::new(out, token, entropy))
    }

    /// Every token emitted so far.
    pub(super) fn emitted(&self) -> &[u32] {
        &self.emitted
    }

    pub(super) fn remaining(&self) -> u32 {
        self.req
            .max_tokens
            .saturating_sub(self.emitted.len() as u32)
    }
}
