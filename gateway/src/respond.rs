//! Runs a generation on the engine and turns its token events into an OpenAI response:
//! SSE chunks when streaming, one JSON body otherwise. Both carry `usage.approxy` with the
//! cost estimate; non-streaming responses repeat it in `x-approxy-*` headers.

use std::convert::Infallible;
use std::sync::Arc;

use approxy_verifier::infer::transport::TraceContext;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use approxy_verifier::infer::{self, Account, Event, FinishReason, Stats, Unit};
use approxy_verifier::policy::{Correction, Verification};
use approxy_verifier::request::Constraint;

use crate::decide::Approximate;
use crate::error::ApiError;
use crate::policy::PromptKind;
use crate::request::Endpoint;
use crate::request::validate::ValidRequest;
use crate::state::{ModelRuntime, Runtime};
use crate::tool_calls::{self, BareCalls, CallReader};

fn correction_name(c: Correction) -> &'static str {
    match c {
        Correction::Fixed { .. } => "fixed",
        Correction::Span { .. } => "span",
    }
}

/// How the answer was verified: the model's setting, except that an answer its settings would
/// score in windows ran spans where no window could be scored (under a grammar, or with a
/// target that scores none), and says so.
fn verification_name(v: Verification, s: &Stats) -> String {
    if s.spans_for_windows && matches!(v, Verification::ApproximateWindows | Verification::Judged) {
        return "approximate".into();
    }
    match v {
        Verification::Approximate => "approximate".into(),
        Verification::ApproximateWindows => "approximate_windows".into(),
        Verification::Exact => "exact".into(),
        Verification::Relaxed(rule) => format!("relaxed:{rule}"),
        Verification::Judged => "judged".into(),
    }
}

/// The dial a request ran at: its threshold, and the prompt kind that chose it.
#[derive(Debug, Clone, Copy)]
struct Dial {
    threshold: f32,
    kind: PromptKind,
}

/// What an answer names and reports besides its tokens: its ids, its model's policy entry and
/// the dial it ran at.
struct Answer {
    ids: Ids,
    model: Arc<ModelRuntime>,
    dial: Dial,
    /// Threads each draft worker runs (the draft's cores, for usage).
    draft_threads: usize,
    /// The answer may call tools: its text is read for calls.
    tools: bool,
    /// The tools it may call in a form of its own (`tool_choice: "auto"`).
    bare_calls: Option<Arc<BareCalls>>,
    /// The answer is JSON that may come inside a Markdown fence: the engine sends no text for
    /// the fence, and those empty pieces are not sent on.
    fenced: bool,
    /// Answers asked for (`n`).
    n: usize,
}

impl Answer {
    /// The answer to `valid`, JSON inside a fence where `fenced`, by `draft_threads` threads a
    /// worker, `n` times.
    fn new(
        valid: &ValidRequest,
        fenced: bool,
        model: Arc<ModelRuntime>,
        dial: Dial,
        (draft_threads, n): (usize, usize),
    ) -> Self {
        Self {
            ids: Ids::new(valid.model.clone(), valid.endpoint),
            model,
            dial,
            draft_threads,
            tools: !valid.tools.is_empty(),
            bare_calls: (!valid.auto_tools.is_empty()).then(|| BareCalls::new(&valid.auto_tools)),
            fenced,
            n,
        }
    }
}

