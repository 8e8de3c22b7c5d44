//! `approxy train collect` and `approxy train fit`: the commands, wiring this crate's
//! collection, fitting and report to the draft runtime, the chat template and the cache home.
//! Their flags are declared here, on the options (clap); the `approxy` binary parses them and
//! calls these.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use approxy_verifier::calibration::{
    AtBudget, Auc, AucReport, BudgetComparison, ByKind, Calibration, DataSummary, FORMAT,
    KindGrids, OtherHead, PromptSourceReport, SourceAtBudget, SourceReport,
};
use approxy_verifier::home::{DRAFT_GGUF_SHA256, Home};
use approxy_verifier::targets::{PrefixStyle, TargetKind, TextSettings};
use approxy_verifier::template::{ChatMessage, ChatTemplate};
use approxy_verifier::verify::learned::{Artifact, DEFAULT_CALIBRATION_TARGET};
use approxy_verifier::verify::{AcceptanceRule, LearnedVerifier, Verifier};
use approxy_verifier::{
    ConfidenceVerifier, DraftConfig, DraftPool, Engine, TargetClient, Tokenizer,
};

use crate::collect::{CollectItem, CollectOptions, LiveOptions, collect, collect_live};
use crate::dataset::{Rows, load_dir};
use crate::fit::{FitOptions, HeadKind, fit, is_held_out};
use crate::report::{Scored, at_budget, baseline, grid, roc_auc, standard_thresholds};

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

/// `--data`, else the default shard directory.
fn data_dir(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    default_data_dir().map(|d| flag.unwrap_or(d))
}

