//! `approxy bench soak`: long runs that look for leaks and hangs rather than speed.
//!
//! - `passthrough`: `approxy serve` in front of a stub upstream (it follows OpenAI's chat
//!   completions wire format, JSON and `chat.completion.chunk` SSE, and answers after a short
//!   random delay so that disconnects land mid-request), at a fixed offered rate.
//! - `approximate`: `approxy serve` with the shipped default policy in front of the real
//!   llama-server target, at a fixed number of concurrent clients.
//! - `attack`: idle, slow-body and normal clients at once (see `attack`).
//!
//! In both, a share of the clients (10 % by default) leave at a random moment mid-request, half
//! of the requests stream, and every few seconds the gateway's resident memory, open file
//! descriptors, free request slots and idle draft workers are read. A request that is not a
//! leaver must complete (JSON parsed; a stream ending with `[DONE]`) within the hang bound;
//! anything else is counted as failed or hung. At the end, after a short quiet period, every
//! draft worker must be idle and, for the real target, no llama-server slot still processing
//! (a call left running after its client left), and the gateway's open file descriptors must be
//! back to what they were before the load. Flatness is judged from the end of the warm-up (the
//! first quarter, at most five minutes) to the end, on window means (see [`window_spread`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::{get, post};
use clap::builder::TypedValueParser as _;
use futures::StreamExt;
use rand::Rng;
use serde::Serialize;
use serde_json::{Value, json};

use super::servers::{self, Layout};
use approxy_setup::Home;

/// Which path to soak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoakPhase {
    /// Passthrough over a stub upstream, at a request rate.
    Passthrough,
    /// The approximate path over the real llama-server target, at a concurrency.
    Approximate,
}

/// Options for `approxy bench soak`.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakOptions {
    /// The path to soak.
    // `--phase` is `SoakArgs`'s: it can also name the attack mix, which is no soak.
    #[arg(skip = SoakPhase::Passthrough)]
    pub phase: SoakPhase,
    /// Passthrough: requests in all.
    #[arg(long, default_value_t = 100_000)]
    pub requests: u64,
    /// Passthrough: offered requests per second.
    #[arg(long, default_value_t = 500)]
    pub rate: u32,
    /// Approximate and attack: minutes.
    #[arg(long, default_value_t = 30.0)]
    pub minutes: f64,
    /// Approximate: concurrent clients (one draft worker each).
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Share of clients that leave at a random moment mid-request.
    #[arg(long, default_value_t = 0.1)]
    pub disconnect_share: f64,
    /// Seconds after which an open request counts as hung.
    #[arg(
        long,
        default_value = "120",
        value_parser = clap::value_parser!(u64).map(Duration::from_secs)
    )]
    pub hang_after: Duration,
    /// Results directory.
    #[arg(long, default_value = "tests/bench/results")]
    pub out: PathBuf,
}

/// One reading of the gateway's resources.
#[derive(Debug, Clone, Serialize)]
struct Sample {
    seconds: f64,
    rss_mib: f64,
    open_fds: usize,
    request_slots_free: Option<u64>,
    draft_workers_idle: Option<u64>,
    completed: u64,
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    disconnected: AtomicU64,
    failed: AtomicU64,
    hung: AtomicU64,
}

/// The stub's streamed answer: five chunks, 10 ms apart.
fn stub_stream() -> axum::response::Response {
    let chunks = futures::stream::iter(0..6).then(|i| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let line = if i < 5 {
            format!(
                "data: {}\n\n",
                json!({"id":"chatcmpl-stub","object":"chat.completion.chunk","created":1700000000,"model":"stub",
                       "choices":[{"index":0,"delta":{"content":"word "},"finish_reason":if i == 4 { Some("stop") } else { None }}]})
            )
        } else {
            "data: [DONE]\n\n".to_string()
        };
        Ok::<_, std::convert::Infallible>(line)
    });
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .body(axum::body::Body::from_stream(chunks))
        .unwrap_or_default()
}

