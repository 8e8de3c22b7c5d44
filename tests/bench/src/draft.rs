//! `approxy bench draft`: decode speed of the ONNX draft on this machine (prefill time and
//! milliseconds per greedy decode step), and what the decode loop adds per drafted token
//! (sampling, the verifier's features and decision, the answer's context, streaming the text)
//! against that bare forward pass. Speed goals live here, not in timed tests.

use std::sync::Arc;
use std::time::Instant;

use approxy_verifier::decode::{
    Correction, DecodeSettings, Engine, GenerateRequest, SpanAsk, SpanClose,
};
use approxy_verifier::sampling::argmax;
use approxy_verifier::targets::{Continuation, ContinuationRequest};
use approxy_verifier::verify::Features;
use approxy_verifier::{
    ConfidenceVerifier, Draft, DraftConfig, DraftPool, DraftWorkers, LearnedVerifier,
    SamplingParams, TargetClient, TargetError, Tokenizer, Verifier,
};
use async_trait::async_trait;
use serde_json::json;

use approxy_setup::Home;

/// Options for the draft benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct DraftBenchOptions {
    /// Tokens decoded per run.
    #[arg(long, default_value_t = 128)]
    pub tokens: usize,
    /// Runs (plus one warm-up).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Intra-op threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Let idle draft threads spin-wait (as with `spin_wait = true` in a policy).
    #[arg(long)]
    pub spin: bool,
    /// Tokens of earlier conversation before the prompt: decode speed at a long context.
    #[arg(long, default_value_t = 0)]
    pub context: usize,
    /// Root URL of a running llama-server with the target model: its decode speed calibrates
    /// this machine against the one the reference figures come from.
    // Timed the same way as the draft; the reference figures are FACTS.md's.
    #[arg(long)]
    pub target_url: Option<String>,
}