/// Collects training rows.
pub fn run_collect(a: &CollectArgs) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let dir = home.draft_onnx_dir();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    let template = ChatTemplate::from_file(&dir.join("chat_template.jinja"))?;
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
    let eos = tok.end_of_sequence_ids();
    let pool = DraftPool::start(&DraftConfig::one_stream_per_worker(
        dir,
        home.onnxruntime_lib(),
        1,
        2,
    ))?;
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
    let target: Arc<dyn TargetClient> =
        approxy_verifier::targets::build(a.target_kind, cfg, &tok, &text)?;
    let pb = ProgressBar::new(items.len() as u64);
    pb.set_style(
        ProgressStyle::with_template("collect [{bar:30}] {pos}/{len} prompts {elapsed} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
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

/// `approxy train fit` options.
#[derive(Debug, Clone, clap::Args)]
pub struct FitArgs {
    /// Shard directory (default: $APPROXY_HOME/training/rows).
    #[arg(long = "data", value_name = "DATA")]
    pub data_flag: Option<PathBuf>,
    /// The shard directory read: `--data`, or the default ([`FitArgs::with_data_dir`]).
    #[arg(skip)]
    pub data: PathBuf,
    /// Output directory.
    #[arg(long, default_value = "policies/verifier")]
    pub out_dir: PathBuf,
    /// Seed.
    // Of the split, the initialisation and the shuffling.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// The target model the rows came from (what a policy's `target.model` must say to use
    /// the head).
    #[arg(long, default_value = DEFAULT_CALIBRATION_TARGET)]
    pub target: String,
    /// The corpus the rows' prompts come from (for the report by source).
    // Left out of the report when the file cannot be read.
    #[arg(long, default_value = "training/data/prompts.jsonl")]
    pub corpus: PathBuf,
    /// The acceptance rule the head learns and is calibrated against: `identical` (the
    /// draft's token is the target's), `sprinter`, `sprinter-hard`, `ratio:R`,
    /// `typical:EPS,DELTA` (see "Acceptance rules" in training/README.md). Other than `identical`,
    /// it needs rows that carry the target's probabilities.
    #[arg(long, default_value = "identical", value_parser = parse_rule)]
    pub rule: AcceptanceRule,
}

impl FitArgs {
    /// These options with [`FitArgs::data`] filled in.
    pub fn with_data_dir(self) -> anyhow::Result<Self> {
        let data = data_dir(self.data_flag.clone())?;
        Ok(Self { data, ..self })
    }
}

/// An acceptance rule as `--rule` takes it (`typical`'s two parameters with a comma or, as
/// `approxy bench oracle --rules` takes them, a semicolon).
pub fn parse_rule(s: &str) -> Result<AcceptanceRule, String> {
    AcceptanceRule::parse(&s.replace(';', ","))
}

fn scored(v: &dyn Verifier, rows: &Rows, idx: &[usize]) -> Scored {
    let mut b = baseline(rows, idx);
    b.scores = idx
        .iter()
        .map(|&i| v.p_accept(&rows.features_of(i)))
        .collect();
    b
}

/// Scores and labels of the rows `keep` selects.
fn selected(s: &Scored, keep: impl Fn(usize) -> bool) -> (Vec<f32>, Vec<bool>) {
    (0..s.scores.len())
        .filter(|&i| keep(i))
        .map(|i| (s.scores[i], s.labels[i]))
        .unzip()
}

/// Scores and labels of one prompt kind (`None`: all).
fn of_kind(s: &Scored, k: Option<u8>) -> (Vec<f32>, Vec<bool>) {
    selected(s, |i| k.is_none_or(|k| s.kinds[i] == k))
}

/// AUC overall and per kind, over the rows `keep` selects.
fn aucs_where(s: &Scored, keep: impl Fn(usize) -> bool) -> Auc {
    let sub = |k: Option<u8>| {
        let (sc, lb) = selected(s, |i| keep(i) && k.is_none_or(|k| s.kinds[i] == k));
        roc_auc(&sc, &lb)
    };
    Auc {
        all: sub(None),
        code: sub(Some(0)),
        chat: sub(Some(1)),
    }
}

fn aucs(s: &Scored) -> Auc {
    aucs_where(s, |_| true)
}

/// The held-out rows split by how they were collected (empty sources left out).
fn by_source(base: &Scored, learned: &Scored) -> Vec<SourceReport> {
    [("teacher-forced", false), ("live", true)]
        .into_iter()
        .filter_map(|(name, live)| {
            let keep = |i: usize| base.live[i] == live;
            let (_, labels) = selected(base, keep);
            (!labels.is_empty()).then(|| SourceReport {
                source: name.to_string(),
                rows: labels.len(),
                agreement: labels.iter().filter(|l| **l).count() as f64 / labels.len() as f64,
                confidence: aucs_where(base, keep),
                learned: aucs_where(learned, keep),
            })
        })
        .collect()
}

/// The held-out rows by the corpus source of their prompt (`held` gives each scored row's
/// index in `rows`), code sources first, each kind's sources in corpus order; every policy's
/// budget applies each verifier's threshold for the source's kind (from `budgets`).
fn by_prompt_source(
    corpus: &[crate::corpus::CorpusPrompt],
    rows: &Rows,
    held: &[usize],
    base: &Scored,
    learned: (&str, &Scored),
    budgets: &[BudgetComparison],
) -> Vec<PromptSourceReport> {
    let source_of: std::collections::HashMap<u32, &str> =
        corpus.iter().map(|p| (p.id, p.source.as_str())).collect();
    let src: Vec<&str> = held
        .iter()
        .map(|&i| {
            source_of
                .get(&rows.prompt_ids[i])
                .copied()
                .unwrap_or("unknown")
        })
        .collect();
    ["code", "chat"]
        .into_iter()
        .flat_map(|kind| {
            crate::corpus::sources(corpus, kind)
                .into_iter()
                .map(move |s| (s, kind))
        })
        .filter_map(|(source, kind)| {
            let keep = |j: usize| src[j] == source;
            let (_, labels) = selected(base, keep);
            if labels.is_empty() {
                return None;
            }
            let prompts: std::collections::HashSet<u32> = (0..held.len())
                .filter(|&j| keep(j))
                .map(|j| rows.prompt_ids[held[j]])
                .collect();
            let auc = |s: &Scored| {
                let (sc, lb) = selected(s, keep);
                roc_auc(&sc, &lb)
            };
            let budgets = budgets
                .iter()
                .filter(|b| b.kind == kind)
                .map(|b| SourceAtBudget {
                    policy: b.policy.clone(),
                    verifiers: b
                        .verifiers
                        .iter()
                        .filter_map(|v| {
                            let s = if v.verifier == "confidence" {
                                base
                            } else if v.verifier == learned.0 {
                                learned.1
                            } else {
                                return None;
                            };
                            let p = grid(s, keep, &[v.threshold])[0];
                            Some(AtBudget {
                                verifier: v.verifier.clone(),
                                threshold: v.threshold,
                                accept_rate: p.accept_rate,
                                false_accept_rate: p.false_accept_rate,
                                target_calls_per_100_tokens: p.target_calls_per_100_tokens,
                            })
                        })
                        .collect(),
                })
                .collect();
            Some(PromptSourceReport {
                source: source.to_string(),
                kind: kind.to_string(),
                prompts: prompts.len(),
                rows: labels.len(),
                agreement: labels.iter().filter(|l| **l).count() as f64 / labels.len() as f64,
                confidence_auc: auc(base),
                learned_auc: auc(learned.1),
                budgets,
            })
        })
        .collect()
}

/// Fits both heads, picks the better on held-out AUC, writes artifact + calibration + report.
pub fn run_fit(a: &FitArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let rows = labelled_rows(a)?;
    let split = Split::new(&rows, a.seed);
    eprintln!(
        "{} rows: {} train, {} held out",
        rows.len(),
        split.train.len(),
        split.held.len()
    );
    let mut fitted = fit_heads(&rows, &split, a.seed)?;
    // Named only when it is not the shipped pair's target, so the committed artifact
    // regenerates byte for byte.
    fitted.best.artifact.target =
        (a.target != DEFAULT_CALIBRATION_TARGET).then(|| a.target.clone());
    fitted.best.artifact.rule = (a.rule != AcceptanceRule::Identical).then(|| a.rule.to_string());
    let calibration = calibration(a, &rows, &split, &fitted, started);
    write_fit(&a.out_dir, &fitted, &calibration)
}

/// The rows under `--data` labelled by `--rule`: those that carry what the rule is computed
/// from.
fn labelled_rows(a: &FitArgs) -> anyhow::Result<Rows> {
    let all = load_dir(&a.data)?;
    let rows = all.labelled_by(&a.rule);
    if rows.is_empty() {
        anyhow::bail!(
            "none of the {} rows in {} carries the target's probabilities, which the rule {} is computed from; collect again with a target that returns them (llama.cpp)",
            all.len(),
            a.data.display(),
            a.rule
        );
    }
    if rows.len() < all.len() {
        eprintln!(
            "rule {}: {} of {} rows carry the target's probabilities and are used",
            a.rule,
            rows.len(),
            all.len()
        );
    }
    Ok(rows)
}

/// The rows split by prompt, so no prompt's rows sit on both sides of a split.
struct Split {
    /// Rows the heads are fitted on.
    train: Vec<usize>,
    /// Rows that judge the chosen head, and nothing else.
    held: Vec<usize>,
    /// The training rows a head is fitted on while its weight decay is picked.
    fit: Vec<usize>,
    /// The training rows that pick the weight decay.
    validation: Vec<usize>,
}

impl Split {
    fn new(rows: &Rows, seed: u64) -> Self {
        let (held, train): (Vec<usize>, Vec<usize>) =
            (0..rows.len()).partition(|&i| is_held_out(rows.prompt_ids[i], seed));
        // Weight decay is picked on a validation fifth of the training prompts (never the
        // held-out split), then the head is refitted on all training rows.
        let (validation, fit): (Vec<usize>, Vec<usize>) = train
            .iter()
            .partition(|&&i| is_held_out(rows.prompt_ids[i], seed.wrapping_add(1)));
        Self {
            train,
            held,
            fit,
            validation,
        }
    }
}

/// One fitted head.
struct Candidate {
    /// Its kind, as the report names it.
    name: &'static str,
    /// The head, as written to `default.json`.
    artifact: Artifact,
    /// Its scores on the held-out rows.
    scores: Scored,
    /// Its held-out AUC.
    auc: Auc,
    /// Its validation AUC, which ranks the heads.
    validation_auc: f64,
}

/// The confidence baseline and every fitted head, scored on the held-out rows.
struct Fitted {
    /// The confidence verifier's scores.
    base: Scored,
    /// The confidence verifier's AUC.
    base_auc: Auc,
    /// The head with the best validation AUC.
    best: Candidate,
    /// The other heads.
    others: Vec<Candidate>,
}

/// The AUC that ranks verifiers: over all rows, 0 where undefined.
fn overall_auc(a: &Auc) -> f64 {
    a.all.unwrap_or(0.0)
}

/// Fits every head and ranks them against each other and the confidence baseline.
fn fit_heads(rows: &Rows, split: &Split, seed: u64) -> anyhow::Result<Fitted> {
    let base = baseline(rows, &split.held);
    // Every head with and without the answer's context, so the report shows what the context
    // adds on its own.
    let heads = [
        ("logistic", HeadKind::Logistic, true, false),
        ("mlp", HeadKind::Mlp(4), true, false),
        ("logistic-stats", HeadKind::Logistic, false, false),
        ("mlp-stats", HeadKind::Mlp(8), false, false),
        ("logistic+context", HeadKind::Logistic, true, true),
        ("mlp+context", HeadKind::Mlp(4), true, true),
        ("logistic-stats+context", HeadKind::Logistic, false, true),
        ("mlp-stats+context", HeadKind::Mlp(8), false, true),
    ];
    let mut candidates = Vec::new();
    for (name, kind, use_hidden, use_context) in heads {
        let opts = |wd: f32| FitOptions {
            kind,
            epochs: 20,
            batch: 128,
            learning_rate: 0.003,
            weight_decay: wd,
            seed,
            use_hidden,
            use_context,
        };
        candidates.push(fit_head(rows, split, name, opts)?);
    }
    let base_auc = aucs(&base);
    eprintln!("confidence baseline: held-out AUC {base_auc}");
    // The learned head is chosen on validation AUC; the held-out split only judges it.
    candidates.sort_by(|x, y| y.validation_auc.total_cmp(&x.validation_auc));
    let best = candidates.remove(0);
    Ok(Fitted {
        base,
        base_auc,
        best,
        others: candidates,
    })
}

/// Fits one head: its weight decay picked on the validation rows, then refitted on all
/// training rows and scored on the held-out ones.
fn fit_head(
    rows: &Rows,
    split: &Split,
    name: &'static str,
    opts: impl Fn(f32) -> FitOptions,
) -> anyhow::Result<Candidate> {
    let draft_sha = DRAFT_GGUF_SHA256;
    let mut best = (f64::NEG_INFINITY, 0.0f32);
    for wd in [0.0f32, 1e-3, 1e-2, 1e-1, 0.3, 1.0] {
        let v =
            LearnedVerifier::from_artifact(fit(rows, &split.fit, &opts(wd), draft_sha), draft_sha)?;
        let auc = overall_auc(&aucs(&scored(&v, rows, &split.validation)));
        if auc > best.0 {
            best = (auc, wd);
        }
    }
    let art = fit(rows, &split.train, &opts(best.1), draft_sha);
    let v = LearnedVerifier::from_artifact(art.clone(), draft_sha)?;
    let s = scored(&v, rows, &split.held);
    let auc = aucs(&s);
    eprintln!(
        "{name}: weight decay {} (validation AUC {:.4}); held-out AUC {auc}",
        best.1, best.0
    );
    Ok(Candidate {
        name,
        artifact: art,
        scores: s,
        auc,
        validation_auc: best.0,
    })
}

/// The best head on the other side of the context from `best` (with it when the best has
/// none, and the other way round), so the budget comparison shows what the context adds.
fn other_side<'a>(best: &Candidate, others: &'a [Candidate]) -> Option<(&'a str, &'a Scored)> {
    let reads_context = |a: &Artifact| !a.features.context.is_empty();
    others
        .iter()
        .find(|c| reads_context(&c.artifact) != reads_context(&best.artifact))
        .map(|c| (c.name, &c.scores))
}

/// Whether the best head replaces the confidence baseline.
fn learned_wins(fitted: &Fitted, budgets: &[BudgetComparison]) -> bool {
    // What a user pays for is target calls at the quality they asked for: a learned head
    // replaces the baseline only when, besides a higher AUC, it makes fewer calls than the
    // baseline at the default policy's budget on both kinds of prompt.
    let fewer_calls_at_default = budgets
        .iter()
        .filter(|b| b.policy == POLICY_BUDGETS[0].0)
        .all(|b| match (b.verifiers.first(), b.verifiers.get(1)) {
            (Some(base), Some(learned)) => {
                learned.target_calls_per_100_tokens < base.target_calls_per_100_tokens
            }
            _ => false,
        });
    overall_auc(&fitted.best.auc) > overall_auc(&fitted.base_auc) && fewer_calls_at_default
}

/// The calibration record of a fit: what was chosen, on which data, and every comparison the
/// report shows.
fn calibration(
    a: &FitArgs,
    rows: &Rows,
    split: &Split,
    fitted: &Fitted,
    started: Instant,
) -> Calibration {
    let (base, best) = (&fitted.base, &fitted.best);
    let budgets = budgets(
        base,
        (best.name, &best.scores),
        other_side(best, &fitted.others),
    );
    let learned_wins = learned_wins(fitted, &budgets);
    let chosen = if learned_wins {
        best.name
    } else {
        "confidence"
    };
    let chosen_scores = if learned_wins { &best.scores } else { base };
    let by_prompt_source = prompt_source_report(&a.corpus, rows, split, fitted, &budgets);
    let th = standard_thresholds();
    let by_kind_of = |s: &Scored, k: u8| grid(s, |i| s.kinds[i] == k, &th);
    let by_kind = |k: u8| KindGrids {
        learned: by_kind_of(&best.scores, k),
        confidence: by_kind_of(base, k),
    };
    Calibration {
        format: FORMAT.to_string(),
        rule: best.artifact.rule.clone(),
        chosen_verifier: chosen.to_string(),
        artifact: learned_wins.then(|| "default.json".to_string()),
        draft_sha256: DRAFT_GGUF_SHA256.to_string(),
        draft_build: Some(rows.draft_build.clone()),
        data: data_summary(rows, split, base, a.seed),
        auc: auc_report(fitted),
        thresholds: grid(chosen_scores, |_| true, &th),
        learned_thresholds: grid(&best.scores, |_| true, &th),
        confidence_thresholds: grid(base, |_| true, &th),
        by_kind: ByKind {
            code: by_kind(0),
            chat: by_kind(1),
        },
        budgets,
        by_source: by_source(base, &best.scores),
        by_prompt_source,
        rules: crate::rule_study::study(rows, &split.held),
        fit_seconds: started.elapsed().as_secs_f64(),
    }
}

/// The held-out rows by the corpus source of their prompt; empty, with a warning, when the
/// corpus cannot be read.
fn prompt_source_report(
    corpus: &std::path::Path,
    rows: &Rows,
    split: &Split,
    fitted: &Fitted,
    budgets: &[BudgetComparison],
) -> Vec<PromptSourceReport> {
    match crate::corpus::load(corpus) {
        Ok(corpus) => by_prompt_source(
            &corpus,
            rows,
            &split.held,
            &fitted.base,
            (fitted.best.name, &fitted.best.scores),
            budgets,
        ),
        Err(e) => {
            eprintln!("warning: no report by corpus source: {e}");
            Vec::new()
        }
    }
}

/// How many rows the fit used and how they split.
fn data_summary(rows: &Rows, split: &Split, base: &Scored, seed: u64) -> DataSummary {
    DataSummary {
        rows: rows.len(),
        train_rows: split.train.len(),
        held_out_rows: split.held.len(),
        held_out_code_rows: base.kinds.iter().filter(|k| **k == 0).count(),
        held_out_chat_rows: base.kinds.iter().filter(|k| **k == 1).count(),
        held_out_agreement: base.labels.iter().filter(|l| **l).count() as f64
            / base.labels.len().max(1) as f64,
        live_rows: rows.live_rows(),
        seed,
    }
}

/// Every verifier's held-out AUC.
fn auc_report(fitted: &Fitted) -> AucReport {
    AucReport {
        learned: fitted.best.auc,
        learned_kind: fitted.best.name.to_string(),
        confidence: fitted.base_auc,
        other_learned: fitted
            .others
            .iter()
            .map(|c| OtherHead {
                kind: c.name.to_string(),
                auc: c.auc,
            })
            .collect(),
    }
}

/// Writes the best head (`default.json`, even when the baseline is chosen), the calibration,
/// the report and its charts into `out_dir`.
fn write_fit(
    out_dir: &std::path::Path,
    fitted: &Fitted,
    calibration: &Calibration,
) -> anyhow::Result<()> {
    let th = standard_thresholds();
    std::fs::create_dir_all(out_dir)?;
    charts(
        out_dir,
        fitted.best.name,
        &fitted.best.scores,
        &fitted.base,
        &th,
    );
    std::fs::write(
        out_dir.join("default.json"),
        serde_json::to_vec(&fitted.best.artifact)?,
    )?;
    std::fs::write(
        out_dir.join("calibration.json"),
        calibration.to_json_pretty()?,
    )?;
    std::fs::write(out_dir.join("report.md"), markdown(calibration))?;
    eprintln!(
        "wrote {}/{{default.json,calibration.json,report.md,roc.png,thresholds.png}}; chosen: {}",
        out_dir.display(),
        calibration.chosen_verifier
    );
    Ok(())
}

/// A false-accept budget a shipped policy names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PolicyBudget {
    /// `max_false_accept_rate = x`.
    FalseAcceptRate(f32),
    /// `threshold = t` with the confidence verifier: the budget is the false-accept rate that
    /// threshold gives on the kind's held-out rows.
    ConfidenceThreshold(f32),
    /// `threshold = { code = c, chat = t }` with the confidence verifier: each kind's budget is
    /// the false-accept rate its own threshold gives on its held-out rows.
    ConfidenceByKind {
        /// On code prompts.
        code: f32,
        /// On chat prompts.
        chat: f32,
    },
}