pub(crate) async fn start_stub() -> anyhow::Result<String> {
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(|body: axum::body::Bytes| async move {
                let delay = rand::rng().random_range(5..50);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                let stream = serde_json::from_slice::<Value>(&body).ok().and_then(|v| v["stream"].as_bool()).unwrap_or(false);
                if stream {
                    stub_stream()
                } else {
                    axum::response::IntoResponse::into_response((
                        [("content-type", "application/json")],
                        r#"{"id":"chatcmpl-stub","object":"chat.completion","created":1700000000,"model":"stub","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}"#,
                    ))
                }
            }),
        )
        .route("/v1/models", get(|| async { r#"{"object":"list","data":[]}"# }))
        .route("/health", get(|| async { "ok" }))
        // The attack soak passes 4 MiB prompts through (axum's default limit is 2 MB).
        .layer(axum::extract::DefaultBodyLimit::max(8 << 20));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}

const PROMPTS: [&str; 6] = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash map is in two sentences.",
    "Write a function that reverses a linked list in Python.",
    "Give three tips for writing clear emails.",
    "Write a SQL query that counts orders per customer.",
    "What is the difference between a process and a thread?",
];

/// One client request: completes, leaves (when `leave_after` is set), fails or hangs.
async fn one_request(
    http: &reqwest::Client,
    url: &str,
    body: Value,
    stream: bool,
    leave_after: Option<Duration>,
    hang_after: Duration,
    counts: &Counts,
) {
    let work = async {
        let resp = http
            .post(format!("{url}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!(
                "{status}: {}",
                String::from_utf8_lossy(&bytes)
                    .chars()
                    .take(200)
                    .collect::<String>()
            ));
        }
        let text = String::from_utf8_lossy(&bytes);
        let complete = if stream {
            text.trim_end().ends_with("data: [DONE]") && !text.contains("\"error\"")
        } else {
            serde_json::from_slice::<Value>(&bytes)
                .is_ok_and(|v| v["choices"][0]["message"].is_object())
        };
        if complete {
            Ok(())
        } else {
            Err(format!(
                "incomplete answer: {}",
                text.chars().take(200).collect::<String>()
            ))
        }
    };
    if let Some(after) = leave_after {
        // Dropping the request future closes its connection: the client is gone.
        if tokio::time::timeout(after, work).await.is_err() {
            counts.disconnected.fetch_add(1, Ordering::Relaxed);
            return;
        }
        counts.ok.fetch_add(1, Ordering::Relaxed);
        return;
    }
    match tokio::time::timeout(hang_after, work).await {
        Ok(Ok(())) => counts.ok.fetch_add(1, Ordering::Relaxed),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "soak request failed");
            counts.failed.fetch_add(1, Ordering::Relaxed)
        }
        Err(_) => counts.hung.fetch_add(1, Ordering::Relaxed),
    };
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

