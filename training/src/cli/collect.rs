//! `approxy train collect`: the corpus's prompts through the draft and a real target, as
//! training rows.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use approxy_verifier::home::Home;
use approxy_verifier::targets::{PrefixStyle, TargetKind, TextSettings};
use approxy_verifier::template::{ChatMessage, ChatTemplate};
use approxy_verifier::{
    ConfidenceVerifier, DraftConfig, DraftPool, Engine, TargetClient, Tokenizer,
};

use super::data_dir::data_dir;
use crate::collect::{CollectItem, CollectOptions, LiveOptions, collect, collect_live};

/// `approxy train collect` options.
#[derive(Debug, Clone, clap::Args)]
pub struct CollectArgs {
    /// The target's URL: llama-server's root, or a base URL ending in `/v1` for the
    /// OpenAI-style kinds.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub target_url: String,
    /// Target kind, as a policy's `target.kind` names it (one that can continue a prefix; a
    /// wrong name is told the kinds there are).
    // Every kind that can continue a prefix works, so a user can calibrate for their own target.
    #[arg(long, default_value = "llama_cpp", value_parser = TargetKind::parse)]
    pub target_kind: TargetKind,
    /// How a chat_prefix target continues an answer, as a policy's `target.prefix_style`
    /// names it.
    #[arg(long, default_value = "prefix", value_parser = PrefixStyle::parse)]
    pub prefix_style: PrefixStyle,
    /// Model id named in calls to OpenAI-style targets.
    #[arg(long, default_value = "")]
    pub target_model: String,
    /// Environment variable holding the target's API key.
    #[arg(long)]
    pub target_api_key_env: Option<String>,
    /// Prompt corpus (JSONL).
    #[arg(long, default_value = "training/data/prompts.jsonl")]
    pub corpus: PathBuf,
    /// Shard directory (default: $APPROXY_HOME/training/rows).
    #[arg(long = "data", value_name = "DATA")]
    pub data_flag: Option<PathBuf>,
    /// The shard directory written: `--data`, or the default ([`CollectArgs::with_data_dir`]).
    #[arg(skip)]
    pub data: PathBuf,
    /// Prompts to use, half code and half chat.
    #[arg(long, default_value_t = 240)]
    pub prompts: usize,
    /// Longest answer per prompt.
    #[arg(long, default_value_t = 48)]
    pub max_answer_tokens: u32,
    /// Instead of teacher forcing on the target's answer, record the positions the live
    /// decode loop visits at this threshold (confidence verifier), each labelled with the
    /// target's greedy token after that prefix. Written as live-*.safetensors beside the
    /// teacher-forced shards; `train fit` reads both.
    #[arg(long)]
    pub live_threshold: Option<f32>,
}

impl CollectArgs {
    /// These options with [`CollectArgs::data`] filled in.
    pub fn with_data_dir(self) -> anyhow::Result<Self> {
        let data = data_dir(self.data_flag.clone())?;
        Ok(Self { data, ..self })
    }
}

/// Collects training rows.
pub fn run_collect(a: &CollectArgs) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let dir = home.draft_onnx_dir();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    let template = ChatTemplate::from_file(&dir.join("chat_template.jinja"))?;
    let items = collect_items(a, &tok, &template)?;
    let eos = tok.end_of_sequence_ids();
    let pool = DraftPool::start(&DraftConfig::one_stream_per_worker(
        dir,
        home.onnxruntime_lib(),
        1,
        2,
    ))?;
    let target = collect_target(a, &tok)?;
    let pb = collect_progress(items.len());
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let s = match a.live_threshold {
        None => {
            let opts = CollectOptions {
                max_answer_tokens: a.max_answer_tokens,
                shard_prompts: 20,
                concurrency: 2,
            };
            rt.block_on(collect(pool, target, &tok, &items, &a.data, &opts, &pb))?
        }
        Some(threshold) => {
            anyhow::ensure!(
                (0.0..=1.0).contains(&threshold),
                "--live-threshold {threshold} is outside [0, 1]"
            );
            let engine = Engine::new(tok, target, eos);
            let opts = LiveOptions {
                max_tokens: a.max_answer_tokens,
                threshold,
                shard_prompts: 20,
                concurrency: 2,
            };
            rt.block_on(collect_live(
                pool,
                &engine,
                &ConfidenceVerifier,
                &items,
                &a.data,
                &opts,
                &pb,
            ))?
        }
    };
    pb.finish();
    eprintln!(
        "collected {} rows in {} new shards ({} shards already there) in {:.0?}",
        s.rows,
        s.shards_written,
        s.shards_skipped,
        started.elapsed()
    );
    Ok(())
}

/// The corpus's prompts to collect on (half code, half chat), rendered through the draft's
/// chat template and tokenised.
fn collect_items(
    a: &CollectArgs,
    tok: &Tokenizer,
    template: &ChatTemplate,
) -> anyhow::Result<Vec<CollectItem>> {
    let corpus = crate::corpus::load(&a.corpus)?;
    let half = a.prompts / 2;
    let code = crate::corpus::select(&corpus, "code", a.prompts - half);
    let chat = crate::corpus::select(&corpus, "chat", half);
    let mut items = Vec::new();
    for p in code.into_iter().chain(chat) {
        let messages = vec![ChatMessage::new("user".into(), p.prompt.clone())];
        let text = template.render(&messages)?;
        items.push(CollectItem {
            id: p.id,
            kind: u8::from(p.kind == "chat"),
            prompt: tok.encode(&text)?,
            messages: Arc::new(messages),
        });
    }
    Ok(items)
}

/// The target the flags name, patient with slow answers; refused when it cannot continue a
/// prefix.
fn collect_target(a: &CollectArgs, tok: &Tokenizer) -> anyhow::Result<Arc<dyn TargetClient>> {
    anyhow::ensure!(
        a.target_kind.can_continue(),
        "a {} target cannot continue a prefix: nothing to collect",
        a.target_kind.policy_name()
    );
    let api_key = a
        .target_api_key_env
        .as_ref()
        .and_then(|v| std::env::var(v).ok())
        .filter(|k| !k.is_empty());
    let cfg = crate::collect::patient_target(&a.target_url, api_key, &a.target_model);
    let text = TextSettings {
        prefix_style: a.prefix_style,
        chat_template: None,
    };
    Ok(approxy_verifier::targets::build(
        a.target_kind,
        cfg,
        tok,
        &text,
    )?)
}

/// A progress bar over `prompts` prompts.
fn collect_progress(prompts: usize) -> ProgressBar {
    let pb = ProgressBar::new(prompts as u64);
    pb.set_style(
        ProgressStyle::with_template("collect [{bar:30}] {pos}/{len} prompts {elapsed} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}
