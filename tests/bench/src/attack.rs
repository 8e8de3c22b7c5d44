//! `approxy bench soak --phase attack`: the gateway under attack while normal clients use it.
//! For `--minutes`, in parallel:
//!
//! - 300 idle connections (from 127.0.0.2 and 127.0.0.3, 150 each, below the per-address cap):
//!   a third send nothing, a third one byte, a third the HTTP/2 preface; each reconnects as soon
//!   as the gateway closes it, and the time to that close is recorded;
//! - 64 promised-but-slow bodies (from 127.0.0.4): request headers declaring a 4 MiB body, a
//!   byte of it, then half trickle a byte every 4 s and half stall; each expects a 408 within
//!   the body deadlines and reconnects (on a budget charged for promises, these once made
//!   every other POST a 429);
//! - 8 clients sending 4 MiB prompts (from 127.0.0.5), one after another: `"ab " * 1398000`,
//!   `max_tokens` 4, to a model the policy answers approximately, so each is parsed, rendered
//!   and tokenized by the gateway (tokenized whole, each once took hundreds of MB);
//! - 20 normal streaming clients (from 127.0.0.1), one request after another.
//!
//! The upstream is the soak's stub (OpenAI's chat completions wire format), so what is measured
//! is the gateway's own handling, not a 2-core target's speed. The gateway runs the shipped
//! defaults for every connection and body limit, with the real draft loaded. The stub says
//! nothing of its context; the policy gives it 65,536 positions, so a 4 MiB prompt is not refused
//! on its length alone and the tokenizer runs (and stops past approxy's 30,000 tokens; the
//! prompt then passes through). Pass: every normal request answered (none refused with 429),
//! every attacker closed within its deadline (plus 3 s), every large prompt answered, the
//! gateway's resident memory at its peak under 1.5 GiB and, once the clients stop, back within
//! 10 % of where it started.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use super::servers;
use super::soak::{cpu_model, gateway_with, start_stub, tempfile_dir};
use approxy_setup::Home;

/// Options for the attack soak.
#[derive(Debug, Clone)]
pub struct AttackOptions {
    /// How long.
    pub minutes: f64,
    /// Where the JSON report goes.
    pub out: PathBuf,
}

const IDLE: usize = 300;
const SLOW: usize = 64;
const LARGE: usize = 8;
const NORMAL: usize = 20;
/// What a promised-but-slow body declares: the shipped `max_body_bytes`.
const PROMISED: usize = 4 << 20;
/// The large prompts' text (4,194,000 bytes), as the probe sent it.
const LARGE_REPEAT: usize = 1_398_000;
/// Goals: peak resident memory, and how near its start it must end.
const PEAK_RSS_MIB: f64 = 1536.0;
const BACK_WITHIN: f64 = 0.10;
/// The shipped defaults the deadlines are judged against (`gateway.header_timeout`,
/// `body_idle_timeout`, `body_timeout`).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const BODY_IDLE: Duration = Duration::from_secs(10);
const BODY_TOTAL: Duration = Duration::from_secs(30);
/// How much later than its deadline a close may come (scheduling on a loaded 2-core machine).
const SLACK: Duration = Duration::from_secs(3);

#[derive(Default)]
struct Tally {
    normal_ok: AtomicU64,
    normal_429: AtomicU64,
    normal_failed: AtomicU64,
    idle_closed: AtomicU64,
    idle_late: AtomicU64,
    idle_longest_ms: AtomicU64,
    slow_408: AtomicU64,
    slow_other: AtomicU64,
    slow_late: AtomicU64,
    slow_longest_ms: AtomicU64,
    large_ok: AtomicU64,
    large_failed: AtomicU64,
    large_longest_ms: AtomicU64,
}