async fn ready(http: &reqwest::Client, url: &str) -> Value {
    match http.get(format!("{url}/ready")).send().await {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

async fn sample(
    http: &reqwest::Client,
    url: &str,
    pid: u32,
    started: Instant,
    counts: &Counts,
) -> Sample {
    let r = ready(http, url).await;
    Sample {
        seconds: started.elapsed().as_secs_f64(),
        rss_mib: servers::rss_bytes(pid).unwrap_or(0) as f64 / (1024.0 * 1024.0),
        open_fds: open_fds(pid),
        request_slots_free: r["request_slots_free"].as_u64(),
        draft_workers_idle: r["draft_workers_idle"].as_u64(),
        completed: counts.ok.load(Ordering::Relaxed) + counts.disconnected.load(Ordering::Relaxed),
    }
}

/// Spread of a series after warm-up, between the means of eight consecutive windows:
/// (max - min) / min. Window means, because single readings under load move with the number
/// of requests in flight at that instant (each holds connections and a slot); a leak shows as
/// a trend across windows.
pub(crate) fn window_spread(values: &[f64]) -> f64 {
    let n = values.len();
    if n < 8 {
        return spread(values);
    }
    let means: Vec<f64> = (0..8)
        .map(|w| {
            let part = &values[w * n / 8..(w + 1) * n / 8];
            part.iter().sum::<f64>() / part.len().max(1) as f64
        })
        .collect();
    spread(&means)
}

/// Spread of readings: (max - min) / min.
fn spread(values: &[f64]) -> f64 {
    let (min, max) = values
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    if values.is_empty() || min <= 0.0 {
        0.0
    } else {
        (max - min) / min
    }
}

/// Runs the soak and writes its report; fails when a goal is missed.
pub async fn run(opts: &SoakOptions) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let logs = home.log("soak").with_extension("d");
    std::fs::create_dir_all(&logs)?;
    let dir = tempfile_dir()?;
    let (policy, target) = soak_policy(opts, &home, &logs).await?;
    let (gateway, pid) = gateway_with(&policy, &dir.join("soak-policy.toml"), &logs).await?;
    let load = Load {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .build()?,
        url: gateway.url.clone(),
        pid,
        counts: Arc::new(Counts::default()),
    };
    let fds_before = open_fds(pid);
    let started = Instant::now();
    let mut samples = drive_load(opts, &load, started).await;
    let elapsed = started.elapsed().as_secs_f64();
    samples.push(load.sample(started).await);
    // Quiet: whatever a leaver started must have stopped by now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = ready(&load.http, &load.url).await;
    let slots_processing = target_slots_processing(&load.http, target.as_ref()).await;
    let spreads = Spreads::after_warm_up(&samples, elapsed);
    // The load's keep-alive connections (client to gateway, and the gateway's pool to the
    // target, idle-closed after 4 s) go once the clients have closed theirs; what stays is a leak.
    let Load { http, counts, .. } = load;
    drop(http);
    let (fds_after, fds_settle_seconds) = settle_fds(pid, fds_before).await;
    let end = SoakEnd {
        elapsed,
        spreads,
        fds_before,
        fds_after,
        fds_settle_seconds,
        after,
        slots_processing,
        counts: &counts,
    };
    let (file, pass) = write_report(opts, &end, samples)?;
    println!("report: {}", file.display());
    drop(gateway);
    drop(target);
    if pass {
        Ok(())
    } else {
        anyhow::bail!("the soak missed a goal (see {})", file.display())
    }
}

/// The policy the gateway serves for `opts.phase`, and the target it needs started (the real
/// llama-server for the approximate path; the stub runs inside this process).
async fn soak_policy(
    opts: &SoakOptions,
    home: &Home,
    logs: &std::path::Path,
) -> anyhow::Result<(String, Option<servers::Server>)> {
    Ok(match opts.phase {
        SoakPhase::Passthrough => {
            let stub = start_stub().await?;
            (
                format!(
                    "# Written by `approxy bench soak`.\n[target]\nkind = \"openai\"\nbase_url = \"{stub}/v1\"\ntimeout = \"30s\"\nretries = 0\n\n\
                     [gateway]\nauth = \"none\"\nmax_concurrent_requests = 1024\n\n[models.\"*\"]\nmode = \"passthrough\"\n"
                ),
                None,
            )
        }
        SoakPhase::Approximate => {
            let llama = servers::start_llama(home, Layout::Shared, false, logs).await?;
            let text = std::fs::read_to_string(home_repo_policy()?)?;
            let text = text.replace(
                "base_url = \"http://127.0.0.1:8081\"",
                &format!("base_url = \"{}\"", llama.url),
            );
            let text = text.replace("workers = 1", &format!("workers = {}", opts.concurrency));
            let text = text.replace("threads_per_worker = 2", "threads_per_worker = 1");
            (text, Some(llama))
        }
    })
}

/// The soak's client side: one connection pool to the gateway at `url` (process `pid`) and the
/// outcome counts every request adds to.
struct Load {
    http: reqwest::Client,
    url: String,
    pid: u32,
    counts: Arc<Counts>,
}

impl Load {
    /// One reading of the gateway's resources, `started` being the start of the load.
    async fn sample(&self, started: Instant) -> Sample {
        sample(&self.http, &self.url, self.pid, started, &self.counts).await
    }
}

/// Offers the phase's load (a rate for passthrough, a concurrency for approximate), reading the
/// gateway's resources every few seconds, and waits for every request to end.
async fn drive_load(opts: &SoakOptions, load: &Load, started: Instant) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut next_sample = Duration::ZERO;
    let sample_every = match opts.phase {
        SoakPhase::Passthrough => Duration::from_secs(2),
        SoakPhase::Approximate => Duration::from_secs(10),
    };
    let mut tasks = tokio::task::JoinSet::new();
    let model = match opts.phase {
        SoakPhase::Passthrough => "stub",
        SoakPhase::Approximate => "qwen2.5-coder-1.5b-instruct",
    };
    let make = {
        let (share, hang) = (opts.disconnect_share, opts.hang_after);
        let (http, url, counts) = (
            load.http.clone(),
            load.url.clone(),
            Arc::clone(&load.counts),
        );
        let phase = opts.phase;
        move |i: u64| {
            let mut rng = rand::rng();
            let stream = rng.random_bool(0.5);
            let leave = rng.random_bool(share).then(|| match phase {
                SoakPhase::Passthrough => Duration::from_millis(rng.random_range(1..60)),
                SoakPhase::Approximate => Duration::from_millis(rng.random_range(10..4000)),
            });
            let max_tokens = if phase == SoakPhase::Approximate {
                48
            } else {
                16
            };
            let body = json!({"model": model, "messages": [{"role": "user", "content": PROMPTS[(i as usize) % PROMPTS.len()]}],
                              "max_tokens": max_tokens, "stream": stream});
            let (http, url, counts) = (http.clone(), url.clone(), Arc::clone(&counts));
            async move { one_request(&http, &url, body, stream, leave, hang, &counts).await }
        }
    };
    match opts.phase {
        SoakPhase::Passthrough => {
            let mut tick =
                tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(opts.rate.max(1))));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            for i in 0..opts.requests {
                tick.tick().await;
                tasks.spawn(make(i));
                while tasks.try_join_next().is_some() {}
                if started.elapsed() >= next_sample {
                    samples.push(load.sample(started).await);
                    next_sample += sample_every;
                }
            }
        }
        SoakPhase::Approximate => {
            let until = Duration::from_secs_f64(opts.minutes * 60.0);
            let mut i = 0;
            while started.elapsed() < until {
                while tasks.len() < opts.concurrency {
                    tasks.spawn(make(i));
                    i += 1;
                }
                let _ = tokio::time::timeout(Duration::from_millis(500), tasks.join_next()).await;
                if started.elapsed() >= next_sample {
                    samples.push(load.sample(started).await);
                    next_sample += sample_every;
                }
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    samples
}

/// How many llama-server slots are still processing (a call left running after its client
/// left); `None` without a real target or when it does not answer.
async fn target_slots_processing(
    http: &reqwest::Client,
    target: Option<&servers::Server>,
) -> Option<usize> {
    let slots_processing = match target {
        Some(t) => http
            .get(format!("{}/slots", t.url))
            .send()
            .await
            .ok()
            .map(|r| async { r.json::<Value>().await.ok() }),
        None => None,
    };
    match slots_processing {
        Some(f) => f.await.and_then(|v| {
            v.as_array().map(|a| {
                a.iter()
                    .filter(|s| s["is_processing"].as_bool() == Some(true))
                    .count()
            })
        }),
        None => None,
    }
}

/// The flatness of the resources after the warm-up: window-mean spreads, and single-reading
/// spreads for reference.
struct Spreads {
    warm: f64,
    rss: f64,
    fds: f64,
    slots: f64,
    raw: Value,
}

impl Spreads {
    /// Judges `samples` from the end of the warm-up (a quarter of `elapsed`, at most 300 s).
    fn after_warm_up(samples: &[Sample], elapsed: f64) -> Self {
        let warm = (elapsed / 4.0).min(300.0);
        let steady: Vec<&Sample> = samples.iter().filter(|s| s.seconds >= warm).collect();
        let series = |f: &dyn Fn(&Sample) -> f64| steady.iter().map(|s| f(s)).collect::<Vec<f64>>();
        let rss = window_spread(&series(&|s| s.rss_mib));
        let fds = window_spread(&series(&|s| s.open_fds as f64));
        let slots = window_spread(&series(&|s| s.request_slots_free.unwrap_or(0) as f64));
        let raw = json!({
            "rss": spread(&series(&|s| s.rss_mib)),
            "open_fds": spread(&series(&|s| s.open_fds as f64)),
            "request_slots_free": spread(&series(&|s| s.request_slots_free.unwrap_or(0) as f64)),
        });
        Self {
            warm,
            rss,
            fds,
            slots,
            raw,
        }
    }
}

/// Waits up to a minute for the gateway's open file descriptors to come back within 10 % of
/// `fds_before`; the count at the end and the seconds waited.
async fn settle_fds(pid: u32, fds_before: usize) -> (usize, f64) {
    let settle = Instant::now();
    let mut fds_after = open_fds(pid);
    while fds_after > fds_before + fds_before / 10 && settle.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        fds_after = open_fds(pid);
    }
    (fds_after, settle.elapsed().as_secs_f64())
}