fn usage(p: &Account, a: &Answer) -> Value {
    let (s, m, dial) = (&p.stats, &a.model, a.dial);
    // What the engine ran with: the model's decode settings, not a second reading of its policy.
    let d = &m.decode;
    let mut u = json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "approxy": {
            "mode": "approximate",
            "verifier": m.verifier.kind(),
            "threshold": dial.threshold,
            "prompt_kind": dial.kind.name(),
            "draft_tokens": s.draft_tokens,
            "target_tokens": s.target_tokens,
            "target_calls": s.target_calls,
            "verifier_rejections": s.verifier_rejections,
            "bailed_out": s.bailed_out,
            "cost_guard": s.cost_guard,
            "guard": m.policy.guard.name(),
            // Why the guard handed the rest to the target: strict, hard_cap, over_budget or
            // not_worth_it.
            "cost_guard_reason": s.cost_guard_reason,
            "call_cap": s.call_cap,
            "verification": verification_name(d.verification, s),
            "correction": correction_name(d.correction),
            "windows": s.windows,
            "window_tokens": s.window_tokens,
            "window_accepted": s.window_accepted,
            "window_relaxed_accepts": s.window_relaxed_accepts,
            "near_ties": s.near_ties,
            "span_resyncs": s.resyncs,
            "spans_kept": s.spans_kept,
            "overlap": d.overlap,
            "overlap_guesses": s.overlap_guesses,
            "overlap_guesses_used": s.overlap_guesses_used,
            "lookup_tokens": s.lookup_tokens,
            "lookup_tokens_used": s.lookup_tokens_used,
            "target_discarded_tokens": s.target_discarded_tokens,
            // Billed for streams closed before their end: generated after the close, unseen.
            "target_inflight_tokens": s.target_inflight_tokens,
            "target_input_tokens": s.target_input_tokens,
            "target_cacheable_input_tokens": s.target_cacheable_input_tokens,
            // What the target said it served from its cache, when every call said (the cost
            // estimate then uses it instead of the cache rules).
            "target_reported_cached_tokens": s.reported_cached_tokens(),
            "heal_retries": s.heal_retries,
            // The target's own account of its compute, over the calls that gave one (llama.cpp
            // does; a stream closed before its end does not).
            "target_busy_seconds": s.target_busy.as_secs_f64(),
            "target_prompt_processed_tokens": s.target_prompt_processed,
            "target_predicted_tokens": s.target_predicted,
            "target_calls_timed": s.target_calls_timed,
        }
    });
    let usage = &mut u["approxy"];
    add_grammar_and_calls(usage, s);
    add_cost(usage, p, m);
    add_times(usage, p, a.draft_threads);
    u
}

/// The grammar's part of an answer and its calls' records.
fn add_grammar_and_calls(u: &mut Value, s: &Stats) {
    // Every call's work, for anyone to check against the target's own account.
    // Of the draft's tokens, those the answer's grammar forced (structured output); the
    // target tokens it refused, and of those the positions the target then wrote keeping to
    // what the grammar allows.
    u["forced_tokens"] = json!(s.forced_tokens);
    u["grammar_refusals"] = json!(s.grammar_refusals);
    u["grammar_picks"] = json!(s.grammar_picks);
    // Draft tokens sent to the target because the draft's run looped or ran long unheard.
    u["loop_checks"] = json!(s.loop_checks);
    u["target_call_records"] = json!(s.calls);
    // Of the calls, the warm of the prompt (`target.cache.warm`): 0 or 1.
    u["target_warms"] = json!(s.target_warms);
    // Of the calls, those that took a span on (`correction.ask = "fewest"`).
    u["span_continuations"] = json!(s.span_continuations);
    // Of the calls, windows scored again without the target's prefix cache (stale rows at
    // cached positions: `targets::token_in`).
    u["window_rescores"] = json!(s.window_rescores);
}

/// What the answer cost in its model's price class, and passthrough's cost.
fn add_cost(u: &mut Value, p: &Account, m: &ModelRuntime) {
    let cost = p.cost;
    u["price_class"] = json!(m.policy.price.class());
    u["cost_unit"] = json!(p.unit.name());
    u["estimated_cost"] = json!(cost.approxy);
    u["estimated_passthrough_cost"] = json!(cost.passthrough);
    if p.unit == Unit::Usd {
        u["estimated_cost_usd"] = json!(cost.approxy);
        u["estimated_passthrough_cost_usd"] = json!(cost.passthrough);
    }
}

/// Where the time went: the target's, the draft's cores and the verifier's.
fn add_times(u: &mut Value, p: &Account, draft_threads: usize) {
    let s = &p.stats;
    // The target's time, whatever the price class: its own figure for the calls it timed,
    // the learned rates for those it did not (a stream closed before its end), and the same
    // answer through passthrough at the same rates.
    let t = &p.time;
    u["target_seconds"] = json!(t.spent);
    u["target_seconds_measured"] = json!(t.measured);
    u["target_seconds_estimated"] = json!(t.estimated);
    u["target_calls_untimed"] = json!(t.untimed_calls);
    u["passthrough_target_seconds"] = json!(t.passthrough);
    // An upper bound on the gateway's cores the draft held: its inference time times the
    // threads each worker runs.
    u["draft_core_seconds"] = json!(s.draft_time.as_secs_f64() * draft_threads as f64);
    // Where the time went: the draft's forward passes, the verifier, and waiting for the
    // target (the draft's work overlaps the waits when the request overlaps).
    u["draft_seconds"] = json!(s.draft_time.as_secs_f64());
    u["verifier_seconds"] = json!(s.verifier_time.as_secs_f64());
    u["target_wait_seconds"] = json!(s.target_wait.as_secs_f64());
}