impl PolicyBudget {
    /// The confidence threshold for prompts of `kind` (`"code"` or `"chat"`), when the policy
    /// names one.
    fn threshold(self, kind: &str) -> Option<f32> {
        match self {
            PolicyBudget::FalseAcceptRate(_) => None,
            PolicyBudget::ConfidenceThreshold(t) => Some(t),
            PolicyBudget::ConfidenceByKind { code, chat } => {
                Some(if kind == "code" { code } else { chat })
            }
        }
    }
}

/// The shipped policies' budgets (`policies/*.toml`; a test keeps the two in step).
pub const POLICY_BUDGETS: [(&str, PolicyBudget); 3] = [
    (
        "default",
        PolicyBudget::ConfidenceByKind {
            code: 0.85,
            chat: 0.9,
        },
    ),
    ("economy", PolicyBudget::ConfidenceThreshold(0.5)),
    ("strict", PolicyBudget::FalseAcceptRate(0.01)),
];

/// Each verifier at each policy's budget, by prompt kind: the baseline, the best learned
/// head, and the best on the other side of the context.
fn budgets(
    base: &Scored,
    learned: (&str, &Scored),
    other_side: Option<(&str, &Scored)>,
) -> Vec<BudgetComparison> {
    fn in_kind(s: &Scored, k: u8) -> impl Fn(usize) -> bool + '_ {
        move |i| s.kinds[i] == k
    }
    let mut out = Vec::new();
    for (policy, b) in POLICY_BUDGETS {
        for (kind, k) in [("code", 0u8), ("chat", 1u8)] {
            let (budget, source) = match (b, b.threshold(kind)) {
                (PolicyBudget::FalseAcceptRate(x), _) => (x, format!("max_false_accept_rate {x}")),
                (_, Some(t)) => (
                    grid(base, in_kind(base, k), &[t])[0].false_accept_rate,
                    format!("confidence at threshold {t}"),
                ),
                (_, None) => continue,
            };
            let verifiers = std::iter::once(("confidence", base))
                .chain(std::iter::once(learned))
                .chain(other_side)
                .map(|(name, s)| {
                    let p = at_budget(s, in_kind(s, k), budget);
                    AtBudget {
                        verifier: name.to_string(),
                        threshold: p.threshold,
                        accept_rate: p.accept_rate,
                        false_accept_rate: p.false_accept_rate,
                        target_calls_per_100_tokens: p.target_calls_per_100_tokens,
                    }
                })
                .collect();
            out.push(BudgetComparison {
                policy: policy.to_string(),
                source,
                kind: kind.to_string(),
                budget,
                verifiers,
            });
        }
    }
    out
}

