//! The processes a benchmark runs against: llama-server (plain, or with its own speculative
//! decoding) and `approxy serve`, each started on a free port in one of two core layouts and
//! killed when dropped, so an aborted run leaves nothing behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::process::Command;

use approxy_setup::Home;

/// How draft and target share this machine's cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// Every process may use both cores (2 threads each), as an unconfigured box would.
    Shared,
    /// Target on core 0, draft (and the gateway around it) on core 1, one thread each: the
    /// closest this machine gets to a remote target with hardware of its own.
    Pinned,
}

impl Layout {
    /// Its name in reports and file names.
    pub fn name(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::Pinned => "pinned",
        }
    }

    /// Threads the target (and, in llama.cpp's speculative mode, its draft) computes with.
    pub fn target_threads(self) -> usize {
        match self {
            Self::Shared => 2,
            Self::Pinned => 1,
        }
    }

    /// Threads the ONNX draft computes with.
    pub fn draft_threads(self) -> usize {
        self.target_threads()
    }

    fn draft_cpus(self) -> Option<&'static str> {
        match self {
            Self::Shared => None,
            Self::Pinned => Some("1"),
        }
    }

    /// Cores this machine needs for the layout.
    pub fn cores_needed(self) -> usize {
        match self {
            Self::Shared => 1,
            Self::Pinned => 2,
        }
    }
}

pub use approxy_setup::local_server::{LocalServer as Server, free_port};