/// The finish reason: an answer that called tools and ended on its own ends in `tool_calls`.
fn finish_str(r: Option<FinishReason>, calls: usize) -> &'static str {
    match r {
        Some(FinishReason::Length) => "length",
        _ if calls > 0 => "tool_calls",
        _ => "stop",
    }
}

fn record_metrics(p: &Account, outcome: &'static str) {
    let (s, cost) = (&p.stats, p.cost);
    metrics::counter!("approxy_requests_total", "mode" => "approximate", "outcome" => outcome)
        .increment(1);
    metrics::counter!("approxy_tokens_total", "source" => "draft")
        .increment(u64::from(s.draft_tokens));
    metrics::counter!("approxy_tokens_total", "source" => "target")
        .increment(u64::from(s.target_tokens));
    metrics::counter!("approxy_forced_tokens_total").increment(u64::from(s.forced_tokens));
    metrics::counter!("approxy_target_calls_total").increment(u64::from(s.target_calls));
    metrics::counter!("approxy_verifier_rejections_total")
        .increment(u64::from(s.verifier_rejections));
    if s.bailed_out {
        metrics::counter!("approxy_bailouts_total").increment(1);
    }
    if s.cost_guard {
        metrics::counter!("approxy_cost_guard_total").increment(1);
    }
    metrics::counter!("approxy_span_resyncs_total").increment(u64::from(s.resyncs));
    metrics::counter!("approxy_span_continuations_total")
        .increment(u64::from(s.span_continuations));
    // The metrics facade's counters are integers; a gauge that only grows carries the dollars
    // (or, busy-priced, the seconds).
    match p.unit {
        Unit::Usd => {
            metrics::gauge!("approxy_estimated_cost_usd_total", "kind" => "approxy")
                .increment(cost.approxy);
            metrics::gauge!("approxy_estimated_cost_usd_total", "kind" => "passthrough")
                .increment(cost.passthrough);
        }
        Unit::TargetSeconds => {
            metrics::gauge!("approxy_estimated_target_seconds_total", "kind" => "approxy")
                .increment(cost.approxy);
            metrics::gauge!("approxy_estimated_target_seconds_total", "kind" => "passthrough")
                .increment(cost.passthrough);
        }
    }
    metrics::gauge!("approxy_target_seconds_total", "measured" => "true")
        .increment(p.time.measured);
    metrics::gauge!("approxy_target_seconds_total", "measured" => "false")
        .increment(p.time.estimated);
    if s.completion_tokens > 0 {
        metrics::histogram!("approxy_time_to_first_token_seconds")
            .record(s.time_to_first_token.as_secs_f64());
    }
    for &r in &s.accepted_runs {
        metrics::histogram!("approxy_accepted_run_length").record(f64::from(r));
    }
}

struct Ids {
    id: String,
    created: u64,
    model: String,
    endpoint: Endpoint,
}

impl Ids {
    /// A new answer's ids, as OpenAI forms them.
    fn new(model: String, endpoint: Endpoint) -> Self {
        let prefix = if endpoint == Endpoint::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        };
        Self {
            id: format!("{prefix}-{:032x}", rand::random::<u128>()),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            model,
            endpoint,
        }
    }

    /// A chunk of answer `index`.
    fn chunk(&self, index: usize, text: Option<&str>, finish: Option<&str>, first: bool) -> Value {
        match self.endpoint {
            Endpoint::Chat => {
                let delta = match text {
                    Some(t) => json!({"content": t}),
                    None => json!({}),
                };
                self.chat_chunk(index, delta, finish, first)
            }
            Endpoint::Completions => {
                json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                       "choices": [{"index": index, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish}]})
            }
        }
    }

    /// A chat chunk of answer `index` with this `delta` (its first one names the role).
    fn chat_chunk(
        &self,
        index: usize,
        mut delta: Value,
        finish: Option<&str>,
        first: bool,
    ) -> Value {
        if first {
            delta["role"] = json!("assistant");
        }
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": [{"index": index, "delta": delta, "logprobs": null, "finish_reason": finish}]})
    }
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// Why no answer was given.
pub enum Failed {
    /// The engine failed before its first token: nothing was sent, so the request can still
    /// go to the target (with the engine's error, for when it may not).
    BeforeFirstToken(approxy_verifier::infer::EngineError),
    /// Later, or not the engine's doing.
    Error(ApiError),
}