impl DraftBenchOptions {
    /// Runs timed, plus the warm-up run that is not counted.
    fn runs_with_warm_up(&self) -> usize {
        self.runs + 1
    }
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

/// The pool's draft with its cache emptied, so that every run starts from the same state.
async fn fresh_draft(pool: &DraftPool) -> anyhow::Result<Box<dyn Draft>> {
    let lease = pool
        .try_lease()
        .ok_or_else(|| anyhow::anyhow!("draft worker busy"))?;
    lease.rollback(usize::MAX).await?;
    Ok(lease)
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
        let lease = fresh_draft(pool).await?;
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

/// A verifier that scores every token with the one it wraps, then accepts it: the loop does
/// all of its per-token work and never calls a target, so its time is the draft's alone.
#[derive(Debug)]
struct ScoreThenAccept(Arc<dyn Verifier>);

impl Verifier for ScoreThenAccept {
    fn p_accept(&self, f: &Features) -> f32 {
        std::hint::black_box(self.0.p_accept(f));
        1.0
    }
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    fn reads_context(&self) -> bool {
        self.0.reads_context()
    }
}

/// The target of a measurement that never calls one ([`ScoreThenAccept`] accepts every token).
#[derive(Debug)]
struct NoTarget;

#[async_trait]
impl TargetClient for NoTarget {
    async fn continue_tokens(
        &self,
        _req: &ContinuationRequest,
    ) -> Result<Continuation, TargetError> {
        Err(TargetError::Protocol(
            "the draft benchmark calls no target".into(),
        ))
    }
    async fn tokenize(&self, _text: &str) -> Result<Option<Vec<u32>>, TargetError> {
        Ok(None)
    }
    async fn health(&self) -> Result<(), TargetError> {
        Ok(())
    }
}

/// Milliseconds per drafted token inside the decode loop, one value per run after a warm-up:
/// the time from the first streamed token to the last over the tokens between, so the
/// prefill is not counted (as in [`decode_speed`]).
async fn engine_speed(
    pool: &DraftPool,
    tok: &Tokenizer,
    verifier: Arc<dyn Verifier>,
    prompt: &[u32],
    tokens: usize,
    runs: usize,
    sampling: SamplingParams,
) -> anyhow::Result<Vec<f64>> {
    let engine = Engine::new(tok.clone(), Arc::new(NoTarget), tok.end_of_sequence_ids());
    let verifier = ScoreThenAccept(verifier);
    let mut step_ms = Vec::new();
    for run in 0..runs.max(2) {
        let lease = fresh_draft(pool).await?;
        let req = GenerateRequest {
            prompt: prompt.to_vec(),
            max_tokens: u32::try_from(tokens)?,
            sampling: SamplingParams {
                seed: Some(run as u64),
                ..sampling
            },
            stop: Vec::new(),
            // Inside the dial's ends, so that the features are computed and the verifier asked.
            threshold: 0.5,
            cost_guard: None,
            model: None,
            messages: None,
            settings: Arc::new(DecodeSettings {
                correction: Correction::Span {
                    max_span: 32,
                    resync: 3,
                    end: SpanClose::Resync,
                    ask: SpanAsk::All,
                },
                ..DecodeSettings::default()
            }),
            constraint: None,
        };
        let (tx, mut rx) =
            tokio::sync::mpsc::channel::<approxy_verifier::decode::TokenEvent>(tokens + 8);
        let times = async {
            let mut times = Vec::new();
            while let Some(ev) = rx.recv().await {
                if ev.id.is_some() {
                    times.push(Instant::now());
                }
            }
            times
        };
        let (stats, times) =
            tokio::join!(engine.generate(lease.as_ref(), &verifier, req, tx), times);
        let stats = stats?;
        anyhow::ensure!(
            stats.target_calls == 0,
            "the draft measurement called the target"
        );
        if let (true, Some(first), Some(last)) =
            (run > 0 && times.len() > 1, times.first(), times.last())
        {
            step_ms.push((*last - *first).as_secs_f64() * 1e3 / (times.len() - 1) as f64);
        }
    }
    Ok(step_ms)
}

/// The sampling settings the loop is measured at: greedy, the API's default temperature 1
/// with no nucleus cut, and a common temperature 0.7 with top_p 0.9.
fn sampling_cases() -> [(&'static str, SamplingParams); 3] {
    let at = |temperature, top_p| SamplingParams {
        temperature,
        top_p,
        seed: None,
    };
    [
        ("greedy", at(0.0, 1.0)),
        ("temperature_1", at(1.0, 1.0)),
        ("temperature_0.7_top_p_0.9", at(0.7, 0.9)),
    ]
}

/// The draft's time per token in the decode loop with each verifier it ships (the confidence
/// baseline and the learned one, when its artifact matches this draft), per sampling case,
/// against the bare forward pass.
fn loop_report(
    rt: &tokio::runtime::Runtime,
    pool: &DraftPool,
    tok: &Tokenizer,
    prompt: &[u32],
    opts: &DraftBenchOptions,
    bare_ms: f64,
) -> anyhow::Result<serde_json::Value> {
    let mut verifiers: Vec<(&str, Arc<dyn Verifier>)> =
        vec![("confidence", Arc::new(ConfidenceVerifier))];
    let learned = std::path::Path::new("policies/verifier/default.json");
    match learned_verifier(learned) {
        Ok(v) => verifiers.push(("learned", Arc::new(v))),
        Err(e) => eprintln!("bench draft: the learned verifier is not measured: {e:#}"),
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let mut rows = Vec::new();
    for (name, v) in &verifiers {
        for (case, sampling) in sampling_cases() {
            let ms = mean(&rt.block_on(engine_speed(
                pool,
                tok,
                v.clone(),
                prompt,
                opts.tokens,
                opts.runs_with_warm_up(),
                sampling,
            ))?);
            rows.push(json!({
                "verifier": name,
                "sampling": case,
                "ms_per_token": ms,
                "vs_bare_forward": ms / bare_ms,
                "within_1_15x": ms <= bare_ms * LOOP_GOAL,
            }));
        }
    }
    Ok(json!(rows))
}

/// The goal for the loop's time per drafted token against the bare forward pass.
const LOOP_GOAL: f64 = 1.15;

/// The shipped learned verifier, bound to the draft it names (this measurement is of its cost
/// per token, not of its decisions, so the binding is not checked against the configured draft).
fn learned_verifier(path: &std::path::Path) -> anyhow::Result<LearnedVerifier> {
    let a: approxy_verifier::verify::learned::Artifact =
        serde_json::from_slice(&std::fs::read(path)?)?;
    let sha = a.draft_sha256.clone();
    Ok(LearnedVerifier::from_artifact(a, &sha)?)
}

/// Runs the benchmark and prints a JSON report.
pub fn draft(opts: &DraftBenchOptions) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let cfg = DraftConfig {
        spin_wait: opts.spin,
        ..DraftConfig::one_stream_per_worker(
            home.draft_onnx_dir(),
            home.onnxruntime_lib(),
            1,
            opts.threads,
        )
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
    let (prefill_ms, step_ms) = rt.block_on(decode_speed(
        &pool,
        &prompt,
        opts.tokens,
        opts.runs_with_warm_up(),
    ))?;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let ms = mean(&step_ms);
    let in_loop = loop_report(&rt, &pool, &tok, &prompt, opts, ms)?;
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
        "decode_loop": in_loop,
        "machine_calibration": machine,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