/// What the soak found once the load was over and the gateway quiet.
struct SoakEnd<'a> {
    elapsed: f64,
    spreads: Spreads,
    fds_before: usize,
    fds_after: usize,
    fds_settle_seconds: f64,
    /// The gateway's `/ready` answer.
    after: Value,
    slots_processing: Option<usize>,
    counts: &'a Counts,
}

/// A soak's end in the report's terms: the requests by outcome, and the gateway's draft workers
/// and request slots once it was quiet.
#[derive(Clone, Copy)]
struct Totals {
    ok: u64,
    gone: u64,
    failed: u64,
    hung: u64,
    workers: Option<u64>,
    workers_idle_after: Option<u64>,
    slots_free_after: Option<u64>,
}

impl Totals {
    fn of(end: &SoakEnd<'_>) -> Self {
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Self {
            ok: c(&end.counts.ok),
            gone: c(&end.counts.disconnected),
            failed: c(&end.counts.failed),
            hung: c(&end.counts.hung),
            workers: end.after["draft_workers"].as_u64(),
            workers_idle_after: end.after["draft_workers_idle"].as_u64(),
            slots_free_after: end.after["request_slots_free"].as_u64(),
        }
    }
}

/// Judges the soak, writes its JSON report and prints its summary line; the report's path and
/// whether every goal was met.
fn write_report(
    opts: &SoakOptions,
    end: &SoakEnd<'_>,
    samples: Vec<Sample>,
) -> anyhow::Result<(PathBuf, bool)> {
    let t = Totals::of(end);
    let pass = passed(end, &t);
    let report = report_json(opts, end, &t, pass, samples);
    std::fs::create_dir_all(&opts.out)?;
    let file = opts.out.join(format!(
        "soak-{}.json",
        report["phase"].as_str().unwrap_or("run")
    ));
    std::fs::write(&file, serde_json::to_string_pretty(&report)? + "\n")?;
    print_summary(&report, end, &t, pass);
    Ok((file, pass))
}