/// `program args...`, under `taskset -c cpus` when `cpus` is set.
pub fn command(program: &Path, cpus: Option<&str>) -> Command {
    match cpus {
        Some(c) => {
            let mut cmd = Command::new("taskset");
            cmd.arg("-c").arg(c).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

async fn spawn(
    cmd: Command,
    url: String,
    log: PathBuf,
    ready_path: &str,
) -> anyhow::Result<Server> {
    let mut server = Server::start(cmd, url, log)?;
    // Loading a model and (for the gateway) the draft takes seconds; a cold page cache more.
    server
        .wait_healthy(ready_path, Duration::from_secs(300))
        .await?;
    Ok(server)
}

/// llama.cpp's speculative decoding settings the benchmark compares against (FACTS.md).
pub const LLAMA_SPEC_ARGS: [&str; 6] = [
    "--spec-type",
    "draft-simple",
    "--spec-draft-n-max",
    "8",
    "--spec-draft-p-min",
    "0.5",
];

/// Starts llama-server with the target model; `speculative` adds the draft GGUF as its own
/// speculative draft. Pinned, the target runs on core 0 and llama.cpp's draft on core 1.
pub async fn start_llama(
    home: &Home,
    layout: Layout,
    speculative: bool,
    logs: &Path,
) -> anyhow::Result<Server> {
    start_llama_slots(home, layout, speculative, 1, logs).await
}

/// [`start_llama`] with `slots` parallel slots (`-np`), each with the one slot's 8,192
/// positions.
pub async fn start_llama_slots(
    home: &Home,
    layout: Layout,
    speculative: bool,
    slots: usize,
    logs: &Path,
) -> anyhow::Result<Server> {
    let port = free_port()?;
    let (np, ctx) = (slots.max(1).to_string(), (8192 * slots.max(1)).to_string());
    let threads = layout.target_threads().to_string();
    let mut cmd = Command::new(home.llama_server());
    cmd.arg("-m").arg(home.target_gguf());
    cmd.args([
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "-c",
        &ctx,
        "-np",
        &np,
        "-t",
        &threads,
        "-tb",
        &threads,
        // No prompt cache across requests: otherwise a configuration run after another finds
        // the same prompts already processed and looks faster than it is (see tests/README.md,
        // "Earlier measurements", the HumanEval quality run). The slot's own cache still serves a request's
        // successive calls, as a provider's prompt cache would.
        "--cache-ram",
        "0",
        // Its own counters (`/metrics`): what it computed, read around each run.
        "--metrics",
    ]);
    if layout == Layout::Pinned {
        // llama.cpp pins its own threads: hex masks, core 0 = 0x1, core 1 = 0x2.
        cmd.args(["-C", "1", "--cpu-strict", "1"]);
    }
    if speculative {
        cmd.arg("-md").arg(home.draft_gguf());
        cmd.args(LLAMA_SPEC_ARGS);
        cmd.args(["-td", &threads, "-tbd", &threads]);
        if layout == Layout::Pinned {
            cmd.args(["-Cd", "2", "--cpu-strict-draft", "1"]);
        }
    }
    let name = if speculative {
        "llama-speculative"
    } else {
        "llama-target"
    };
    let log = logs.join(format!("{name}-{}.log", layout.name()));
    spawn(cmd, format!("http://127.0.0.1:{port}"), log, "/health").await
}

/// A client of a llama-server the benchmark started (`url`), named `model`: generous timeouts,
/// two retries, no proxy.
pub fn llama_client(
    url: &str,
    model: &str,
) -> anyhow::Result<approxy_verifier::targets::LlamaCppTarget> {
    use approxy_verifier::targets::{LlamaCppTarget, TargetConfig};
    Ok(LlamaCppTarget::new(TargetConfig {
        base_url: url.to_string(),
        api_key: None,
        model: model.to_string(),
        timeout: Duration::from_secs(300),
        retries: 2,
        backoff: Duration::from_millis(500),
        ca_file: None,
        cache_hints: Default::default(),
        use_env_proxy: false,
    })?)
}

/// Starts `approxy serve` with `policy`; pinned, on core 1 with the draft.
pub async fn start_gateway(
    exe: &Path,
    policy: &Path,
    layout: Layout,
    logs: &Path,
) -> anyhow::Result<Server> {
    let port = free_port()?;
    let mut cmd = command(exe, layout.draft_cpus());
    cmd.arg("serve")
        .arg("--policy")
        .arg(policy)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"));
    cmd.env("RUST_LOG", "warn");
    let log = logs.join(format!("gateway-{}.log", layout.name()));
    spawn(cmd, format!("http://127.0.0.1:{port}"), log, "/health").await
}

/// A `/proc/PID/status` memory line (`VmHWM`, `VmRSS`, ...), in bytes.
fn proc_status_bytes(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .lines()
        .find(|l| l.strip_prefix(key).is_some_and(|r| r.starts_with(':')))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Peak resident memory (VmHWM) of a process, in bytes.
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    proc_status_bytes(pid, "VmHWM")
}

/// Current resident memory (VmRSS) of a process, in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    proc_status_bytes(pid, "VmRSS")
}

/// Clock ticks a second in `/proc/PID/stat`'s times: `USER_HZ`, fixed at 100 in the kernel's
/// user interface on x86 Linux (what `getconf CLK_TCK` prints).
const USER_HZ: f64 = 100.0;

/// CPU seconds a process has used so far, user and system, over all its threads, ended ones
/// included (`/proc/PID/stat`'s utime and stime).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    stat_cpu_seconds(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// [`cpu_seconds`] from a stat line. The command name may hold spaces and parentheses, so the
/// fields are counted from after its last `)`: the state is field 3, utime 14 and stime 15.
fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some((ticks(11)? + ticks(12)?) as f64 / USER_HZ)
}

/// Empties vLLM's prefix cache, so that a configuration does not find the prompts an earlier
/// one already computed (within a run, its own re-sent prefixes are still cached, as in
/// production). Retries while requests still hold blocks.
pub async fn reset_vllm_prefix_cache(http: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    for _ in 0..50 {
        let r: serde_json::Value = http
            .post(format!("{url}/reset_prefix_cache"))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        if r["success"].as_bool() == Some(true) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("vLLM at {url} did not reset its prefix cache")
}

/// Which checkpoint a benchmark's vLLM serves (`--vllm-model`): both are GGUFs dequantised to
/// float32 by `approxy setup --vllm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VllmModel {
    /// The 1.5B target, the draft's real pair (the weights llama-server serves).
    #[default]
    Target,
    /// The draft itself: three times faster, one model at two precisions.
    Draft,
}

impl VllmModel {
    /// The name vLLM serves it under (the test command's vLLM uses the same names).
    pub fn served_name(self) -> &'static str {
        match self {
            VllmModel::Target => "qwen2.5-coder-1.5b-instruct-f32",
            VllmModel::Draft => "qwen2.5-coder-0.5b-instruct-f32",
        }
    }

    /// Its checkpoint's directory.
    pub fn dir(self, home: &Home) -> std::path::PathBuf {
        match self {
            VllmModel::Target => home.target_hf_dir(),
            VllmModel::Draft => home.draft_hf_dir(),
        }
    }
}

