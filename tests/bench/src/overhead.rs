//! `approxy bench overhead`: what the gateway adds in passthrough mode. A stub upstream that
//! answers a chat completion at once is loaded by `oha` at fixed request rates, open loop with
//! latency corrected for coordinated omission (each request timed from when it was due, so a
//! stall counts against every request it delayed), first directly and then through
//! `approxy serve`; the difference in latency quantiles is the gateway's cost. Then an unthrottled run finds the rate it sustains, and the gateway's
//! resident memory is read from `/proc`. With two cores or more the gateway gets core 1 to
//! itself and the load generator and stub share core 0, so the gateway's cost is not mixed
//! up with theirs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::machine::Machine;
use super::servers::{self, Layout};
use approxy_setup::Home;

/// Options for `approxy bench overhead`.
#[derive(Debug, Clone, clap::Args)]
pub struct OverheadOptions {
    /// Offered request rates, comma-separated.
    #[arg(long, default_value = "100,500,1000,2000", value_delimiter = ',')]
    pub rates: Vec<u32>,
    /// Seconds per rate.
    #[arg(long, default_value_t = 10)]
    pub seconds: u32,
    /// Concurrent connections.
    // oha's: at a fixed rate, the most requests in flight.
    #[arg(long, default_value_t = 50)]
    pub connections: u32,
    /// Results directory.
    #[arg(long, default_value = "tests/bench/results")]
    pub out: PathBuf,
}

/// One load run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Load {
    /// Responses received.
    pub requests: usize,
    /// Non-200 responses and transport errors.
    pub errors: usize,
    /// Requests per second completed.
    pub achieved_rps: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// Mean latency, ms.
    pub mean_ms: f64,
}

/// One offered rate, direct and through the gateway.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RateRun {
    /// Offered req/s (0 = unthrottled).
    pub rate: u32,
    /// Straight to the stub.
    pub direct: Load,
    /// Through approxy.
    pub gateway: Load,
    /// Gateway p50 minus direct p50, ms.
    pub added_p50_ms: f64,
    /// Gateway p99 minus direct p99, ms.
    pub added_p99_ms: f64,
}

/// Everything `overhead.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OverheadReport {
    /// When (UTC).
    pub generated_at: String,
    /// Where.
    pub machine: Machine,
    /// Load generator and version.
    pub load_generator: String,
    /// Gateway on a core of its own (load generator and stub on another).
    pub pinned: bool,
    /// Seconds per rate.
    pub seconds_per_rate: u32,
    /// Connections.
    pub connections: u32,
    /// Fixed-rate runs.
    pub rates: Vec<RateRun>,
    /// The unthrottled run.
    pub max: RateRun,
    /// Gateway resident memory once started, MiB.
    pub rss_after_start_mib: f64,
    /// Gateway peak resident memory over the whole benchmark (its high-water mark, at least
    /// the memory read after start), MiB.
    pub peak_rss_mib: f64,
}

/// The stub's answer: a typical small chat completion.
const STUB_BODY: &str = r#"{"id":"chatcmpl-stub","object":"chat.completion","created":1700000000,"model":"stub","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21}}"#;

/// The request every run sends.
const REQUEST_BODY: &str =
    r#"{"model":"stub","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}"#;

pub(crate) async fn start_stub() -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(|| async { ([("content-type", "application/json")], STUB_BODY) }),
        )
        .route(
            "/v1/models",
            get(|| async {
                (
                    [("content-type", "application/json")],
                    r#"{"object":"list","data":[]}"#,
                )
            }),
        )
        .route("/health", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "stub upstream stopped");
        }
    });
    Ok((url, task))
}

fn passthrough_policy(stub: &str) -> String {
    format!(
        "# Written by `approxy bench overhead`.\n[target]\nkind = \"openai\"\nbase_url = \"{stub}/v1\"\ntimeout = \"30s\"\nretries = 0\n\n\
         [gateway]\nauth = \"none\"\nmax_concurrent_requests = 1024\n\n[draft]\nworkers = 1\nthreads_per_worker = 1\n\n[models.\"*\"]\nmode = \"passthrough\"\n"
    )
}