fn longest(slot: &AtomicU64, d: Duration) {
    slot.fetch_max(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

async fn connect_from(from: [u8; 4], to: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::from((from, 0)))?;
    s.connect(to).await
}

/// Reads until the peer closes (end of stream or reset), at most `limit`; what it sent, and
/// whether it closed.
async fn read_until_closed(s: &mut tokio::net::TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (got, closed)
}

async fn idle_attacker(i: usize, to: SocketAddr, stop: Arc<AtomicBool>, t: Arc<Tally>) {
    let from = [127, 0, 0, 2 + (i % 2) as u8];
    let opening: &[u8] = match i % 3 {
        0 => b"",
        1 => b"P",
        _ => b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    };
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = connect_from(from, to).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let opened = Instant::now();
        let _ = s.write_all(opening).await;
        let (_, closed) = read_until_closed(&mut s, HEADER_TIMEOUT + SLACK * 4).await;
        let took = opened.elapsed();
        if closed {
            t.idle_closed.fetch_add(1, Ordering::Relaxed);
            longest(&t.idle_longest_ms, took);
        }
        if !closed || took > HEADER_TIMEOUT + SLACK {
            t.idle_late.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn slow_body_client(i: usize, to: SocketAddr, stop: Arc<AtomicBool>, t: Arc<Tally>) {
    let trickle = i.is_multiple_of(2);
    let deadline = if trickle { BODY_TOTAL } else { BODY_IDLE } + SLACK;
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = connect_from([127, 0, 0, 4], to).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {PROMISED}\r\n\r\n{{"
        );
        if s.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        let sent = Instant::now();
        let (got, closed) = if trickle {
            trickle_until_closed(s, deadline + SLACK * 4).await
        } else {
            read_until_closed(&mut s, deadline + SLACK * 4).await
        };
        let took = sent.elapsed();
        if got.starts_with(b"HTTP/1.1 408") {
            t.slow_408.fetch_add(1, Ordering::Relaxed);
            longest(&t.slow_longest_ms, took);
        } else {
            t.slow_other.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(answer = %String::from_utf8_lossy(&got).chars().take(120).collect::<String>(), "slow-body client: not a 408");
        }
        if !closed || took > deadline {
            t.slow_late.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Sends a byte of body every 4 s while reading until the peer closes, at most `limit`; what
/// it sent, and whether it closed.
async fn trickle_until_closed(s: tokio::net::TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let (mut rd, mut wr) = s.into_split();
    let drip = async {
        loop {
            tokio::time::sleep(Duration::from_secs(4)).await;
            if wr.write_all(b" ").await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    let closed = tokio::time::timeout(limit, async {
        tokio::select! {
            () = read => {},
            () = drip => {},
        }
    })
    .await
    .is_ok();
    (got, closed)
}

/// An HTTP client whose connections come from the loopback address `from`.
fn http_from(from: [u8; 4]) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .local_address(IpAddr::from(from))
        .build()
}

/// Sends 4 MiB prompts one after another; each must be answered (passed through once the
/// gateway's tokenizer stops past its limit) or refused with a 400, never fail otherwise.
async fn large_prompt_client(url: String, stop: Arc<AtomicBool>, t: Arc<Tally>) {
    let Ok(http) = http_from([127, 0, 0, 5]) else {
        t.large_failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let body = json!({"model": "large", "messages": [{"role": "user", "content": "ab ".repeat(LARGE_REPEAT)}],
                      "max_tokens": 4})
    .to_string();
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        let answer = http
            .post(format!("{url}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send();
        match tokio::time::timeout(Duration::from_secs(60), answer).await {
            Ok(Ok(r)) if r.status().is_success() || r.status().as_u16() == 400 => {
                let _ = r.bytes().await;
                t.large_ok.fetch_add(1, Ordering::Relaxed);
                longest(&t.large_longest_ms, sent.elapsed());
            }
            other => {
                tracing::warn!(?other, "large-prompt client: failed");
                t.large_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

async fn normal_client(url: String, stop: Arc<AtomicBool>, t: Arc<Tally>) {
    let Ok(http) = http_from([127, 0, 0, 1]) else {
        t.normal_failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let body = json!({"model": "stub", "messages": [{"role": "user", "content": "hello"}],
                      "max_tokens": 16, "stream": true});
    while !stop.load(Ordering::Relaxed) {
        let answer = async {
            let resp = http
                .post(format!("{url}/v1/chat/completions"))
                .json(&body)
                .send()
                .await?;
            let status = resp.status();
            let text = resp.text().await?;
            Ok::<_, reqwest::Error>((status, text))
        };
        match tokio::time::timeout(Duration::from_secs(60), answer).await {
            Ok(Ok((status, text)))
                if status.is_success() && text.trim_end().ends_with("data: [DONE]") =>
            {
                t.normal_ok.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Ok((status, _))) if status.as_u16() == 429 => {
                t.normal_429.fetch_add(1, Ordering::Relaxed);
            }
            other => {
                tracing::warn!(?other, "normal client: failed");
                t.normal_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Runs the attack soak and writes its report; fails when a goal is missed.
pub async fn run(opts: &AttackOptions) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let logs = home.log("soak-attack").with_extension("d");
    std::fs::create_dir_all(&logs)?;
    let stub = start_stub().await?;
    // The shipped defaults for every connection and body limit: only what the stub needs.
    // The large prompts' model is answered approximately (the draft is loaded and their
    // prompts tokenized); a chat-prefix target is sent text, so the stub needs no tokenizer.
    let policy = format!(
        "# Written by `approxy bench soak --phase attack`.\n[target]\nkind = \"chat_prefix\"\nprefix_style = \"prefix\"\nbase_url = \"{stub}/v1\"\ntimeout = \"30s\"\nretries = 0\ncontext_length = 65536\n\n\
         [gateway]\nauth = \"none\"\n\n[models.large]\nmode = \"approximate\"\nthreshold = 0.7\n\n[models.\"*\"]\nmode = \"passthrough\"\n"
    );
    let (gateway, pid) =
        gateway_with(&policy, &tempfile_dir()?.join("attack-policy.toml"), &logs).await?;
    let url = gateway.url.clone();
    let addr: SocketAddr = url.trim_start_matches("http://").parse()?;
    // Settled after start-up (the draft loaded and run once by the readiness check).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_start = rss_mib(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let mut tasks = spawn_clients(addr, &url, &stop, &tally);
    let started = Instant::now();
    let rss = watch_rss(pid, started, Duration::from_secs_f64(opts.minutes * 60.0)).await;
    stop.store(true, Ordering::Relaxed);
    // Attackers in the middle of a wait finish it within their deadline; normal clients
    // within their request.
    let drained = tokio::time::timeout(BODY_TOTAL + SLACK * 5, async {
        while tasks.join_next().await.is_some() {}
    })
    .await
    .is_ok();
    tasks.abort_all();
    let elapsed = started.elapsed().as_secs_f64();
    // Memory given back once the clients are gone (the allocator returns freed pages with a
    // delay).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let memory = Memory {
        start: rss_start,
        end: rss_mib(pid),
        samples: rss,
    };
    let (file, pass) = write_report(opts, elapsed, drained, memory, &tally)?;
    println!("report: {}", file.display());
    drop(gateway);
    if pass {
        Ok(())
    } else {
        anyhow::bail!("the attack soak missed a goal (see {})", file.display())
    }
}

/// Starts every client of the mix against the gateway at `addr` (`url`): idle attackers,
/// slow-body clients and normal streaming clients, all stopping once `stop` is set.
fn spawn_clients(
    addr: SocketAddr,
    url: &str,
    stop: &Arc<AtomicBool>,
    tally: &Arc<Tally>,
) -> tokio::task::JoinSet<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..IDLE {
        tasks.spawn(idle_attacker(i, addr, stop.clone(), tally.clone()));
    }
    for i in 0..SLOW {
        tasks.spawn(slow_body_client(i, addr, stop.clone(), tally.clone()));
    }
    for _ in 0..LARGE {
        tasks.spawn(large_prompt_client(
            url.to_owned(),
            stop.clone(),
            tally.clone(),
        ));
    }
    for _ in 0..NORMAL {
        tasks.spawn(normal_client(url.to_owned(), stop.clone(), tally.clone()));
    }
    tasks
}

fn rss_mib(pid: u32) -> f64 {
    servers::rss_bytes(pid).unwrap_or(0) as f64 / (1024.0 * 1024.0)
}

/// The gateway's resident memory, MiB: before the clients, every second while they run
/// (seconds, MiB), and after they stopped.
struct Memory {
    start: f64,
    end: f64,
    samples: Vec<(f64, f64)>,
}

/// Reads the gateway's resident memory every second until `until` after `started`: (seconds,
/// MiB). Every second, so that the peak of a burst is seen.
async fn watch_rss(pid: u32, started: Instant, until: Duration) -> Vec<(f64, f64)> {
    let mut rss = Vec::new();
    while started.elapsed() < until {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss.push((started.elapsed().as_secs_f64(), rss_mib(pid)));
    }
    rss
}

/// Judges the attack soak, writes its JSON report and prints its summary line; the report's
/// path and whether every goal was met.
fn write_report(
    opts: &AttackOptions,
    elapsed: f64,
    drained: bool,
    memory: Memory,
    t: &Tally,
) -> anyhow::Result<(PathBuf, bool)> {
    let peak = memory
        .samples
        .iter()
        .map(|(_, m)| *m)
        .fold(memory.start, f64::max);
    let back = (memory.end - memory.start).abs() / memory.start.max(1.0);
    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let pass = passed(t, peak, back);
    let report = json!({
        "benchmark": "soak",
        "phase": "attack",
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "cpu": cpu_model(),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "seconds": elapsed,
        "idle_connections": IDLE,
        "slow_body_clients": SLOW,
        "slow_body_declared_bytes": PROMISED,
        "large_prompt_clients": LARGE,
        "large_prompt_bytes": 3 * LARGE_REPEAT,
        "normal_streaming_clients": NORMAL,
        "normal_answered": c(&t.normal_ok),
        "normal_refused_429": c(&t.normal_429),
        "normal_failed": c(&t.normal_failed),
        "idle_closed": c(&t.idle_closed),
        "idle_closed_late_or_never": c(&t.idle_late),
        "idle_longest_seconds": c(&t.idle_longest_ms) as f64 / 1e3,
        "idle_deadline_seconds": HEADER_TIMEOUT.as_secs(),
        "slow_body_408": c(&t.slow_408),
        "slow_body_other_answers": c(&t.slow_other),
        "slow_body_late_or_never": c(&t.slow_late),
        "slow_body_longest_seconds": c(&t.slow_longest_ms) as f64 / 1e3,
        "slow_body_deadlines_seconds": [BODY_IDLE.as_secs(), BODY_TOTAL.as_secs()],
        "large_prompts_answered": c(&t.large_ok),
        "large_prompts_failed": c(&t.large_failed),
        "large_prompt_longest_seconds": c(&t.large_longest_ms) as f64 / 1e3,
        "all_clients_done_after_stop": drained,
        "rss_mib_start": memory.start,
        "rss_mib_peak": peak,
        "rss_mib_end": memory.end,
        "rss_end_from_start": back,
        "goals": {"rss_mib_peak_below": PEAK_RSS_MIB, "rss_end_within_of_start": BACK_WITHIN},
        "pass": pass,
        "rss_mib": memory.samples,
    });
    std::fs::create_dir_all(&opts.out)?;
    let file = opts.out.join("soak-attack.json");
    std::fs::write(&file, serde_json::to_string_pretty(&report)? + "\n")?;
    print_summary(elapsed, &memory, peak, t, pass);
    Ok((file, pass))
}

/// Whether the gateway held: every normal request answered, idle connections and slow bodies
/// cut at their deadlines, large prompts answered, and memory within its goals.
fn passed(t: &Tally, peak: f64, back: f64) -> bool {
    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    c(&t.normal_ok) > 0
        && c(&t.normal_failed) == 0
        && c(&t.normal_429) == 0
        && c(&t.idle_late) == 0
        && c(&t.idle_closed) > 0
        && c(&t.slow_late) == 0
        && c(&t.slow_other) == 0
        && c(&t.slow_408) > 0
        && c(&t.large_ok) > 0
        && c(&t.large_failed) == 0
        && peak < PEAK_RSS_MIB
        && back <= BACK_WITHIN
}

/// The run's one-line summary on stdout.
fn print_summary(elapsed: f64, memory: &Memory, peak: f64, t: &Tally, pass: bool) {
    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "attack: {:.0} s; normal streaming requests answered {}, refused 429 {}, failed {}; idle connections closed {} (longest {:.1} s, late or never {}); slow bodies 408 {} (longest {:.1} s, other answers {}, late or never {}); 4 MiB prompts answered {} (longest {:.1} s, failed {}); RSS {:.0} MiB at start, {:.0} at peak, {:.0} at the end ({:+.1} %): {}",
        elapsed,
        c(&t.normal_ok),
        c(&t.normal_429),
        c(&t.normal_failed),
        c(&t.idle_closed),
        c(&t.idle_longest_ms) as f64 / 1e3,
        c(&t.idle_late),
        c(&t.slow_408),
        c(&t.slow_longest_ms) as f64 / 1e3,
        c(&t.slow_other),
        c(&t.slow_late),
        c(&t.large_ok),
        c(&t.large_longest_ms) as f64 / 1e3,
        c(&t.large_failed),
        memory.start,
        peak,
        memory.end,
        (memory.end - memory.start) / memory.start.max(1.0) * 100.0,
        if pass { "PASS" } else { "FAIL" }
    );
}