/// ROC and threshold charts, split by prompt kind; skipped with a warning when no font exists.
fn charts(dir: &std::path::Path, learned: &str, l: &Scored, b: &Scored, th: &[f32]) {
    use crate::charts;
    use crate::report::roc_curve;
    if !charts::register_font() {
        eprintln!("warning: no DejaVu Sans font found; PNG charts skipped");
        return;
    }
    let mut curves = Vec::new();
    let mut grids = Vec::new();
    for (kname, k) in [("code", 0u8), ("chat", 1u8)] {
        for (vname, s) in [(learned, l), ("confidence", b)] {
            let (sc, lb) = of_kind(s, Some(k));
            curves.push((
                format!(
                    "{vname}, {kname} (AUC {:.3})",
                    roc_auc(&sc, &lb).unwrap_or(f64::NAN)
                ),
                roc_curve(&sc, &lb),
            ));
            grids.push((
                format!("{vname}, {kname}"),
                grid(s, |i| s.kinds[i] == k, th),
            ));
        }
    }
    if let Err(e) = charts::roc(
        &dir.join("roc.png"),
        "Verifier ROC on held-out prompts",
        &curves,
    ) {
        eprintln!("warning: roc.png: {e}");
    }
    if let Err(e) = charts::thresholds(
        &dir.join("thresholds.png"),
        "False-accept rate and target calls against threshold",
        &grids,
    ) {
        eprintln!("warning: thresholds.png: {e}");
    }
}

