//! `approxy train importance`: importance labels on HumanEval from a real llama-server target,
//! along the target's answers or approxy's live ones, in resumable shards; and
//! `approxy train importance-rows`: the draft's features along the labelled answers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use approxy_verifier::home::Home;
use approxy_verifier::targets::{CacheHints, LlamaCppTarget, TargetConfig};
use approxy_verifier::{
    ConfidenceVerifier, DraftConfig, DraftPool, DraftWorkers, Engine, TargetClient, Tokenizer,
};

use crate::corpus::load_human_eval;
use crate::dataset::IMPORTANCE_UNKNOWN;
use crate::humaneval::{Sandbox, split_held_out};
use crate::importance::{Labeller, PathKind, label_shards, read_shard, rows_of};

/// `approxy train importance` options.
#[derive(Debug, Clone, clap::Args)]
pub struct ImportanceArgs {
    /// The llama-server target's root URL.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub target_url: String,
    /// Where the label shards go (committed: they are the labels).
    #[arg(long, default_value = "training/data/importance")]
    pub out: PathBuf,
    /// Label the held-out problems (shards named `held-out-*`) instead of the training ones.
    #[arg(long)]
    pub held_out: bool,
    /// Label along approxy's live answers at this threshold (confidence verifier) instead of
    /// the target's own answers.
    #[arg(long)]
    pub live_threshold: Option<f32>,
    /// Label only the first N problems of the set (0: all).
    #[arg(long, default_value_t = 0)]
    pub problems: usize,
    /// Longest answer, in tokens.
    #[arg(long, default_value_t = 256)]
    pub max_answer_tokens: u32,
    /// Problems per shard.
    #[arg(long, default_value_t = 8)]
    pub shard_problems: usize,
}

/// `approxy train importance-rows` options.
#[derive(Debug, Clone, clap::Args)]
pub struct ImportanceRowsArgs {
    /// The label shards (`approxy train importance --out`).
    #[arg(long, default_value = "training/data/importance")]
    pub labels: PathBuf,
    /// Where the rows go: `train/` and `held-out/` below it, one rows shard per label shard
    /// (a rerun skips those there).
    #[arg(long)]
    pub out: PathBuf,
}

/// Computes the draft's features along every labelled answer.
pub fn run_importance_rows(a: &ImportanceRowsArgs) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let dir = home.draft_onnx_dir();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    let problems =
        load_human_eval(&home.human_eval()).context("HumanEval (run `approxy setup`)")?;
    let pool = DraftPool::start(&DraftConfig::one_stream_per_worker(
        dir,
        home.onnxruntime_lib(),
        1,
        1,
    ))?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&a.labels)
        .with_context(|| format!("reading {}", a.labels.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for f in files {
        let stem = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (set, name) = match stem.strip_prefix("held-out-") {
            Some(rest) => ("held-out", rest.to_string()),
            None => ("train", stem.clone()),
        };
        // `train fit`'s loader reads shards named shard-* and live-*.
        let file = if name.starts_with("live-") {
            format!("{name}.safetensors")
        } else {
            format!("shard-{name}.safetensors")
        };
        let out = a.out.join(set).join(file);
        if out.exists() {
            continue;
        }
        std::fs::create_dir_all(out.parent().unwrap_or(&a.out))?;
        let answers = read_shard(&f)?;
        let rows = rt.block_on(async {
            let lease = pool
                .try_lease()
                .ok_or_else(|| anyhow::anyhow!("no idle draft worker"))?;
            rows_of(lease.as_ref(), pool.meta(), &tok, &problems, &answers).await
        })?;
        let unknown = rows
            .importance
            .iter()
            .filter(|&&c| c == IMPORTANCE_UNKNOWN)
            .count();
        rows.save(&out)?;
        eprintln!(
            "{}: {} rows ({unknown} unjudged: the draft proposes another token here)",
            out.display(),
            rows.len()
        );
    }
    Ok(())
}

/// Labels the chosen problems.
pub fn run_importance(a: &ImportanceArgs) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let dir = home.draft_onnx_dir();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    let (train, held) = split_held_out(
        load_human_eval(&home.human_eval()).context("HumanEval (run `approxy setup`)")?,
    );
    let mut problems = if a.held_out { held } else { train };
    if a.problems > 0 {
        problems.truncate(a.problems);
    }
    let path = match a.live_threshold {
        None => PathKind::Target,
        Some(t) => {
            anyhow::ensure!(
                (0.0..=1.0).contains(&t),
                "--live-threshold {t} is outside [0, 1]"
            );
            PathKind::Live(t)
        }
    };
    let pool = DraftPool::start(&DraftConfig::one_stream_per_worker(
        dir,
        home.onnxruntime_lib(),
        1,
        1,
    ))?;
    let cfg = TargetConfig {
        base_url: a.target_url.clone(),
        api_key: None,
        model: String::new(),
        timeout: Duration::from_secs(300),
        retries: 3,
        backoff: Duration::from_millis(500),
        ca_file: None,
        cache_hints: CacheHints::default(),
        use_env_proxy: false,
    };
    let target: Arc<dyn TargetClient> = Arc::new(LlamaCppTarget::new(cfg)?);
    let scratch = tempfile::tempdir()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = Instant::now();
    let labelled = rt.block_on(async {
        let labeller = Labeller {
            target: target.as_ref(),
            tokenizer: &tok,
            sandbox: Sandbox::detect().await,
            scratch: scratch.path(),
            max_answer_tokens: a.max_answer_tokens,
            test_timeout: Duration::from_secs(10),
            concurrency: 2,
        };
        let engine = Engine::new(tok.clone(), Arc::clone(&target), tok.end_of_sequence_ids());
        let lease = pool
            .try_lease()
            .ok_or_else(|| anyhow::anyhow!("no idle draft worker"))?;
        let prefix = if a.held_out { "held-out-" } else { "" };
        label_shards(
            &labeller,
            &engine,
            lease.as_ref(),
            &ConfidenceVerifier,
            path,
            &problems,
            &a.out,
            prefix,
            a.shard_problems,
        )
        .await
    })?;
    let positions: usize = labelled.iter().map(|l| l.counts().0).sum();
    let important: usize = labelled.iter().map(|l| l.counts().1).sum();
    let tokens: usize = labelled.iter().map(|l| l.answer.len()).sum();
    eprintln!(
        "labelled {} answers ({tokens} tokens, {positions} disagreements, {important} important) in {:.0?}",
        labelled.len(),
        started.elapsed()
    );
    Ok(())
}