impl From<ApiError> for Failed {
    fn from(e: ApiError) -> Self {
        Failed::Error(e)
    }
}

/// Runs the generation (`n` answers, one per draft lease) and answers the client.
/// `trace` is the client's W3C trace context, sent on every target call made for it.
pub async fn approximate(
    rt: Arc<Runtime>,
    a: Approximate,
    trace: TraceContext,
) -> Result<Response, Failed> {
    let Approximate {
        request: valid,
        prompt_kind,
        generation: request,
        model,
        drafts,
        account,
        // Read by the caller, which decides on a fallback.
        passable: _,
    } = a;
    let dial = Dial {
        threshold: request.threshold,
        kind: prompt_kind,
    };
    let n = drafts.len();
    let draft_threads = rt.draft_threads;
    // A non-streamed answer is the response head, which the request's deadline bounds, so its
    // target calls wait for no retry past it. A stream's head goes out with its first token,
    // after which that deadline no longer runs; its calls keep their own.
    let deadline = (!valid.stream)
        .then(approxy_verifier::infer::transport::current_deadline)
        .flatten();
    let fenced = request.constraint.as_ref().is_some_and(Constraint::fenced);
    let job = infer::Job {
        request,
        leases: drafts,
        verifier: Arc::clone(&model.verifier),
        price: model.policy.price,
        meter: Arc::clone(&rt.meter) as Arc<dyn infer::Meter>,
        books: account.map(|a| Arc::new(a) as Arc<dyn infer::Books>),
        trace,
        deadline,
    };
    let (mut rx, task) = infer::start(&rt.engine, job);
    let answer = Answer::new(&valid, fenced, model, dial, (draft_threads, n));
    // Wait for the first token before committing to a 200: a target that is down at the
    // first rejection then gets a proper error status instead of a broken stream.
    let first = rx.recv().await;
    if first.is_none() {
        let priced = match task.await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return Err(Failed::BeforeFirstToken(e)),
            Err(e) => return Err(ApiError::Internal(e.to_string()).into()),
        };
        // An answer that ended at once (end of sequence first) is still answered in the form
        // asked for: a stream of events when streaming.
        if valid.stream {
            let done = tokio::spawn(async move { Ok(priced) });
            return Ok(stream(
                answer,
                None,
                rx,
                done,
                valid.include_usage,
                rt.policy.gateway.write_idle_timeout,
            ));
        }
        return Ok(complete(&answer, vec![String::new(); n], &priced));
    }
    if valid.stream {
        Ok(stream(
            answer,
            first,
            rx,
            task,
            valid.include_usage,
            rt.policy.gateway.write_idle_timeout,
        ))
    } else {
        let texts = collect(first, rx, n).await;
        let priced = finished(task).await?;
        Ok(complete(&answer, texts, &priced))
    }
}

/// A non-streamed request's answers' texts, from the first event on.
async fn collect(first: Option<Event>, mut rx: mpsc::Receiver<Event>, n: usize) -> Vec<String> {
    let mut texts = vec![String::new(); n];
    let mut last = Instant::now();
    if let Some((i, ev)) = first {
        texts[i].push_str(&ev.text);
    }
    while let Some((i, ev)) = rx.recv().await {
        metrics::histogram!("approxy_inter_token_latency_seconds")
            .record(last.elapsed().as_secs_f64());
        last = Instant::now();
        texts[i].push_str(&ev.text);
    }
    texts
}

/// Waits for the generation task; a failure is counted here, where it ends the request.
async fn finished(task: infer::Done) -> Result<Account, ApiError> {
    task.await.map_err(|e| ApiError::Internal(e.to_string()))?.map_err(|e| {
        metrics::counter!("approxy_requests_total", "mode" => "approximate", "outcome" => "error").increment(1);
        ApiError::from(e)
    })
}

