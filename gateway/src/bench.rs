//! `approxy bench draft`: decode speed of the ONNX draft on this machine (prefill time and
//! milliseconds per greedy decode step). Speed goals live here, not in timed tests.

use std::time::Instant;

use approxy_verifier::sampling::argmax;
use approxy_verifier::{DraftConfig, DraftPool, Tokenizer};
use serde_json::json;

use crate::setup::Home;

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
}

/// Runs the benchmark and prints a JSON report.
pub fn draft(opts: &DraftBenchOptions) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let cfg = DraftConfig { model_dir: home.draft_onnx_dir(), onnxruntime_lib: home.onnxruntime_lib(), workers: 1, threads_per_worker: opts.threads, spin_wait: opts.spin };
    let tok = Tokenizer::from_file(&cfg.model_dir.join("tokenizer.json"))?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let pool = DraftPool::start(&cfg)?;
    let prompt = tok.encode("<|im_start|>user\nWrite a Python function that checks whether a number is prime.<|im_end|>\n<|im_start|>assistant\n")?;
    let mut prefill_ms = Vec::new();
    let mut step_ms = Vec::new();
    rt.block_on(async {
        for run in 0..opts.runs.max(2) {
            let lease = pool.try_lease().ok_or_else(|| anyhow::anyhow!("draft worker busy"))?;
            lease.rollback(usize::MAX).await?;
            let t = Instant::now();
            let mut out = lease.prefill(prompt.clone()).await?;
            let p = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            for _ in 0..opts.tokens {
                let next = argmax(&out.logits).0 as u32;
                out = lease.extend(vec![next], false).await?.pop().ok_or_else(|| anyhow::anyhow!("no output"))?;
            }
            let s = t.elapsed().as_secs_f64() * 1e3 / opts.tokens as f64;
            if run > 0 {
                prefill_ms.push(p);
                step_ms.push(s);
            }
        }
        anyhow::Ok(())
    })?;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let report = json!({
        "benchmark": "draft_decode",
        "model_dir": cfg.model_dir,
        "threads": opts.threads,
        "spin_wait": opts.spin,
        "prompt_tokens": prompt.len(),
        "decode_tokens_per_run": opts.tokens,
        "runs": step_ms.len(),
        "prefill_ms": mean(&prefill_ms),
        "decode_ms_per_token": mean(&step_ms),
        "decode_tokens_per_second": 1e3 / mean(&step_ms),
        "facts_reference_ms_per_token": 21.8,
        "within_1_3x_of_reference": mean(&step_ms) <= 21.8 * 1.3,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
