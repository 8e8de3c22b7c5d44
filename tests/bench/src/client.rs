//! The benchmark's client: one streaming `/v1/completions` call, timed the way a chat app
//! feels it (time to the first text, then to the last byte), with the usage the server
//! reports (approxy's own accounting, or llama.cpp's speculative-decoding counters).

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What approxy reports in `usage.approxy`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ApproxyUsage {
    /// Draft tokens emitted.
    pub draft_tokens: u64,
    /// Target tokens emitted.
    pub target_tokens: u64,
    /// Target calls.
    pub target_calls: u64,
    /// Input tokens sent to the target over all calls.
    pub target_input_tokens: u64,
    /// Of those, the part a prompt cache could reuse.
    pub target_cacheable_input_tokens: u64,
    /// The target finished the answer after too many rejections.
    pub bailed_out: bool,
    /// The cost guard handed the rest of the answer to the target.
    #[serde(default)]
    pub cost_guard: bool,
    /// Windows the target scored.
    #[serde(default)]
    pub windows: u64,
    /// Draft tokens proposed in those windows.
    #[serde(default)]
    pub window_tokens: u64,
    /// Tokens the draft guessed while target calls were in flight.
    #[serde(default)]
    pub overlap_guesses: u64,
    /// Of those, guesses the answer took.
    #[serde(default)]
    pub overlap_guesses_used: u64,
    /// Tokens prompt lookup proposed to the draft.
    #[serde(default)]
    pub lookup_tokens: u64,
    /// Of those, tokens the draft then picked itself.
    #[serde(default)]
    pub lookup_tokens_used: u64,
    /// Target tokens generated but not used (a span cancelled mid-chunk); paid for.
    #[serde(default)]
    pub target_discarded_tokens: u64,
    /// approxy's estimate at the policy's prices.
    #[serde(default)]
    pub estimated_cost_usd: f64,
    /// The same for passthrough.
    #[serde(default)]
    pub estimated_passthrough_cost_usd: f64,
    /// Why the guard handed the rest to the target, when it did.
    #[serde(default)]
    pub cost_guard_reason: Option<String>,
    /// The target's own account of its compute, seconds (llama.cpp).
    #[serde(default)]
    pub target_busy_seconds: f64,
    /// Tokens billed for streams closed before their end (generated after the close).
    #[serde(default)]
    pub target_inflight_tokens: u64,
    /// Further calls spans took because a call's tokens did not end them (`ask = "fewest"`).
    #[serde(default)]
    pub span_continuations: u64,
    /// What the target said it served from its cache, when every call said.
    #[serde(default)]
    pub target_reported_cached_tokens: Option<u64>,
    /// approxy's estimate in its price class's unit (`cost_unit`), and passthrough's.
    #[serde(default)]
    pub estimated_cost: Option<f64>,
    /// See `estimated_cost`.
    #[serde(default)]
    pub estimated_passthrough_cost: Option<f64>,
    /// `usd` or `target_seconds`.
    #[serde(default)]
    pub cost_unit: Option<String>,
    /// The target's time on the request: measured where it reported, estimated elsewhere.
    #[serde(default)]
    pub target_seconds: f64,
    /// Of those, the part it reported.
    #[serde(default)]
    pub target_seconds_measured: f64,
    /// Calls it did not time (priced at the learned rates).
    #[serde(default)]
    pub target_calls_untimed: u64,
    /// The same answer through passthrough at the same rates.
    #[serde(default)]
    pub passthrough_target_seconds: f64,
    /// The draft's inference time times its threads.
    #[serde(default)]
    pub draft_core_seconds: f64,
    /// Every target call.
    #[serde(default)]
    pub target_call_records: Vec<CallRecord>,
}

/// One target call, as `usage.approxy.target_call_records` gives it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CallRecord {
    /// `correction`, `span`, `window` or `hand_off`.
    pub kind: String,
    /// Prompt tokens sent.
    pub sent: u64,
    /// Of those, served from the cache.
    pub cached: u64,
    /// Tokens generated, used or not.
    pub generated: u64,
}

/// One timed generation.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Generation {
    /// Text produced.
    pub text: String,
    /// Prompt tokens (server's count).
    pub prompt_tokens: u64,
    /// Output tokens (server's count).
    pub completion_tokens: u64,
    /// Request start to last byte.
    pub seconds: f64,
    /// Request start to the first non-empty text.
    pub ttft: Option<f64>,
    /// `stop` or `length`.
    pub finish_reason: Option<String>,
    /// approxy's accounting, when the server is approxy in approximate mode.
    pub approxy: Option<ApproxyUsage>,
    /// llama.cpp speculative decoding: tokens drafted.
    pub draft_n: Option<u64>,
    /// llama.cpp speculative decoding: drafted tokens the target accepted.
    pub draft_n_accepted: Option<u64>,
    /// Set when the call failed; the rest is what arrived before.
    pub error: Option<String>,
    /// approxy's `x-approxy-mode` header (`approximate` or `passthrough`), when it sent one.
    #[serde(default)]
    pub mode: Option<String>,
    /// approxy's `x-approxy-passthrough-reason` header, on a passthrough.
    #[serde(default)]
    pub passthrough_reason: Option<String>,
}

/// One completion request.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    /// `/v1/completions` URL.
    pub url: &'a str,
    /// Model id (selects the policy entry at approxy).
    pub model: &'a str,
    /// Prompt text.
    pub prompt: &'a str,
    /// Output limit.
    pub max_tokens: u32,
    /// Stop strings.
    pub stop: &'a [&'a str],
    /// `x-approxy-threshold`.
    pub threshold: Option<f32>,
    /// Whole-request limit.
    pub timeout: Duration,
}

