//! `approxy bench draft`: decode speed of the ONNX draft on this machine (prefill time and
//! milliseconds per greedy decode step). Speed goals live here, not in timed tests.

use std::time::Instant;

use approxy_verifier::sampling::argmax;
use approxy_verifier::{DraftConfig, DraftPool, DraftWorkers, Tokenizer};
use serde_json::json;

use approxy_setup::Home;

/// Options for the draft benchmark.
#[derive(Debug, Clone)]
pub struct DraftBenchOptions {
    /// Tokens to decode per run.
    pub tokens: usize,
    /// Runs (the first is a warm-up and not counted).
    pub runs: usize,
    /// Intra-op threads.
    pub threads: usize,
    /// Let idle threads spin-wait.
    pub spin: bool,
    /// Tokens of earlier conversation put before the prompt.
    pub context: usize,
    /// A running llama-server with the target model, timed the same way as a yardstick for
    /// this machine's speed against the one FACTS.md was measured on.
    pub target_url: Option<String>,
}

/// FACTS.md's reference figures, measured on the project's machine kind.
const FACTS_DRAFT_MS_PER_TOKEN: f64 = 21.8;
const FACTS_TARGET_TOKENS_PER_SECOND: f64 = 13.5;

/// The prompt both the draft and the yardstick target decode after.
pub(crate) const PROMPT: &str = "<|im_start|>user\nWrite a Python function that checks whether a number is prime.<|im_end|>\n<|im_start|>assistant\n";

/// Greedy 128-token decode speed of a llama-server, from its own timings.
async fn target_tokens_per_second(url: &str) -> anyhow::Result<f64> {
    let body = json!({
        "prompt": PROMPT,
        "n_predict": 128, "temperature": 0, "cache_prompt": false,
    });
    let v: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/completion", url.trim_end_matches('/')))
        .json(&body)
        .send()
        .await?
        .json()
        .await?;
    v["timings"]["predicted_per_second"]
        .as_f64()
        .ok_or_else(|| anyhow::anyhow!("no timings in the llama-server answer"))
}

/// Prefill milliseconds and milliseconds per greedy decode step of `tokens` steps after
/// `prompt`, one value per run after a first warm-up run.
pub(crate) async fn decode_speed(
    pool: &DraftPool,
    prompt: &[u32],
    tokens: usize,
    runs: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let mut prefill_ms = Vec::new();
    let mut step_ms = Vec::new();
    for run in 0..runs.max(2) {
        let lease = pool
            .try_lease()
            .ok_or_else(|| anyhow::anyhow!("draft worker busy"))?;
        lease.rollback(usize::MAX).await?;
        let t = Instant::now();
        let mut out = lease.prefill(prompt.to_vec()).await?;
        let p = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        for _ in 0..tokens {
            let next = argmax(&out.logits).0 as u32;
            out = lease
                .extend(vec![next], false)
                .await?
                .pop()
                .ok_or_else(|| anyhow::anyhow!("no output"))?;
        }
        let s = t.elapsed().as_secs_f64() * 1e3 / tokens.max(1) as f64;
        if run > 0 {
            prefill_ms.push(p);
            step_ms.push(s);
        }
    }
    Ok((prefill_ms, step_ms))
}

/// Runs the benchmark and prints a JSON report.
pub fn draft(opts: &DraftBenchOptions) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let cfg = DraftConfig {
        model_dir: home.draft_onnx_dir(),
        onnxruntime_lib: home.onnxruntime_lib(),
        workers: 1,
        threads_per_worker: opts.threads,
        spin_wait: opts.spin,
    };
    let tok = Tokenizer::from_file(&cfg.model_dir.join("tokenizer.json"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pool = DraftPool::start(&cfg)?;
    let mut prompt = Vec::new();
    if opts.context > 0 {
        // An earlier turn of plain prose, cut to the length asked for.
        let filler = tok.encode(&format!(
            "<|im_start|>user\n{}<|im_end|>\n",
            "The quick brown fox jumps over the lazy dog. ".repeat(opts.context / 8 + 1)
        ))?;
        prompt.extend_from_slice(&filler[..opts.context.min(filler.len())]);
    }
    prompt.extend(tok.encode(PROMPT)?);
    let (prefill_ms, step_ms) =
        rt.block_on(decode_speed(&pool, &prompt, opts.tokens, opts.runs))?;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let ms = mean(&step_ms);
    // The draft runs after the target measurement is done, never beside it.
    let machine = match &opts.target_url {
        Some(url) => {
            drop(pool);
            let tps = rt.block_on(target_tokens_per_second(url))?;
            let slowdown = FACTS_TARGET_TOKENS_PER_SECOND / tps;
            json!({
                "target_decode_tokens_per_second": tps,
                "facts_target_tokens_per_second": FACTS_TARGET_TOKENS_PER_SECOND,
                "machine_slowdown_vs_facts": slowdown,
                "decode_ms_per_token_normalised": ms / slowdown,
                "within_1_3x_of_reference_normalised": ms / slowdown <= FACTS_DRAFT_MS_PER_TOKEN * 1.3,
            })
        }
        None => json!(null),
    };
    let report = json!({
        "benchmark": "draft_decode",
        "model_dir": cfg.model_dir,
        "threads": opts.threads,
        "spin_wait": opts.spin,
        "prompt_tokens": prompt.len(),
        "decode_tokens_per_run": opts.tokens,
        "runs": step_ms.len(),
        "prefill_ms": mean(&prefill_ms),
        "decode_ms_per_token": ms,
        "decode_tokens_per_second": 1e3 / ms,
        "facts_reference_ms_per_token": FACTS_DRAFT_MS_PER_TOKEN,
        "within_1_3x_of_reference": ms <= FACTS_DRAFT_MS_PER_TOKEN * 1.3,
        "machine_calibration": machine,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
