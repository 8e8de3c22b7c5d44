//! `approxy train importance`: importance labels on HumanEval from a real llama-server target,
//! along the target's answers or approxy's live ones, in resumable shards (with `--chat`, on
//! chat prompts along the target's answers); and `approxy train importance-rows`: the draft's
//! features along the labelled answers.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use approxy_verifier::home::Home;
use approxy_verifier::{
    ConfidenceVerifier, Draft, DraftConfig, DraftPool, DraftWorkers, Engine, TargetClient,
    Tokenizer,
};

use approxy_verifier::template::{ChatMessage, ChatTemplate};

use crate::corpus::{held_out_chat, load_human_eval, select};
use crate::dataset::IMPORTANCE_UNKNOWN;
use crate::humaneval::{STOP, Sandbox, split_held_out};
use crate::importance::{Labeller, PathKind, label_shards, label_target, read_shard, rows_of};
use crate::importance_chat::{self, ChatPrompt, DEFAULT_MARGIN, InstructionJudge};
use crate::instructions::InstructionPrompt;

/// `approxy train importance` options.
#[derive(Debug, Clone, clap::Args)]
pub struct ImportanceArgs {
    /// The llama-server target's root URL.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub target_url: String,
    /// Where the label shards go (committed: they are the labels); by default
    /// `training/data/importance`, or `training/data/importance-chat` with `--chat`.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Label chat prompts instead of HumanEval: the corpus's chat prompts (but the chat
    /// sample's held-out ones); with `--instructions` or `--held-out`, a half of the
    /// instruction-following set.
    #[arg(long)]
    pub chat: bool,
    /// With `--chat`: how many of the corpus's chat prompts, taken from its sources in turn.
    #[arg(long, default_value_t = 48)]
    pub chat_prompts: usize,
    /// With `--chat`: label the instruction-following set's prompts after its held-out
    /// first 20 (shards `chat-instructions-target-*`) instead of the corpus's.
    #[arg(long)]
    pub instructions: bool,
    /// Where chat prompts come from.
    #[command(flatten)]
    pub sources: ChatSources,
    /// Label the held-out problems (shards named `held-out-*`) instead of the training ones;
    /// with `--chat`, the instruction-following set's first 20 prompts.
    #[arg(long)]
    pub held_out: bool,
    /// Label along approxy's live answers at this threshold (confidence verifier) instead of
    /// the target's own answers.
    #[arg(long)]
    pub live_threshold: Option<f32>,
    /// Label only the first N problems (or chat prompts) of the set (0: all).
    #[arg(long, default_value_t = 0)]
    pub problems: usize,
    /// Longest answer, in tokens (by default 256 on code, 96 on chat).
    #[arg(long)]
    pub max_answer_tokens: Option<u32>,
    /// Problems per shard.
    #[arg(long, default_value_t = 8)]
    pub shard_problems: usize,
}

/// Where chat prompts come from.
#[derive(Debug, Clone, clap::Args)]
pub struct ChatSources {
    /// The prompt corpus (chat prompts).
    #[arg(long, default_value = "training/data/prompts.jsonl")]
    pub corpus: PathBuf,
    /// The instruction-following set (chat prompts with instructions, and their checkers).
    #[arg(long, default_value = "tests/bench/instructions")]
    pub instructions_dir: PathBuf,
}

/// `approxy train importance-rows` options.
#[derive(Debug, Clone, clap::Args)]
pub struct ImportanceRowsArgs {
    /// The label shards (`approxy train importance --out`); by default
    /// `training/data/importance`, or `training/data/importance-chat` with `--chat`.
    #[arg(long)]
    pub labels: Option<PathBuf>,
    /// Chat labels (`approxy train importance --chat`).
    #[arg(long)]
    pub chat: bool,
    /// With `--chat`: nats per token the finished answer may lose against the target's own
    /// before a position counts as important.
    #[arg(long, default_value_t = DEFAULT_MARGIN)]
    pub margin: f64,
    /// Where chat prompts come from.
    #[command(flatten)]
    pub sources: ChatSources,
    /// Where the rows go: `train/` and `held-out/` below it, one rows shard per label shard
    /// (a rerun skips those there).
    #[arg(long)]
    pub out: PathBuf,
}

const CODE_LABELS: &str = "training/data/importance";
const CHAT_LABELS: &str = "training/data/importance-chat";

fn labels_dir(given: Option<&PathBuf>, chat: bool) -> PathBuf {
    given
        .cloned()
        .unwrap_or_else(|| PathBuf::from(if chat { CHAT_LABELS } else { CODE_LABELS }))
}