/// Whether every goal was met: nothing failed or hung, memory, descriptors and slots held
/// steady after the warm-up, and the gateway came back to quiet.
fn passed(end: &SoakEnd<'_>, t: &Totals) -> bool {
    t.failed == 0
        && t.hung == 0
        && end.spreads.rss <= 0.10
        && end.spreads.fds <= 0.10
        && end.spreads.slots <= 0.10
        && end.fds_after <= end.fds_before + end.fds_before / 10
        && t.workers_idle_after == t.workers
        && t.slots_free_after.is_some()
        && end.slots_processing.unwrap_or(0) == 0
}

/// The soak's JSON report.
fn report_json(
    opts: &SoakOptions,
    end: &SoakEnd<'_>,
    t: &Totals,
    pass: bool,
    samples: Vec<Sample>,
) -> Value {
    let Totals {
        ok,
        gone,
        failed,
        hung,
        workers,
        workers_idle_after,
        slots_free_after,
    } = *t;
    let SoakEnd {
        elapsed,
        fds_before,
        fds_after,
        fds_settle_seconds,
        slots_processing,
        ..
    } = *end;
    let (warm, rss_spread, fd_spread, slots_spread) = (
        end.spreads.warm,
        end.spreads.rss,
        end.spreads.fds,
        end.spreads.slots,
    );
    json!({
        "benchmark": "soak",
        "phase": match opts.phase { SoakPhase::Passthrough => "passthrough", SoakPhase::Approximate => "approximate" },
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "cpu": cpu_model(),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "seconds": elapsed,
        "offered_rate": if opts.phase == SoakPhase::Passthrough { json!(opts.rate) } else { Value::Null },
        "concurrency": if opts.phase == SoakPhase::Approximate { json!(opts.concurrency) } else { Value::Null },
        "requests": ok + gone + failed + hung,
        "completed": ok,
        "disconnected_by_client": gone,
        "failed": failed,
        "hung": hung,
        "achieved_rate": (ok + gone + failed + hung) as f64 / elapsed,
        "warm_up_seconds": warm,
        "rss_spread_after_warm_up": rss_spread,
        "open_fds_spread_after_warm_up": fd_spread,
        "request_slots_free_spread_after_warm_up": slots_spread,
        "single_reading_spreads_after_warm_up": end.spreads.raw,
        "open_fds_quiet_before": fds_before,
        "open_fds_quiet_after": fds_after,
        "open_fds_settle_seconds": fds_settle_seconds,
        "draft_workers": workers,
        "draft_workers_idle_after": workers_idle_after,
        "request_slots_free_after": slots_free_after,
        "target_slots_processing_after": slots_processing,
        "pass": pass,
        "samples": samples,
    })
}