fn complete(a: &Answer, texts: Vec<String>, p: &Account) -> Response {
    let (ids, dial, s, cost) = (&a.ids, a.dial, &p.stats, p.cost);
    record_metrics(p, "ok");
    let choices: Vec<Value> = texts
        .into_iter()
        .enumerate()
        .map(|(index, text)| {
            let ended = p.finishes.get(index).copied().flatten();
            match ids.endpoint {
                Endpoint::Chat if a.tools => {
                    let (message, calls) = tool_calls::message(&text, a.bare_calls.clone());
                    let finish = finish_str(ended, calls);
                    json!({"index": index, "message": message, "logprobs": null, "finish_reason": finish})
                }
                Endpoint::Chat => {
                    let finish = finish_str(ended, 0);
                    json!({"index": index, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish})
                }
                Endpoint::Completions => {
                    let finish = finish_str(ended, 0);
                    json!({"index": index, "text": text, "logprobs": null, "finish_reason": finish})
                }
            }
        })
        .collect();
    let object = if ids.endpoint == Endpoint::Chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    let body = json!({"id": ids.id, "object": object, "created": ids.created, "model": ids.model,
                      "choices": choices, "usage": usage(p, a)});
    let mut resp = axum::Json(body).into_response();
    let h = resp.headers_mut();
    let mut put = |k: &'static str, v: String| {
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    };
    put("x-approxy-mode", "approximate".into());
    put("x-approxy-draft-tokens", s.draft_tokens.to_string());
    put("x-approxy-target-tokens", s.target_tokens.to_string());
    put("x-approxy-target-calls", s.target_calls.to_string());
    put(
        "x-approxy-verifier-rejections",
        s.verifier_rejections.to_string(),
    );
    put("x-approxy-bailed-out", s.bailed_out.to_string());
    put("x-approxy-cost-guard", s.cost_guard.to_string());
    put("x-approxy-threshold", dial.threshold.to_string());
    put("x-approxy-prompt-kind", dial.kind.name().into());
    put(
        "x-approxy-estimated-cost-usd",
        format!("{:.8}", cost.approxy),
    );
    put(
        "x-approxy-estimated-passthrough-cost-usd",
        format!("{:.8}", cost.passthrough),
    );
    resp
}

/// The chunks for pieces of answer `index`, which may call tools (its first names the role).
fn tool_chunks(
    ids: &Ids,
    index: usize,
    pieces: Vec<tool_calls::Piece>,
    first: &mut bool,
) -> Vec<Value> {
    pieces
        .iter()
        .map(|p| {
            let chunk = ids.chat_chunk(index, tool_calls::delta(p), None, *first);
            *first = false;
            chunk
        })
        .collect()
}

/// Sends one piece of a stream; false when the client is gone. A client that stops reading
/// would hold the draft worker and its slot for ever: once the buffer is full and nothing is
/// read for `write_idle`, it counts as gone.
async fn send_within(
    tx: &mpsc::Sender<Result<Bytes, Infallible>>,
    b: Bytes,
    write_idle: Duration,
) -> bool {
    match tokio::time::timeout(write_idle, tx.send(Ok(b))).await {
        Ok(Ok(())) => true,
        Ok(Err(_)) => false,
        Err(_) => {
            metrics::counter!("approxy_stream_write_timeouts_total").increment(1);
            tracing::warn!(
                ?write_idle,
                "the client stopped reading a stream; giving up on it"
            );
            false
        }
    }
}

/// One answer's place in a stream: whether its first chunk (which names the role) is still to
/// go, the reader of its calls when it may call tools, and whether it is JSON that may be
/// fenced.
struct Streamed {
    first: bool,
    calls: Option<CallReader>,
    fenced: bool,
}

impl Streamed {
    fn new(answer: &Answer) -> Self {
        Self {
            first: true,
            calls: answer
                .tools
                .then(|| CallReader::reading_bare(answer.bare_calls.clone())),
            fenced: answer.fenced,
        }
    }

    /// The chunks for more of answer `index`'s text.
    fn chunks(&mut self, ids: &Ids, index: usize, text: &str) -> Vec<Value> {
        if self.fenced && text.is_empty() && !self.first {
            return Vec::new();
        }
        match &mut self.calls {
            Some(reader) => {
                let pieces = reader.feed(text);
                tool_chunks(ids, index, pieces, &mut self.first)
            }
            None => {
                let chunk = ids.chunk(index, Some(text), None, self.first);
                self.first = false;
                vec![chunk]
            }
        }
    }