fn f(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |x| format!("{x:.4}"))
}

/// The Markdown report, generated from the calibration.
pub fn markdown(c: &Calibration) -> String {
    let mut s = String::new();
    let a = &c.auc;
    let d = &c.data;
    s.push_str("# Verifier calibration report\n\nGenerated by `approxy train fit` from the rows that `approxy train collect` gathered (see `training/scripts/train-default.sh`). ");
    let agrees = match &c.rule {
        None => "the draft agrees with the target on".to_string(),
        Some(r) => format!("the rule `{r}` accepts the draft's token at"),
    };
    s.push_str(&format!(
        "{} rows ({} teacher-forced, {} along live decodes), {} held out by prompt ({} code, {} chat); {agrees} {:.1} % of held-out positions. ",
        d.rows, d.rows - d.live_rows, d.live_rows, d.held_out_rows, d.held_out_code_rows, d.held_out_chat_rows, d.held_out_agreement * 100.0
    ));
    if let Some(r) = &c.rule {
        s.push_str(&format!(
            "Labels follow the acceptance rule `{r}`, not token identity: a row is a positive when the target's top-20 probabilities at its position accept the draft's token under that rule (`verifier/src/verify/rule.rs`; a token outside the top-20 is a negative; `sprinter`'s soft label counts as accepted at 0.5 or more), so every false-accept rate below counts accepted draft tokens the rule rejects. Only rows that carry the target's probabilities are used. "
        ));
    }
    if c.by_prompt_source.is_empty() {
        s.push_str("Code prompts come from CPython standard-library docstrings, chat prompts from question templates over everyday topics (`training/scripts/build_corpus.py`): each kind is one source.\n\n");
    } else {
        let names = |kind: &str| {
            c.by_prompt_source
                .iter()
                .filter(|r| r.kind == kind)
                .map(|r| format!("`{}`", r.source))
                .collect::<Vec<_>>()
                .join(", ")
        };
        s.push_str(&format!(
            "Code prompts come from {}, chat prompts from {} (`training/scripts/build_corpus.py` says what each is); \"By prompt source\" below reports each.\n\n",
            names("code"),
            names("chat")
        ));
    }
    s.push_str(
        "## ROC AUC on the held-out split\n\nA head's name says what it reads besides the draft's logit statistics: `-stats` nothing else, otherwise the hidden state; `+context` the answer's context (position, code block, the draft's agreement over the last tokens, entropy trend, the last emitted token's gap; `verifier/src/verify/context.rs`).\n\n| verifier | all | code | chat |\n|---|---|---|---|\n",
    );
    let row = |label: String, auc: &Auc| {
        format!(
            "| {label} | {} | {} | {} |\n",
            f(auc.all),
            f(auc.code),
            f(auc.chat)
        )
    };
    s.push_str(&row(
        format!("learned, best on validation ({})", a.learned_kind),
        &a.learned,
    ));
    for o in &a.other_learned {
        s.push_str(&row(format!("learned ({})", o.kind), &o.auc));
    }
    s.push_str(&row("draft confidence (baseline)".into(), &a.confidence));
    for (k, l, b) in [
        ("all", a.learned.all, a.confidence.all),
        ("code", a.learned.code, a.confidence.code),
        ("chat", a.learned.chat, a.confidence.chat),
    ] {
        if let (Some(l), Some(b)) = (l, b) {
            let verdict = if l > b {
                "higher"
            } else if l == b {
                "equal"
            } else {
                "LOWER"
            };
            s.push_str(&format!("\nOn {k} prompts the learned verifier's AUC is {verdict} than the baseline's by {:+.4}.", l - b));
        }
    }
    s.push_str(&source_section(c));
    s.push_str(&budget_section(c));
    s.push_str(&prompt_source_section(c));
    s.push_str(&rule_section(c));
    s.push_str(&format!(
        "\n\nChosen for the default policy: **{}**. A learned head is chosen only when its AUC is higher than the baseline's and it makes fewer target calls at the default policy's budget on code and on chat.\n",
        c.chosen_verifier
    ));
    s.push_str("\n![ROC curves](roc.png)\n\n![False-accept rate and target calls against threshold](thresholds.png)\n");
    let far = match &c.rule {
        None => "the target would not have produced".to_string(),
        Some(r) => format!("the rule `{r}` rejects"),
    };
    for (title, grids) in [("code", &c.by_kind.code), ("chat", &c.by_kind.chat)] {
        s.push_str(&format!(
            "\n## Thresholds on {title} prompts\n\nFAR = false-accept rate: share of accepted draft tokens {far}. Calls = target calls per 100 output tokens (one correction token per rejection, no bail-out).\n\n| threshold | learned accept | learned FAR | learned calls | baseline accept | baseline FAR | baseline calls |\n|---|---|---|---|---|---|---|\n"
        ));
        for (x, y) in grids.learned.iter().zip(&grids.confidence) {
            s.push_str(&format!(
                "| {:.2} | {:.3} | {:.4} | {:.1} | {:.3} | {:.4} | {:.1} |\n",
                x.threshold,
                x.accept_rate,
                x.false_accept_rate,
                x.target_calls_per_100_tokens,
                y.accept_rate,
                y.false_accept_rate,
                y.target_calls_per_100_tokens
            ));
        }
    }
    s
}

