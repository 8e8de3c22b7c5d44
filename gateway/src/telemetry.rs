//! Logging and Prometheus metrics: installed once, every metric described once here.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Installs the Prometheus recorder with histogram buckets and describes every metric.
pub fn install_metrics() -> anyhow::Result<PrometheusHandle> {
    let seconds = [
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ];
    let runs = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds)?
        .set_buckets_for_metric(Matcher::Full("approxy_accepted_run_length".into()), &runs)?
        .install_recorder()?;
    describe_traffic();
    describe_drafting();
    describe_draft_workers();
    describe_passthrough();
    describe_cost();
    Ok(handle)
}

/// Requests, connections and policy reloads: the gateway's own traffic, whatever the mode.
fn describe_traffic() {
    describe_counter!(
        "approxy_requests_total",
        "Requests by mode (approximate, passthrough) and outcome"
    );
    describe_counter!(
        "approxy_http_requests_total",
        Unit::Count,
        "HTTP requests by path and status"
    );
    describe_histogram!(
        "approxy_http_response_head_seconds",
        Unit::Seconds,
        "Time to the response head by path"
    );
    describe_counter!(
        "approxy_requests_shed_total",
        Unit::Count,
        "Requests refused with 429 at the concurrency limit"
    );
    describe_gauge!(
        "approxy_request_slots_free",
        "Requests the gateway can still admit (of gateway.max_concurrent_requests)"
    );
    describe_counter!(
        "approxy_errors_total",
        Unit::Count,
        "Error responses by status"
    );
    describe_counter!(
        "approxy_client_errors_total",
        Unit::Count,
        "Requests refused for the client's own fault, by reason (body_timeout, body_framing)"
    );
    describe_counter!(
        "approxy_connections_closed_total",
        Unit::Count,
        "Connections the gateway closed, by reason (per_ip_cap, idle, unread)"
    );
    describe_counter!(
        "approxy_stream_write_timeouts_total",
        Unit::Count,
        "Streams ended because the client stopped reading (gateway.write_idle_timeout)"
    );
    describe_counter!(
        "approxy_policy_reloads_total",
        Unit::Count,
        "Policy reloads by outcome"
    );
}

/// Approximate mode: what the verifier accepts, the target's share, and the answer's pace.
fn describe_drafting() {
    describe_counter!(
        "approxy_tokens_total",
        Unit::Count,
        "Output tokens by source (draft, target)"
    );
    describe_counter!(
        "approxy_target_calls_total",
        Unit::Count,
        "Continuation calls made to the target"
    );
    describe_counter!(
        "approxy_verifier_rejections_total",
        Unit::Count,
        "Draft tokens the verifier rejected"
    );
    describe_counter!(
        "approxy_forced_tokens_total",
        Unit::Count,
        "Tokens a structured answer's grammar forced (no verifier, no target call)"
    );
    describe_histogram!(
        "approxy_grammar_compile_seconds",
        Unit::Seconds,
        "Compiling a structured request's schema, or finding it in the cache"
    );
    describe_histogram!(
        "approxy_accepted_run_length",
        Unit::Count,
        "Consecutive draft tokens accepted between rejections"
    );
    describe_counter!(
        "approxy_bailouts_total",
        Unit::Count,
        "Generations handed to the target after too many rejections"
    );
    describe_counter!(
        "approxy_span_resyncs_total",
        Unit::Count,
        "Target spans ended where the draft caught up with the target"
    );
    describe_counter!(
        "approxy_span_continuations_total",
        Unit::Count,
        "Further calls a target span took because the tokens asked for did not end it"
    );
    describe_histogram!(
        "approxy_time_to_first_token_seconds",
        Unit::Seconds,
        "Time to the first output token (approximate mode)"
    );
    describe_histogram!(
        "approxy_inter_token_latency_seconds",
        Unit::Seconds,
        "Time between output tokens (approximate mode)"
    );
}