/// Which chat prompts to label along.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ChatSet {
    /// The corpus's chat prompts, the chat sample's held-out ones left out (the likelihood
    /// judges them: they carry no instructions).
    Corpus,
    /// The instruction-following set after its first [`HELD_OUT_INSTRUCTIONS`] (both judges).
    Instructions,
    /// Its first [`HELD_OUT_INSTRUCTIONS`]: the held-out chat labels.
    HeldOut,
}

impl ChatSet {
    fn shards(self) -> &'static str {
        match self {
            Self::Corpus => "chat-target",
            Self::Instructions => "chat-instructions-target",
            Self::HeldOut => "held-out-chat-target",
        }
    }
}

/// Instruction-following prompts whose labels no fit reads; the rest may train a router. A
/// router shipped from them would be judged on these alone.
const HELD_OUT_INSTRUCTIONS: usize = 20;

/// The prompts of `set`, rendered through the draft's chat template (the corpus's first `n`).
fn chat_prompts(
    home: &Home,
    tok: &Tokenizer,
    a: &ChatSources,
    n: usize,
    set: ChatSet,
) -> anyhow::Result<Vec<ChatPrompt>> {
    let template = ChatTemplate::from_file(&home.draft_onnx_dir().join("chat_template.jinja"))?;
    let render = |text: &str| -> anyhow::Result<Vec<u32>> {
        let messages = [ChatMessage::new("user".into(), text.to_string())];
        Ok(tok.encode(&template.render(&messages)?)?)
    };
    if set != ChatSet::Corpus {
        let path = a.instructions_dir.join("prompts.jsonl");
        let all = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let lines = all.lines().filter(|l| !l.trim().is_empty()).enumerate();
        let (skip, take) = match set {
            ChatSet::HeldOut => (0, HELD_OUT_INSTRUCTIONS),
            _ => (HELD_OUT_INSTRUCTIONS, usize::MAX),
        };
        return lines
            .skip(skip)
            .take(take)
            .map(|(i, l)| {
                let p: InstructionPrompt = serde_json::from_str(l)?;
                Ok(ChatPrompt {
                    tokens: render(&p.prompt)?,
                    id: p.id,
                    // Apart from the corpus's ids, which group the same rows.
                    number: 1_000_000 + i as u32,
                    instructions: true,
                })
            })
            .collect();
    }
    let all = crate::corpus::load(&a.corpus)?;
    let sample: HashSet<u32> = held_out_chat(&all, HELD_OUT_CHAT)
        .iter()
        .map(|p| p.id)
        .collect();
    select(&all, "chat", all.len())
        .into_iter()
        .filter(|p| !sample.contains(&p.id))
        .take(n)
        .map(|p| {
            Ok(ChatPrompt {
                id: p.id.to_string(),
                number: p.id,
                tokens: render(&p.prompt)?,
                instructions: false,
            })
        })
        .collect()
}

/// The chat sample's size (`approxy bench oracle --chat`, `bench calls`): no label is made on it.
const HELD_OUT_CHAT: usize = 40;