/// AUC by how the held-out rows were collected.
fn source_section(c: &Calibration) -> String {
    let mut s = String::new();
    if c.by_source.is_empty() {
        return s;
    }
    s.push_str(&format!("\n\n## By source\n\nTeacher-forced rows follow the target's own answers; live rows follow the decode loop at threshold 0.7, including positions after a wrongly accepted draft token. Learned = {}.\n\n| source | held-out rows | draft agrees | confidence AUC all / code / chat | learned AUC all / code / chat |\n|---|---|---|---|---|\n", c.auc.learned_kind));
    let three = |a: &Auc| format!("{} / {} / {}", f(a.all), f(a.code), f(a.chat));
    for r in &c.by_source {
        s.push_str(&format!(
            "| {} | {} | {:.1} % | {} | {} |\n",
            r.source,
            r.rows,
            r.agreement * 100.0,
            three(&r.confidence),
            three(&r.learned)
        ));
    }
    s.truncate(s.trim_end().len());
    s
}

/// AUC and each policy's dial by the corpus source of the held-out prompts.
fn prompt_source_section(c: &Calibration) -> String {
    let mut s = String::new();
    if c.by_prompt_source.is_empty() {
        return s;
    }
    let learned = &c.auc.learned_kind;
    s.push_str(&format!("\n\n## By prompt source\n\nThe held-out rows by where their prompt comes from (teacher-forced and live together). Learned = {learned}.\n\n| source | kind | held-out prompts | rows | draft agrees | confidence AUC | learned AUC |\n|---|---|---|---|---|---|---|\n"));
    for r in &c.by_prompt_source {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {:.1} % | {} | {} |\n",
            r.source,
            r.kind,
            r.prompts,
            r.rows,
            r.agreement * 100.0,
            f(r.confidence_auc),
            f(r.learned_auc)
        ));
    }
    s.push_str("\nEach policy's threshold for the kind (from the budgets table above, one per kind and verifier) applied to each source's rows: what the dial gives on prompts like these. Accept / FAR / calls per 100 tokens.\n\n| source | policy | confidence: threshold, accept / FAR / calls | learned: threshold, accept / FAR / calls |\n|---|---|---|---|\n");
    let cell = |v: Option<&AtBudget>| {
        v.map_or("n/a".to_string(), |v| {
            format!(
                "{:.3}, {:.3} / {:.4} / {:.1}",
                v.threshold, v.accept_rate, v.false_accept_rate, v.target_calls_per_100_tokens
            )
        })
    };
    for r in &c.by_prompt_source {
        for b in &r.budgets {
            s.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                r.source,
                b.policy,
                cell(b.verifiers.iter().find(|v| v.verifier == "confidence")),
                cell(b.verifiers.iter().find(|v| v.verifier == *learned))
            ));
        }
    }
    s.truncate(s.trim_end().len());
    s
}