    /// The chunks that end answer `index`: what its readers still held, then its finish.
    fn finish(&mut self, ids: &Ids, index: usize, ended: Option<FinishReason>) -> Vec<Value> {
        let mut out = match &mut self.calls {
            Some(reader) => {
                let pieces = reader.finish();
                tool_chunks(ids, index, pieces, &mut self.first)
            }
            None => Vec::new(),
        };
        let called = self.calls.as_ref().map_or(0, CallReader::calls);
        out.push(ids.chunk(index, None, Some(finish_str(ended, called)), self.first));
        out
    }
}

/// A stream's last events once its answers have ended: each answer's finish, the usage where
/// asked for, and `[DONE]`.
fn stream_tail(
    answer: &Answer,
    answers: &mut [Streamed],
    priced: &Account,
    include_usage: bool,
) -> Vec<Bytes> {
    let ids = &answer.ids;
    let mut out: Vec<Bytes> = Vec::new();
    for (i, a) in answers.iter_mut().enumerate() {
        let ended = priced.finishes.get(i).copied().flatten();
        out.extend(a.finish(ids, i, ended).iter().map(sse));
    }
    if include_usage {
        let mut u = ids.chunk(0, None, None, false);
        u["choices"] = json!([]);
        u["usage"] = usage(priced, answer);
        out.push(sse(&u));
    }
    out.push(Bytes::from_static(b"data: [DONE]\n\n"));
    out
}

/// The response that carries a stream's events, with the headers that say how it ran.
fn event_stream(body_rx: mpsc::Receiver<Result<Bytes, Infallible>>, dial: Dial) -> Response {
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(body_rx));
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-approxy-mode", HeaderValue::from_static("approximate"));
    h.insert(
        "x-approxy-prompt-kind",
        HeaderValue::from_static(dial.kind.name()),
    );
    if let Ok(v) = HeaderValue::from_str(&dial.threshold.to_string()) {
        h.insert("x-approxy-threshold", v);
    }
    resp
}

fn stream(
    answer: Answer,
    first: Option<Event>,
    mut rx: mpsc::Receiver<Event>,
    task: infer::Done,
    include_usage: bool,
    write_idle: Duration,
) -> Response {
    let (body_tx, body_rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    let dial = answer.dial;
    tokio::spawn(async move {
        let ids = &answer.ids;
        let mut last = Instant::now();
        let mut pending = first;
        let mut answers: Vec<Streamed> = (0..answer.n).map(|_| Streamed::new(&answer)).collect();
        loop {
            let (i, ev) = match pending.take() {
                Some(ev) => ev,
                None => match rx.recv().await {
                    Some(ev) => {
                        metrics::histogram!("approxy_inter_token_latency_seconds")
                            .record(last.elapsed().as_secs_f64());
                        last = Instant::now();
                        ev
                    }
                    None => break,
                },
            };
            let Some(a) = answers.get_mut(i) else {
                continue;
            };
            if ev.text.is_empty() && !a.first {
                continue;
            }
            for chunk in a.chunks(ids, i, &ev.text) {
                // The client is gone: dropping `rx` (by returning) stops the engine.
                if !send_within(&body_tx, sse(&chunk), write_idle).await {
                    return;
                }
            }
        }
        match task.await {
            Ok(Ok(priced)) => {
                record_metrics(&priced, "ok");
                let tail = stream_tail(&answer, &mut answers, &priced, include_usage);
                for b in tail {
                    if !send_within(&body_tx, b, write_idle).await {
                        return;
                    }
                }
            }
            Ok(Err(e)) => {
                metrics::counter!("approxy_requests_total", "mode" => "approximate", "outcome" => "error").increment(1);
                let err = ApiError::from(e);
                tracing::error!(error = ?err, "generation failed mid-stream");
                let _ = send_within(&body_tx, sse(&err.body()), write_idle).await;
            }
            Err(e) => {
                let err = ApiError::Internal(e.to_string());
                tracing::error!(error = ?err, "generation task failed mid-stream");
                let _ = send_within(&body_tx, sse(&err.body()), write_idle).await;
            }
        }
    });
    event_stream(body_rx, dial)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_that_ran_spans_for_its_windows_says_so() {
        let spans = Stats {
            spans_for_windows: true,
            ..Stats::default()
        };
        let windows = Stats::default();
        let w = Verification::ApproximateWindows;
        assert_eq!(verification_name(w, &windows), "approximate_windows");
        assert_eq!(verification_name(w, &spans), "approximate");
        assert_eq!(
            verification_name(Verification::Judged, &spans),
            "approximate"
        );
        assert_eq!(verification_name(Verification::Exact, &spans), "exact");
    }
}