/// The checkpoint this process's benchmarks serve on vLLM: set once from the command line
/// (`set_vllm_model`), the target until then.
static VLLM_MODEL: std::sync::OnceLock<VllmModel> = std::sync::OnceLock::new();

/// Chooses the checkpoint vLLM serves for the rest of this process; a second choice is an
/// error (the runs saved so far were made with the first).
pub fn set_vllm_model(m: VllmModel) -> anyhow::Result<()> {
    let kept = *VLLM_MODEL.get_or_init(|| m);
    anyhow::ensure!(
        kept == m,
        "vLLM already serves the {kept:?} checkpoint here"
    );
    Ok(())
}

/// The checkpoint vLLM serves here.
pub fn vllm_model() -> VllmModel {
    VLLM_MODEL.get().copied().unwrap_or_default()
}

/// Starts vLLM (from `approxy setup --vllm`) serving [`vllm_model`]'s float32 checkpoint: the
/// one target here that returns prompt log-probabilities, for windows. Pinned, on core 0.
pub async fn start_vllm(home: &Home, layout: Layout, logs: &Path) -> anyhow::Result<Server> {
    let port = free_port()?;
    let python = approxy_setup::vllm::vllm_python(home);
    let mut cmd = command(&python, (layout == Layout::Pinned).then_some("0"));
    cmd.args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
        .arg(vllm_model().dir(home))
        .args([
            "--served-model-name",
            vllm_model().served_name(),
            "--host",
            "127.0.0.1",
        ])
        .args(["--port", &port.to_string()])
        .args([
            "--max-model-len",
            "4096",
            "--dtype",
            "float32",
            "--enforce-eager",
        ])
        // The token-in endpoint and the cached count a window from the prefix cache needs
        // (approxy_verifier::targets::token_in).
        // Blocks of 32, the smallest vLLM's CPU kernels take (its CPU default is 128).
        .args([
            "--enable-scale-out",
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--block-size",
            "32",
        ])
        .env("VLLM_CPU_KVCACHE_SPACE", "2")
        // For /reset_prefix_cache (see `reset_vllm_prefix_cache`), as vLLM's own sweeps do.
        .env("VLLM_SERVER_DEV_MODE", "1");
    let log = logs.join(format!("vllm-{}.log", layout.name()));
    let mut server = Server::start(cmd, format!("http://127.0.0.1:{port}"), log)?;
    // Start-up takes one to two minutes here (FACTS.md), more with a cold page cache.
    server
        .wait_healthy("/health", Duration::from_secs(600))
        .await?;
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_the_command_name_whatever_it_holds() {
        let line =
            "4242 (llama (x) server) S 1 4242 4242 0 -1 4194560 900 0 0 0 1234 66 0 0 20 0 5 0";
        assert_eq!(stat_cpu_seconds(line), Some(13.0));
        assert_eq!(stat_cpu_seconds("4242 (cut) S 1 2"), None);
    }

    #[test]
    fn this_process_has_used_some_cpu_time() {
        let start = std::time::Instant::now();
        let mut spin = 0u64;
        while start.elapsed() < Duration::from_millis(60) {
            spin = std::hint::black_box(spin.wrapping_add(1));
        }
        let used = cpu_seconds(std::process::id()).expect("/proc/self/stat");
        assert!(used > 0.0, "{used}");
    }
}