/// Reads oha's JSON report (`--output-format json`): latencies in seconds, status codes
/// counted, transport errors (timeouts, resets) by message. The quantiles cover every answer,
/// errors included; a run with errors says so in its own column.
pub fn parse_oha_json(json: &str, seconds: f64) -> anyhow::Result<Load> {
    let v: serde_json::Value = serde_json::from_str(json).context("oha's report is not JSON")?;
    let count = |m: &serde_json::Value| -> u64 {
        m.as_object()
            .map(|o| o.values().filter_map(serde_json::Value::as_u64).sum())
            .unwrap_or(0)
    };
    let codes = &v["statusCodeDistribution"];
    let ok = codes["200"].as_u64().unwrap_or(0);
    let not_ok = count(codes) - ok;
    let failed = count(&v["errorDistribution"]);
    let ms = |q: &str| v["latencyPercentiles"][q].as_f64().unwrap_or(0.0) * 1e3;
    let requests = usize::try_from(ok + not_ok + failed)?;
    Ok(Load {
        requests,
        errors: usize::try_from(not_ok + failed)?,
        achieved_rps: requests as f64 / seconds.max(1e-9),
        p50_ms: ms("p50"),
        p99_ms: ms("p99"),
        mean_ms: v["summary"]["average"].as_f64().unwrap_or(0.0) * 1e3,
    })
}

/// Core the load generator and the stub run on when the gateway has one of its own.
const LOAD_CORE: &str = "0";