/// Runs one greedy streaming completion; failures are recorded in the result, not returned.
pub async fn complete(http: &reqwest::Client, ask: &Ask<'_>) -> Generation {
    let start = Instant::now();
    let mut g = Generation::default();
    if let Err(e) = tokio::time::timeout(ask.timeout, stream_into(http, ask, start, &mut g))
        .await
        .unwrap_or_else(|_| Err(format!("timed out after {:?}", ask.timeout)))
    {
        g.error = Some(e);
    }
    g.seconds = start.elapsed().as_secs_f64();
    g
}

async fn stream_into(
    http: &reqwest::Client,
    ask: &Ask<'_>,
    start: Instant,
    g: &mut Generation,
) -> Result<(), String> {
    let body = json!({
        "model": ask.model,
        "prompt": ask.prompt,
        "max_tokens": ask.max_tokens,
        "temperature": 0,
        "stop": ask.stop,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let send = || {
        let mut rb = http.post(ask.url).json(&body);
        if let Some(t) = ask.threshold {
            rb = rb.header("x-approxy-threshold", t.to_string());
        }
        rb.send()
    };
    // A request that got no answer at all (a pooled connection the server had just closed) is
    // sent once more; anything the server answered counts as it is.
    let resp = match send().await {
        Ok(r) => r,
        Err(e) if e.is_request() || e.is_connect() => {
            tracing::warn!(error = %e, "no answer; sending once more");
            send().await.map_err(|e| e.to_string())?
        }
        Err(e) => return Err(e.to_string()),
    };
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    g.mode = header("x-approxy-mode");
    g.passthrough_reason = header("x-approxy-passthrough-reason");
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        return Err(format!(
            "HTTP {status}: {}",
            text.chars().take(300).collect::<String>()
        ));
    }
    read_events(resp.bytes_stream(), start, g).await
}

/// Reads the server-sent events of a completion stream into `g` until `[DONE]` (the parsing,
/// chunk boundaries and multi-line `data:` fields included, is `eventsource-stream`'s).
async fn read_events<S, B, E>(bytes: S, start: Instant, g: &mut Generation) -> Result<(), String>
where
    S: futures::Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
    E: std::fmt::Display,
{
    use eventsource_stream::Eventsource;
    let mut events = bytes.eventsource();
    while let Some(event) = events.next().await {
        let data = event.map_err(|e| e.to_string())?.data;
        if data.trim() == "[DONE]" {
            return Ok(());
        }
        let v: Value = serde_json::from_str(&data).map_err(|e| format!("bad event {data}: {e}"))?;
        absorb(&v, start, g)?;
    }
    Ok(())
}

fn absorb(v: &Value, start: Instant, g: &mut Generation) -> Result<(), String> {
    if let Some(err) = v.get("error") {
        return Err(format!("error event: {err}"));
    }
    if let Some(choice) = v["choices"].get(0) {
        if let Some(t) = choice["text"].as_str().filter(|t| !t.is_empty()) {
            if g.ttft.is_none() {
                g.ttft = Some(start.elapsed().as_secs_f64());
            }
            g.text.push_str(t);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            g.finish_reason = Some(f.to_string());
        }
    }
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        g.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
        g.completion_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
        if let Some(a) = u.get("approxy") {
            g.approxy =
                Some(serde_json::from_value(a.clone()).map_err(|e| format!("usage.approxy: {e}"))?);
        }
    }
    if let Some(t) = v.get("timings") {
        g.draft_n = t["draft_n"].as_u64().or(g.draft_n);
        g.draft_n_accepted = t["draft_n_accepted"].as_u64().or(g.draft_n_accepted);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_are_read_across_chunks_and_multi_line_data_is_joined() {
        // One event cut mid-field across chunks, one whose JSON spans two `data:` lines (joined
        // with a newline, as the SSE format says), CRLF line ends, then `[DONE]` and a trailing
        // event that must not be read.
        let chunks: Vec<Result<&[u8], std::io::Error>> = vec![
            Ok(b"data: {\"choices\": [{\"te"),
            Ok(b"xt\": \"ab\"}]}\n\n"),
            Ok(b"data: {\"choices\":\r\ndata: [{\"text\": \"c\", \"finish_reason\": \"stop\"}]}\r\n\r\n"),
            Ok(b"data: [DONE]\n\ndata: {\"choices\": [{\"text\": \"late\"}]}\n\n"),
        ];
        let mut g = Generation::default();
        let r = read_events(futures::stream::iter(chunks), Instant::now(), &mut g).await;
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(g.text, "abc");
        assert_eq!(g.finish_reason.as_deref(), Some("stop"));
    }

    #[test]
    fn usage_text_and_errors_are_absorbed() {
        let start = Instant::now();
        let mut g = Generation::default();
        absorb(&json!({"choices": [{"text": ""}]}), start, &mut g)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(g.ttft.is_none(), "empty text is not a first token");
        absorb(&json!({"choices": [{"text": "ab"}]}), start, &mut g)
            .unwrap_or_else(|e| panic!("{e}"));
        absorb(
            &json!({"choices": [{"text": "c", "finish_reason": "stop"}]}),
            start,
            &mut g,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let usage = json!({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3,
            "approxy": {"draft_tokens": 2, "target_tokens": 1, "target_calls": 1, "target_input_tokens": 7,
                        "target_cacheable_input_tokens": 0, "bailed_out": false, "mode": "approximate"}}});
        absorb(&usage, start, &mut g).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g.text, "abc");
        assert!(g.ttft.is_some());
        assert_eq!(g.finish_reason.as_deref(), Some("stop"));
        assert_eq!(g.completion_tokens, 3);
        assert_eq!(g.approxy.as_ref().map(|a| a.target_input_tokens), Some(7));
        assert!(absorb(&json!({"error": {"message": "boom"}}), start, &mut g).is_err());
    }
}