/// The draft's workers: how busy they are, how well their steps are batched, and their panics.
fn describe_draft_workers() {
    describe_gauge!(
        "approxy_draft_workers",
        "Draft workers configured (1 - idle / this is the draft's saturation)"
    );
    describe_gauge!(
        "approxy_draft_workers_idle",
        "Draft workers drafting for no request"
    );
    describe_gauge!(
        "approxy_draft_streams",
        "Requests the draft workers are drafting for"
    );
    describe_gauge!(
        "approxy_draft_stream_limit",
        "Requests the draft workers may draft for at once (workers x streams_per_worker)"
    );
    describe_histogram!(
        "approxy_draft_step_streams",
        Unit::Count,
        "Requests each batched draft step ran for"
    );
    describe_counter!(
        "approxy_draft_idle_rows_total",
        Unit::Count,
        "Rows of batched draft decode steps that ran filler for a stream not back in time"
    );
    describe_counter!(
        "approxy_draft_worker_panics_total",
        Unit::Count,
        "Draft worker panics (the worker's batch is reset and it carries on)"
    );
}

/// Passthrough: why a request went straight to the target, and how its answer fared.
fn describe_passthrough() {
    describe_counter!(
        "approxy_passthrough_total",
        Unit::Count,
        "Passthrough requests by reason"
    );
    describe_histogram!(
        "approxy_passthrough_head_seconds",
        Unit::Seconds,
        "Time to the target's response head in passthrough"
    );
    describe_counter!(
        "approxy_passthrough_broken_bodies_total",
        Unit::Count,
        "Passthrough answers whose body broke off or stalled after the head was sent"
    );
}

/// Spend: the estimate, and the budget guard's ledger it keeps per model and prompt kind.
fn describe_cost() {
    describe_gauge!(
        "approxy_estimated_cost_usd_total",
        "Estimated target spend in USD by kind (approxy, passthrough = same answers sent straight to the target)"
    );
    describe_gauge!(
        "approxy_estimated_target_seconds_total",
        "Busy-priced models: the target's time in seconds by kind (approxy, passthrough = the same answers at the learned rates)"
    );
    describe_gauge!(
        "approxy_target_seconds_total",
        "The target's time on approximate answers, seconds: measured = as it reported, false = estimated at the learned rates for calls it did not time"
    );
    describe_counter!(
        "approxy_window_rescores_total",
        Unit::Count,
        "Window calls to vLLM's token-in endpoint made again: without its prefix cache (stale: a window row sat at a cached position) or through /v1/completions (refused)"
    );
    describe_gauge!(
        "approxy_target_window_route",
        "1 for how the target scores windows: endpoint, and whether the prefix comes from its cache (reads_cache)"
    );
    describe_gauge!(
        "approxy_target_rate_ms",
        "What the target's time costs, learned from its reports: ms per computed prompt token (prefill), per generated token (generate) and per call (call)"
    );
    describe_gauge!(
        "approxy_budget_target_seconds",
        "The budget guard's ledger of a busy-priced model: the target's seconds so far by model, prompt kind and side (approxy, passthrough)"
    );
    describe_counter!(
        "approxy_cost_guard_total",
        Unit::Count,
        "Answers the cost guard handed to the target"
    );
    describe_gauge!(
        "approxy_budget_cost_usd",
        "The budget guard's ledger: cost so far by model, prompt kind and side (approxy, passthrough), USD"
    );
    describe_gauge!(
        "approxy_budget_cost_ratio",
        "The budget guard's ledger: approxy's cost over passthrough's, by model and prompt kind"
    );
    describe_gauge!(
        "approxy_budget_calls_per_token",
        "The budget guard's estimate of target calls per output token, by model and prompt kind"
    );
    describe_gauge!(
        "approxy_budget_target_share",
        "The budget guard's estimate of the target's share of output tokens, by model and prompt kind"
    );
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn install_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