/// Pins every thread of this process (the stub) to [`LOAD_CORE`].
async fn pin_self() -> bool {
    tokio::process::Command::new("taskset")
        .args(["-a", "-p", "-c", LOAD_CORE, &std::process::id().to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

async fn oha(
    bin: &Path,
    url: &str,
    rate: u32,
    seconds: u32,
    connections: u32,
    body: &Path,
    pinned: bool,
) -> anyhow::Result<Load> {
    let mut cmd = servers::command(bin, pinned.then_some(LOAD_CORE));
    cmd.args([
        "-z",
        &format!("{seconds}s"),
        "-c",
        &connections.to_string(),
        "-m",
        "POST",
        "-T",
        "application/json",
        "-t",
        "10s",
        "--no-tui",
        "--output-format",
        "json",
        // Requests still out at the end are waited for, not counted as failures.
        "--wait-ongoing-requests-after-deadline",
        // One thread: the load core is shared with the stub.
        "--worker-threads",
        "1",
    ]);
    if rate > 0 {
        cmd.args(["-q", &rate.to_string(), "--latency-correction"]);
    }
    cmd.arg("-D").arg(body).arg(url);
    let out = cmd
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running {}", bin.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "oha failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_oha_json(&String::from_utf8_lossy(&out.stdout), f64::from(seconds))
}

async fn both(
    bin: &Path,
    direct: &str,
    gateway: &str,
    rate: u32,
    opts: &OverheadOptions,
    body: &Path,
    pinned: bool,
) -> anyhow::Result<RateRun> {
    let d = oha(
        bin,
        direct,
        rate,
        opts.seconds,
        opts.connections,
        body,
        pinned,
    )
    .await?;
    let g = oha(
        bin,
        gateway,
        rate,
        opts.seconds,
        opts.connections,
        body,
        pinned,
    )
    .await?;
    tracing::info!(
        rate,
        direct_p99_ms = d.p99_ms,
        gateway_p99_ms = g.p99_ms,
        gateway_rps = g.achieved_rps,
        errors = g.errors,
        "rate done"
    );
    Ok(RateRun {
        rate,
        added_p50_ms: g.p50_ms - d.p50_ms,
        added_p99_ms: g.p99_ms - d.p99_ms,
        direct: d,
        gateway: g,
    })
}

/// Runs the benchmark; writes `overhead.json` and `overhead.md` under `out`.
pub async fn run(opts: &OverheadOptions) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let bin = {
        let home = home.clone();
        tokio::task::spawn_blocking(move || approxy_setup::ensure_oha(&home)).await??
    };
    let exe = std::env::current_exe()?;
    let work = home.work("bench-overhead");
    std::fs::create_dir_all(&work)?;
    let body = work.join("request.json");
    std::fs::write(&body, REQUEST_BODY)?;
    // Read before pinning: afterwards this process sees one core.
    let machine = Machine::read();
    let pinned = machine.cores >= 2 && pin_self().await;
    let layout = if pinned {
        Layout::Pinned
    } else {
        Layout::Shared
    };
    let (stub, stub_task) = start_stub().await?;
    let policy = work.join("policy.toml");
    std::fs::write(&policy, passthrough_policy(&stub))?;
    let gateway = servers::start_gateway(
        &exe,
        &policy,
        layout,
        &home.log("bench").with_extension("d"),
    )
    .await?;
    let pid = gateway.pid().context("gateway has no pid")?;
    let rss_after_start = servers::rss_bytes(pid).unwrap_or(0);
    let direct_url = format!("{stub}/v1/chat/completions");
    let gateway_url = format!("{}/v1/chat/completions", gateway.url);
    // Warm both paths (connection pools, lazy initialisation) before anything is measured.
    oha(&bin, &direct_url, 200, 2, opts.connections, &body, pinned).await?;
    oha(&bin, &gateway_url, 200, 2, opts.connections, &body, pinned).await?;
    let mut rates = Vec::new();
    for &rate in &opts.rates {
        rates.push(both(&bin, &direct_url, &gateway_url, rate, opts, &body, pinned).await?);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let max = both(&bin, &direct_url, &gateway_url, 0, opts, &body, pinned).await?;
    // The kernel raises its high-water mark lazily (on unmaps, not when an allocator gives pages
    // back with madvise, as mimalloc does), so it can read a little under an earlier RSS.
    let peak = servers::peak_rss_bytes(pid)
        .unwrap_or(0)
        .max(rss_after_start);
    gateway.stop().await;
    stub_task.abort();
    let mib = |b: u64| b as f64 / 1024.0 / 1024.0;
    let report = OverheadReport {
        generated_at: super::machine::utc_now(),
        machine,
        load_generator: format!(
            "oha {} (crates.io), open loop with latency correction at fixed rates",
            approxy_setup::assets::OHA_CRATE.1
        ),
        seconds_per_rate: opts.seconds,
        connections: opts.connections,
        pinned,
        rates,
        max,
        rss_after_start_mib: mib(rss_after_start),
        peak_rss_mib: mib(peak),
    };
    std::fs::create_dir_all(&opts.out)?;
    std::fs::write(
        opts.out.join("overhead.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    std::fs::write(opts.out.join("overhead.md"), overhead_markdown(&report))?;
    println!("{}", opts.out.join("overhead.md").display());
    Ok(())
}

/// The Markdown for `overhead.md`.
pub fn overhead_markdown(r: &OverheadReport) -> String {
    let mut s = format!(
        "`approxy serve` in passthrough mode in front of a stub upstream that answers at once; load from {}, {} s per rate, {} connections; \
         {}. Measured {} on {}.\n\n",
        r.load_generator,
        r.seconds_per_rate,
        r.connections,
        if r.pinned {
            "the gateway runs alone on core 1, the load generator and the stub share core 0 (in both the direct and the gateway runs)"
        } else {
            "the load generator, the stub and the gateway share the machine's cores"
        },
        r.generated_at,
        r.machine.line(),
    );
    s.push_str("| offered rate (req/s) | achieved via gateway | errors | stub p50 | stub p99 | gateway p50 | gateway p99 | added p50 | added p99 |\n|---|---|---|---|---|---|---|---|---|\n");
    for x in &r.rates {
        s.push_str(&format!(
            "| {} | {:.0} | {} | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms |\n",
            x.rate, x.gateway.achieved_rps, x.gateway.errors, x.direct.p50_ms, x.direct.p99_ms, x.gateway.p50_ms, x.gateway.p99_ms, x.added_p50_ms, x.added_p99_ms
        ));
    }
    s.push_str(&format!(
        "\nUnthrottled ({} connections): {:.0} req/s through the gateway with {} errors ({:.0} req/s straight to the stub). \
         Gateway memory: {:.0} MiB resident after start-up (a passthrough-only policy never starts the ONNX draft), peak {:.0} MiB under load.\n",
        r.connections, r.max.gateway.achieved_rps, r.max.gateway.errors, r.max.direct.achieved_rps, r.rss_after_start_mib, r.peak_rss_mib
    ));
    let at_1000 = r.rates.iter().find(|x| x.rate == 1000);
    if let Some(x) = at_1000 {
        s.push_str(&format!(
            "\nGoal (added p99 under 1 ms at 1,000 req/s): {} ({:.3} ms).\n",
            if x.added_p99_ms < 1.0 && x.gateway.errors == 0 {
                "met"
            } else {
                "not met"
            },
            x.added_p99_ms
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oha_json_counts_errors_and_quantiles() {
        // Shaped as oha 1.16 writes it (fields the parser does not read left out).
        let json = r#"{"summary": {"successRate": 0.97, "average": 0.002},
            "latencyPercentiles": {"p50": 0.0015, "p99": 0.0120},
            "statusCodeDistribution": {"200": 97, "502": 1},
            "errorDistribution": {"connection reset": 2}}"#;
        let l = parse_oha_json(json, 2.0).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(l.requests, 100);
        assert_eq!(l.errors, 3);
        assert!((l.achieved_rps - 50.0).abs() < 1e-9);
        assert!((l.p50_ms - 1.5).abs() < 1e-9);
        assert!((l.p99_ms - 12.0).abs() < 1e-9);
        assert!((l.mean_ms - 2.0).abs() < 1e-9);
        assert!(parse_oha_json("not json", 1.0).is_err());
    }
}