/// What each acceptance rule accepts, from the target's probabilities on the held-out rows.
fn rule_section(c: &Calibration) -> String {
    let mut s = String::new();
    if c.rules.is_empty() {
        return s;
    }
    s.push_str("\n\n## Acceptance rules\n\nOn the held-out rows that carry the target's top-20 log-probabilities: the share each rule accepts (`sprinter`: the mean acceptance chance min(1, p/q)), the draft confidence's ROC AUC against the rule, and the share of positions the confidence can accept with at most 5 % of the accepted rejected by the rule. A draft token outside the target's top-20 counts as rejected by every rule (`verifier/src/verify/rule.rs`).\n\n| rule | kind | rows | accepted by the rule | confidence AUC | confidence accepts at 5 % |\n|---|---|---|---|---|---|\n");
    for r in &c.rules {
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} % | {} | {:.1} % |\n",
            r.rule,
            r.kind,
            r.rows,
            100.0 * r.positive,
            f(r.confidence_auc),
            100.0 * r.confidence_accept_at_5_percent
        ));
    }
    s.truncate(s.trim_end().len());
    s
}

/// The verifiers at the policies' budgets, and where the verifier's goal stands.
fn budget_section(c: &Calibration) -> String {
    let mut s = String::new();
    if c.budgets.is_empty() {
        return s;
    }
    s.push_str("\n\n## At the false-accept budgets the policies name\n\nFor each verifier, the lowest threshold whose false-accept rate on the kind's held-out rows stays within the budget (chosen on those rows, for every verifier alike), and what it gives. Calls = target calls per 100 output tokens with one correction token per rejection.\n\n| policy | kind | budget | verifier | threshold | accept | FAR | calls | calls vs confidence |\n|---|---|---|---|---|---|---|---|---|\n");
    for b in &c.budgets {
        let base = b
            .verifiers
            .first()
            .map_or(0.0, |v| v.target_calls_per_100_tokens);
        for v in &b.verifiers {
            let vs = if base > 0.0 {
                format!(
                    "{:+.1} %",
                    (v.target_calls_per_100_tokens / base - 1.0) * 100.0
                )
            } else {
                "n/a".into()
            };
            s.push_str(&format!(
                "| {} | {} | {:.4} ({}) | {} | {:.3} | {:.3} | {:.4} | {:.1} | {} |\n",
                b.policy,
                b.kind,
                b.budget,
                b.source,
                v.verifier,
                v.threshold,
                v.accept_rate,
                v.false_accept_rate,
                v.target_calls_per_100_tokens,
                vs
            ));
        }
    }
    s.push_str("\nGoal: at the default policy's budget, at least 25 % fewer target calls than the confidence baseline, and an AUC at least 0.02 higher, on code and on chat.\n");
    for kind in ["code", "chat"] {
        let Some(b) = c
            .budgets
            .iter()
            .find(|b| b.policy == "default" && b.kind == kind)
        else {
            continue;
        };
        let (Some(base), Some(learned)) = (b.verifiers.first(), b.verifiers.get(1)) else {
            continue;
        };
        let fewer = if base.target_calls_per_100_tokens > 0.0 {
            (1.0 - learned.target_calls_per_100_tokens / base.target_calls_per_100_tokens) * 100.0
        } else {
            0.0
        };
        let calls = if fewer >= 0.0 {
            format!("{fewer:.1} % fewer calls")
        } else {
            format!("{:.1} % more calls", -fewer)
        };
        let (l, bs) = match kind {
            "code" => (c.auc.learned.code, c.auc.confidence.code),
            _ => (c.auc.learned.chat, c.auc.confidence.chat),
        };
        let gain = l.zip(bs).map_or(f64::NAN, |(l, b)| l - b);
        let met = |ok: bool| if ok { "met" } else { "NOT met" };
        s.push_str(&format!(
            "- {kind}: {} makes {calls} than the baseline ({}; goal 25 % fewer), AUC {gain:+.4} ({}; goal +0.02).\n",
            learned.verifier,
            met(fewer >= 25.0),
            met(gain >= 0.02)
        ));
    }
    s.truncate(s.trim_end().len());
    s
}

