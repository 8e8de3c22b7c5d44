//! Runs each native asset once before setup accepts it. `--version` is not enough: a
//! llama-server built for instructions this CPU lacks prints its version and dies only when
//! its kernels first run, so the check generates a real token.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use super::cpu::CpuFeatures;
use crate::local_server::{LocalServer, free_port};

/// What a process's end says about the CPU, for the error message.
fn describe_exit(status: std::process::ExitStatus, cpu: &CpuFeatures) -> String {
    match status.signal() {
        // SIGILL: the binary uses an instruction this CPU does not have.
        Some(4) => format!(
            "died with \"Illegal instruction\" (SIGILL): it was built for instructions this CPU ({}) lacks; its SIMD features: {}",
            cpu.model,
            cpu.simd_summary()
        ),
        Some(sig) => format!(
            "was killed by signal {sig} on {} ({})",
            cpu.model,
            cpu.simd_summary()
        ),
        None => format!("exited with {status}"),
    }
}

/// Runs `cmd` to completion and fails only if it was killed by a signal (an exit code is fine:
/// a tool's `-h` may exit non-zero, but it ran).
pub fn runs(cmd: &mut Command, cpu: &CpuFeatures) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("could not start {shown}"))?;
    if status.signal().is_some() {
        bail!("{shown} {}", describe_exit(status, cpu));
    }
    Ok(())
}

/// Starts `llama-server` on `gguf` (output in `log`), waits for `/health`, asks `/completion`
/// for one token and stops it. Returns the generated text.
pub fn llama_server_generates(
    bin: &Path,
    gguf: &Path,
    log: &Path,
    cpu: &CpuFeatures,
) -> anyhow::Result<String> {
    let version = Command::new(bin)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start {}", bin.display()))?;
    if !version.status.success() {
        bail!(
            "`llama-server --version` {}",
            describe_exit(version.status, cpu)
        );
    }
    let port = free_port()?;
    let mut cmd = Command::new(bin);
    cmd.arg("-m").arg(gguf).args([
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "-c",
        "512",
        "-np",
        "1",
        "-t",
        "2",
    ]);
    let ask = Ask {
        name: "llama-server",
        root: format!("http://127.0.0.1:{port}"),
        health: "/health",
        path: "/completion",
        body: serde_json::json!({"prompt": "def add(a, b):", "n_predict": 1, "temperature": 0}),
        start_limit: Duration::from_secs(300),
    };
    let reply = serve_and_ask(cmd, &ask, log, cpu)?;
    let predicted = reply
        .get("tokens_predicted")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    if predicted < 1 {
        bail!("llama-server answered without generating a token: {reply}");
    }
    Ok(reply
        .get("content")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_string())
}

/// Starts vLLM's OpenAI server on the checkpoint in `model_dir` and asks `/v1/completions` for
/// one token of a token-id prompt with `return_token_ids`, the way the `vllm` target kind
/// calls it. Returns the token id.
pub fn vllm_generates(
    python: &Path,
    model_dir: &Path,
    log: &Path,
    cpu: &CpuFeatures,
) -> anyhow::Result<u64> {
    let port = free_port()?;
    let mut cmd = Command::new(python);
    cmd.args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
        .arg(model_dir)
        .args([
            "--served-model-name",
            "smoke",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .args([
            "--max-model-len",
            "512",
            "--dtype",
            "float32",
            "--enforce-eager",
        ])
        .env("VLLM_CPU_KVCACHE_SPACE", "1");
    let ask = Ask {
        name: "vLLM",
        root: format!("http://127.0.0.1:{port}"),
        health: "/health",
        path: "/v1/completions",
        // "def add(a, b):" in the Qwen2 vocabulary.
        body: serde_json::json!({"model": "smoke", "prompt": [750, 912, 2877, 11, 293, 1648], "max_tokens": 1, "temperature": 0, "return_token_ids": true}),
        start_limit: Duration::from_secs(420),
    };
    let reply = serve_and_ask(cmd, &ask, log, cpu)?;
    reply["choices"][0]["token_ids"]
        .as_array()
        .and_then(|ids| ids.first())
        .and_then(serde_json::Value::as_u64)
        .with_context(|| format!("vLLM answered without token ids: {reply}"))
}

/// One smoke request to a server the check starts.
struct Ask {
    name: &'static str,
    /// The server's root URL.
    root: String,
    /// Path that answers 2xx once the model is loaded.
    health: &'static str,
    /// Path the request goes to.
    path: &'static str,
    body: serde_json::Value,
    start_limit: Duration,
}

/// Runs `cmd` (a server) with its output in `log`, waits until `ask.health` answers 2xx, POSTs
/// `ask.body` to `ask.url`, stops the server and returns the JSON answer. A server that dies on
/// the way is reported with what its end says about this CPU.
fn serve_and_ask(
    cmd: Command,
    ask: &Ask,
    log: &Path,
    cpu: &CpuFeatures,
) -> anyhow::Result<serde_json::Value> {
    let name = ask.name;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut server = LocalServer::start(cmd.into(), ask.root.clone(), log.to_path_buf())?;
        if let Err(e) = server.wait_healthy(ask.health, ask.start_limit).await {
            return Err(match server.exit_status() {
                Some(status) => e.context(format!(
                    "{name} {} while starting",
                    describe_exit(status, cpu)
                )),
                None => e,
            });
        }
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()?;
        let reply = client
            .post(format!("{}{}", ask.root, ask.path))
            .json(&ask.body)
            .send()
            .await;
        if let Some(status) = server.exit_status() {
            bail!(
                "{name} {} while generating its first token (log: {})",
                describe_exit(status, cpu),
                log.display()
            );
        }
        let reply = reply?.error_for_status()?.json().await?;
        server.stop().await;
        Ok(reply)
    })
}

/// Loads the ONNX draft through ONNX Runtime and runs one prefill: proves the runtime library
/// and its kernels run on this CPU.
pub fn draft_runs(onnxruntime_lib: &Path, model_dir: &Path) -> anyhow::Result<()> {
    use approxy_verifier::draft::DraftMeta;
    use approxy_verifier::draft::session::DraftSession;
    let meta = DraftMeta::load(model_dir)?;
    let vocab = meta.vocab_size;
    let mut session = DraftSession::load(onnxruntime_lib, model_dir, meta, 2, false)?;
    // "Hello" in the Qwen2 vocabulary, then a space; any valid ids would do.
    let out = session.prefill(&[9707, 220], &|| false)?;
    if out.logits.len() != vocab || out.logits.iter().any(|x| !x.is_finite()) {
        bail!(
            "the draft model ran but gave {} logits (expected {vocab} finite values)",
            out.logits.len()
        );
    }
    Ok(())
}