/// Computes the draft's features along every labelled answer.
pub fn run_importance_rows(a: &ImportanceRowsArgs) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let dir = home.draft_onnx_dir();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    let labels = labels_dir(a.labels.as_ref(), a.chat);
    let problems = if a.chat {
        Vec::new()
    } else {
        load_human_eval(&home.human_eval()).context("HumanEval (run `approxy setup`)")?
    };
    let chat = if a.chat {
        every_chat_prompt(&home, &tok, &a.sources)?
    } else {
        HashMap::new()
    };
    let pool = DraftPool::start(&DraftConfig::one_stream_per_worker(
        dir,
        home.onnxruntime_lib(),
        1,
        1,
    ))?;
    let files = label_files(&labels)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for f in files {
        let out = rows_path(&a.out, &f);
        if out.exists() {
            continue;
        }
        std::fs::create_dir_all(out.parent().unwrap_or(&a.out))?;
        let rows = rt.block_on(async {
            let lease = pool
                .try_lease()
                .ok_or_else(|| anyhow::anyhow!("no idle draft worker"))?;
            if a.chat {
                let answers = read_shard(&f)?;
                let meta = pool.meta();
                importance_chat::rows_of(lease.as_ref(), meta, &tok, &chat, &answers, a.margin)
                    .await
            } else {
                let answers = read_shard(&f)?;
                rows_of(lease.as_ref(), pool.meta(), &tok, &problems, &answers).await
            }
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

/// Every chat prompt a label can be on (the corpus's, the instruction set's and the held-out
/// ones), by id.
fn every_chat_prompt(
    home: &Home,
    tok: &Tokenizer,
    sources: &ChatSources,
) -> anyhow::Result<HashMap<String, ChatPrompt>> {
    Ok([ChatSet::Corpus, ChatSet::Instructions, ChatSet::HeldOut]
        .into_iter()
        .map(|set| chat_prompts(home, tok, sources, usize::MAX, set))
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .map(|p| (p.id.clone(), p))
        .collect())
}

/// The label files (`*.jsonl`) in `labels`, in name order.
fn label_files(labels: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(labels)
        .with_context(|| format!("reading {}", labels.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    Ok(files)
}

/// Where the rows of the label file `f` go under `out`: its split's directory (`held-out-`
/// files to `held-out`, others to `train`), as a shard `train fit` reads.
fn rows_path(out: &Path, f: &Path) -> PathBuf {
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
    out.join(set).join(file)
}

/// What labelling runs on: the draft (one worker), the llama-server target (greedy, patient,
/// retried), scratch space and a runtime.
struct Labelling {
    home: Home,
    tok: Tokenizer,
    pool: Arc<DraftPool>,
    target: Arc<dyn TargetClient>,
    scratch: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

impl Labelling {
    fn start(url: &str) -> anyhow::Result<Self> {
        let home = Home::from_env()?;
        let dir = home.draft_onnx_dir();
        let tok = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
        let pool = DraftPool::start(&DraftConfig::one_stream_per_worker(
            dir,
            home.onnxruntime_lib(),
            1,
            1,
        ))?;
        let target = label_target(url)?;
        Ok(Self {
            home,
            tok,
            pool,
            target,
            scratch: tempfile::tempdir()?,
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?,
        })
    }

    /// The labeller, two target calls in flight.
    async fn labeller<'a>(&'a self, max: u32, stops: &'a [&'a str]) -> Labeller<'a> {
        Labeller {
            target: self.target.as_ref(),
            tokenizer: &self.tok,
            sandbox: Sandbox::detect().await,
            scratch: self.scratch.path(),
            max_answer_tokens: max,
            stops,
            test_timeout: Duration::from_secs(10),
            concurrency: 2,
        }
    }

    fn lease(&self) -> anyhow::Result<Box<dyn Draft>> {
        self.pool
            .try_lease()
            .ok_or_else(|| anyhow::anyhow!("no idle draft worker"))
    }
}

/// Labels chat prompts along the target's answers (`--chat`).
fn run_chat_importance(a: &ImportanceArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.live_threshold.is_none(),
        "--chat labels along the target's answers only"
    );
    let run = Labelling::start(&a.target_url)?;
    let set = match (a.held_out, a.instructions) {
        (true, _) => ChatSet::HeldOut,
        (false, true) => ChatSet::Instructions,
        (false, false) => ChatSet::Corpus,
    };
    let mut prompts = chat_prompts(&run.home, &run.tok, &a.sources, a.chat_prompts, set)?;
    if a.problems > 0 {
        prompts.truncate(a.problems);
    }
    let out = labels_dir(a.out.as_ref(), true);
    let started = Instant::now();
    let labelled = run.rt.block_on(async {
        let labeller = run.labeller(a.max_answer_tokens.unwrap_or(96), &[]).await;
        let judge = InstructionJudge {
            home: &run.home,
            dir: &a.sources.instructions_dir,
            scratch: run.scratch.path(),
        };
        importance_chat::label_shards(
            &labeller,
            &judge,
            run.lease()?.as_ref(),
            &prompts,
            &out,
            set.shards(),
            a.shard_problems,
        )
        .await
    })?;
    let positions: usize = labelled.iter().map(|l| l.disagreements.len()).sum();
    let tokens: usize = labelled.iter().map(|l| l.answer.len()).sum();
    eprintln!(
        "labelled {} chat answers ({tokens} tokens, {positions} disagreements) in {:.0?}",
        labelled.len(),
        started.elapsed()
    );
    Ok(())
}

/// Labels the chosen problems.
pub fn run_importance(a: &ImportanceArgs) -> anyhow::Result<()> {
    if a.chat {
        return run_chat_importance(a);
    }
    let run = Labelling::start(&a.target_url)?;
    let (train, held) = split_held_out(
        load_human_eval(&run.home.human_eval()).context("HumanEval (run `approxy setup`)")?,
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
    let started = Instant::now();
    let labelled = run.rt.block_on(async {
        let labeller = run
            .labeller(a.max_answer_tokens.unwrap_or(256), &STOP)
            .await;
        let tok = &run.tok;
        let engine = Engine::new(
            tok.clone(),
            Arc::clone(&run.target),
            tok.end_of_sequence_ids(),
        );
        let prefix = if a.held_out { "held-out-" } else { "" };
        label_shards(
            &labeller,
            &engine,
            run.lease()?.as_ref(),
            &ConfidenceVerifier,
            path,
            &problems,
            &labels_dir(a.out.as_ref(), false),
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