/// The soak's one-line summary on stdout.
fn print_summary(report: &Value, end: &SoakEnd<'_>, t: &Totals, pass: bool) {
    let Totals {
        ok,
        gone,
        failed,
        hung,
        workers,
        workers_idle_after,
        ..
    } = *t;
    let SoakEnd {
        elapsed,
        fds_before,
        fds_after,
        slots_processing,
        ..
    } = *end;
    let (warm, rss_spread, fd_spread, slots_spread) = (
        end.spreads.warm,
        end.spreads.rss,
        end.spreads.fds,
        end.spreads.slots,
    );
    println!(
        "{}: {} requests in {:.0} s ({:.0}/s), {ok} completed, {gone} left by their client, {failed} failed, {hung} hung; \
         RSS spread {:.1} %, fds spread {:.1} %, free slots spread {:.1} % after {:.0} s (window means); fds quiet {fds_before} before, {fds_after} after; idle draft workers after {:?} of {:?}; target slots still processing {:?}: {}",
        report["phase"].as_str().unwrap_or(""),
        ok + gone + failed + hung,
        elapsed,
        (ok + gone + failed + hung) as f64 / elapsed,
        rss_spread * 100.0,
        fd_spread * 100.0,
        slots_spread * 100.0,
        warm,
        workers_idle_after,
        workers,
        slots_processing,
        if pass { "PASS" } else { "FAIL" }
    );
}

/// `approxy serve` (this binary) with the policy `text`, written to `path`; and its pid.
pub(crate) async fn gateway_with(
    text: &str,
    path: &std::path::Path,
    logs: &std::path::Path,
) -> anyhow::Result<(servers::Server, u32)> {
    std::fs::write(path, text)?;
    let exe = std::env::current_exe()?;
    let gateway = servers::start_gateway(&exe, path, Layout::Shared, logs).await?;
    let pid = gateway
        .pid()
        .ok_or_else(|| anyhow::anyhow!("gateway has no pid"))?;
    Ok((gateway, pid))
}

pub(crate) fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("approxy-soak-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// The shipped default policy, from the repository this binary was built in.
fn home_repo_policy() -> anyhow::Result<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../policies/default.toml");
    if p.is_file() {
        Ok(p)
    } else {
        anyhow::bail!("policies/default.toml not found at {}", p.display())
    }
}

pub(crate) fn cpu_model() -> String {
    approxy_setup::cpu::CpuFeatures::this_machine().model
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_relative_to_the_smallest() {
        assert!((spread(&[100.0, 105.0, 110.0]) - 0.10).abs() < 1e-9);
        assert_eq!(spread(&[]), 0.0);
    }
}