/// Default data directory for collected rows.
pub fn default_data_dir() -> anyhow::Result<PathBuf> {
    Ok(Home::from_env()?.root.join("training").join("rows"))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn by_prompt_source_applies_each_kinds_threshold_to_each_source() {
        let p = |id: u32, kind: &str, source: &str| crate::corpus::CorpusPrompt {
            id,
            kind: kind.into(),
            source: source.into(),
            prompt: String::new(),
        };
        let corpus = [
            p(1, "code", "a"),
            p(2, "code", "b"),
            p(3, "chat", "x"),
            p(4, "chat", "y"),
        ];
        let mut rows = Rows::new(0);
        // Row 0 is a training row; rows 1-4 are held out.
        rows.prompt_ids = vec![9, 1, 1, 2, 3];
        let held = [1, 2, 3, 4];
        let scored = |scores: Vec<f32>| Scored {
            scores,
            labels: vec![true, false, true, true],
            kinds: vec![0, 0, 0, 1],
            live: vec![false; 4],
        };
        let (base, learned) = (
            scored(vec![0.9, 0.6, 0.4, 0.8]),
            scored(vec![0.9, 0.2, 0.7, 0.1]),
        );
        let at = |verifier: &str, threshold: f32| AtBudget {
            verifier: verifier.into(),
            threshold,
            accept_rate: 0.0,
            false_accept_rate: 0.0,
            target_calls_per_100_tokens: 0.0,
        };
        let budgets = ["code", "chat"].map(|kind| BudgetComparison {
            policy: "default".into(),
            source: String::new(),
            kind: kind.into(),
            budget: 0.1,
            verifiers: vec![at("confidence", 0.5), at("mlp", 0.5), at("other", 0.5)],
        });
        let r = by_prompt_source(&corpus, &rows, &held, &base, ("mlp", &learned), &budgets);
        // `y` has no held-out row.
        let names: Vec<&str> = r.iter().map(|r| r.source.as_str()).collect();
        assert_eq!(names, ["a", "b", "x"]);
        let a = &r[0];
        assert_eq!((a.kind.as_str(), a.prompts, a.rows), ("code", 1, 2));
        assert_eq!(a.agreement, 0.5);
        assert_eq!((a.confidence_auc, a.learned_auc), (Some(1.0), Some(1.0)));
        // One policy of the code kind, the two verifiers the report compares.
        assert_eq!(a.budgets.len(), 1);
        let v = &a.budgets[0].verifiers;
        assert_eq!(v.len(), 2);
        // At 0.5 the baseline accepts both of a's rows (one wrongly), the head only the right one.
        assert_eq!((v[0].accept_rate, v[0].false_accept_rate), (1.0, 0.5));
        assert_eq!((v[1].accept_rate, v[1].false_accept_rate), (0.5, 0.0));
        assert_eq!(r[1].budgets[0].verifiers[1].accept_rate, 1.0);
        assert_eq!(r[2].kind, "chat");
        assert_eq!(r[2].budgets[0].verifiers[1].accept_rate, 0.0);
        let c = Calibration {
            by_prompt_source: r,
            ..Calibration::load(
                &Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../policies/verifier/calibration.json"),
            )
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let md = markdown(&c);
        assert!(md.contains("Code prompts come from `a`, `b`, chat prompts from `x`"));
        assert!(
            md.contains("| a | code | 1 | 2 | 50.0 % | 1.0000 | 1.0000 |"),
            "{md}"
        );
        assert!(
            md.contains("| a | default | 0.500, 1.000 / 0.5000 / 0.0 |"),
            "{md}"
        );
    }

    #[test]
    fn committed_report_regenerates_from_committed_calibration() -> Result<(), String> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/verifier");
        let c = Calibration::load(&dir.join("calibration.json"))?;
        let committed =
            std::fs::read_to_string(dir.join("report.md")).map_err(|e| e.to_string())?;
        assert_eq!(markdown(&c), committed);
        Ok(())
    }

    /// A calibration for a rule other than identity says so, and defines its false accepts
    /// against that rule; the identity report does not mention a rule.
    #[test]
    fn a_rules_report_names_the_rule_its_false_accepts_are_against() -> Result<(), String> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/verifier");
        let c = Calibration::load(&dir.join("calibration.json"))?;
        let identity = markdown(&c);
        assert!(!identity.contains("Labels follow the acceptance rule"));
        assert!(
            identity.contains("share of accepted draft tokens the target would not have produced")
        );
        let ratio = markdown(&Calibration {
            rule: Some("ratio:0.5".into()),
            ..c
        });
        assert!(
            ratio.contains("Labels follow the acceptance rule `ratio:0.5`, not token identity")
        );
        assert!(ratio.contains("the rule `ratio:0.5` accepts the draft's token at"));
        assert!(ratio.contains("share of accepted draft tokens the rule `ratio:0.5` rejects"));
        Ok(())
    }

    /// The budgets the report compares at are the ones the shipped policies name.
    #[test]
    fn policy_budgets_match_the_policy_files() -> Result<(), String> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        for (policy, budget) in POLICY_BUDGETS {
            let text = std::fs::read_to_string(dir.join(format!("{policy}.toml")))
                .map_err(|e| e.to_string())?;
            let v: toml::Value = toml::from_str(&text).map_err(|e| e.to_string())?;
            let m = &v["models"]["*"];
            let num = |k: &str| m.get(k).and_then(toml::Value::as_float).map(|x| x as f32);
            match budget {
                PolicyBudget::FalseAcceptRate(x) => {
                    assert_eq!(num("max_false_accept_rate"), Some(x), "{policy}")
                }
                PolicyBudget::ConfidenceThreshold(_) | PolicyBudget::ConfidenceByKind { .. } => {
                    for kind in ["code", "chat"] {
                        // One number for every kind, or a table per kind.
                        let t = num("threshold").or_else(|| {
                            m.get("threshold")
                                .and_then(|t| t.get(kind))
                                .and_then(toml::Value::as_float)
                                .map(|x| x as f32)
                        });
                        assert_eq!(t, budget.threshold(kind), "{policy} {kind}");
                    }
                    assert_eq!(
                        m.get("verifier").and_then(toml::Value::as_str),
                        Some("confidence"),
                        "{policy}"
                    );
                }
            }
        }
        Ok(())
    }
}
