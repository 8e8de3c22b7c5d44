//! `approxy bench draft-fidelity`: how closely each conversion of the draft follows the target,
//! and what it costs. The target's greedy answers to the calibration's held-out prompts are
//! taken once; then each variant (the shipped int4 and those `approxy setup --draft-variants`
//! builds) is teacher-forced over them in a process of its own, which reports, per kind, the
//! share of positions where the draft's top token is the target's, its decode speed with each
//! thread count, and its peak memory; its size on disk is read from its files.
//!
//! Which variant to ship (the fidelity rule): the most agreement per millisecond among those
//! within 1.3x of the shipped draft's milliseconds per token, measured in the same run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use approxy_setup::Home;
use approxy_setup::assets::{DRAFT_VARIANTS, DraftVariant, SHIPPED_DRAFT_VARIANT};
use approxy_training::corpus::CorpusPrompt;
use approxy_verifier::sampling::argmax;
use approxy_verifier::targets::{ContinuationRequest, TargetClient};
use approxy_verifier::template::{ChatMessage, ChatTemplate};
use approxy_verifier::{DraftConfig, DraftPool, DraftWorkers, Tokenizer};

use super::draft::{PROMPT, decode_speed};
use super::machine::{Machine, utc_now};
use super::servers::{self, Layout};
use super::stats;

/// The sample is drawn from the first 100 prompts of each kind, the templated sources (what
/// `training/scripts/train-default.sh` collected on when the fidelity table was first measured; it keeps
/// this sample so the table stays comparable) ...
pub const CALIBRATION_PROMPTS: usize = 200;
/// ... held out by the seed `approxy train fit` splits with, so no verifier was fitted on them.
pub const SPLIT_SEED: u64 = 7;

/// The target the answers come from: the benchmark's llama-server with the local default
/// target (the model the shipped calibration was labelled by).
const TARGET_MODEL: &str = approxy_verifier::verify::learned::DEFAULT_CALIBRATION_TARGET;

/// A variant may be at most this much slower per token than the shipped draft to be chosen.
pub const MAX_SLOWDOWN: f64 = 1.3;

/// Options of the sweep.
#[derive(Debug, Clone, clap::Args)]
pub struct FidelityOptions {
    /// Held-out calibration prompts per kind (code, chat).
    #[arg(long, default_value_t = 12)]
    pub per_kind: usize,
    /// Longest target answer per prompt.
    #[arg(long, default_value_t = 96)]
    pub max_answer_tokens: u32,
    /// Thread counts the decode speed is measured with.
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Decode steps per speed run.
    #[arg(long, default_value_t = 64)]
    pub decode_tokens: usize,
    /// Speed runs (after one warm-up).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// The training corpus (its held-out prompts are the sample).
    #[arg(long, default_value = "training/data/prompts.jsonl")]
    pub corpus: PathBuf,
    /// Results directory.
    #[arg(long, default_value = "tests/bench/results/draft-fidelity")]
    pub out: PathBuf,
    /// Ignore saved answers and measurements.
    #[arg(long)]
    pub fresh: bool,
    /// Only these variants, comma-separated (default: all): int4-b128-acc4 (shipped), fp32,
    /// int4-b32-acc4, int4-b32-acc1, int8.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// The target's greedy answer to one held-out prompt, as token ids (its end-of-sequence
/// included when it ended: where to stop is a prediction too).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Answer {
    /// Corpus id.
    pub id: u32,
    /// `code` or `chat`.
    pub kind: String,
    /// The prompt, chat template applied.
    pub prompt: Vec<u32>,
    /// The target's answer.
    pub answer: Vec<u32>,
}

/// The teacher-forcing set, saved so every variant (and a rerun) sees the same positions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answers {
    /// The target model.
    pub target: String,
    /// Answer limit they were taken with.
    pub max_answer_tokens: u32,
    /// One per prompt.
    pub answers: Vec<Answer>,
}

/// What the measuring process reports for one variant.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Measured {
    /// Per kind: (positions where the draft's top token is the target's, positions).
    pub agree: BTreeMap<String, (u64, u64)>,
    /// Per thread count: milliseconds per greedy decode step.
    pub ms_per_token: BTreeMap<usize, f64>,
    /// Per thread count: milliseconds to prefill the speed prompt.
    pub prefill_ms: BTreeMap<usize, f64>,
    /// Peak resident memory of the measuring process (the draft loaded once per thread count,
    /// one at a time), bytes.
    pub peak_rss_bytes: u64,
}

/// One variant's row of the report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VariantResult {
    /// Short name.
    pub name: String,
    /// What it is.
    pub about: String,
    /// Whether it is the draft approxy ships.
    pub shipped: bool,
    /// Size of its model files, bytes.
    pub disk_bytes: u64,
    /// Its measurements.
    pub measured: Measured,
}

impl VariantResult {
    /// Top-1 agreement on `kind` (`None`: all positions).
    pub fn agreement(&self, kind: Option<&str>) -> Option<f64> {
        let (a, n) = self
            .measured
            .agree
            .iter()
            .filter(|(k, _)| kind.is_none_or(|want| want == k.as_str()))
            .fold((0, 0), |(a, n), (_, (x, y))| (a + x, n + y));
        (n > 0).then(|| a as f64 / n as f64)
    }

    /// Milliseconds per token with `threads` threads.
    pub fn ms(&self, threads: usize) -> Option<f64> {
        self.measured.ms_per_token.get(&threads).copied()
    }
}

/// The sweep's results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FidelityReport {
    /// Where it ran.
    pub machine: Machine,
    /// When.
    pub date: String,
    /// The target the answers came from.
    pub target: String,
    /// Prompts per kind.
    pub per_kind: usize,
    /// Answer limit.
    pub max_answer_tokens: u32,
    /// Decode steps per speed run.
    pub decode_tokens: usize,
    /// Every variant, the shipped one first.
    pub variants: Vec<VariantResult>,
}

/// The fidelity sample: of the first [`CALIBRATION_PROMPTS`]` / 2` prompts of each kind, the first
/// `per_kind` the calibration's split holds out.
pub fn held_out_prompts(corpus: &[CorpusPrompt], per_kind: usize) -> Vec<CorpusPrompt> {
    ["code", "chat"]
        .iter()
        .flat_map(|kind| {
            corpus
                .iter()
                .filter(move |p| p.kind == *kind)
                .take(CALIBRATION_PROMPTS / 2)
                .filter(|p| approxy_training::fit::is_held_out(p.id, SPLIT_SEED))
                .take(per_kind)
                .cloned()
        })
        .collect()
}

/// The variant the fidelity rule picks: within [`MAX_SLOWDOWN`] of the shipped draft's ms/token
/// at `threads`, the most agreement per millisecond.
pub fn choose(vs: &[VariantResult], threads: usize) -> Option<&VariantResult> {
    let base = vs.iter().find(|v| v.shipped)?.ms(threads)?;
    let score = |v: &VariantResult| Some(v.agreement(None)? / v.ms(threads)?);
    vs.iter()
        .filter(|v| v.ms(threads).is_some_and(|ms| ms <= MAX_SLOWDOWN * base))
        .filter_map(|v| Some((score(v)?, v)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, v)| v)
}

/// Runs the sweep: answers (taken or reused), each variant measured (or reused), the report.
pub async fn run(opts: &FidelityOptions) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let all = wanted_variants(&home, opts)?;
    std::fs::create_dir_all(opts.out.join("raw"))?;
    let answers_path = opts.out.join("answers.json");
    let answers = answers(&home, opts, &answers_path).await?;
    let exe = std::env::current_exe()?;
    let mut variants = Vec::new();
    for (v, dir) in all {
        variants.push(measure_variant(opts, &exe, &answers_path, v, &dir).await?);
    }
    let report = FidelityReport {
        machine: Machine::read(),
        date: utc_now(),
        target: answers.target.clone(),
        per_kind: opts.per_kind,
        max_answer_tokens: opts.max_answer_tokens,
        decode_tokens: opts.decode_tokens,
        variants,
    };
    std::fs::write(
        opts.out.join("fidelity.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    let md = markdown(&report, &answers);
    std::fs::write(opts.out.join("fidelity.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// The variants `--only` names (all by default, the shipped one first) and their directories;
/// an error for a name there is no variant of, or a variant not built.
fn wanted_variants(
    home: &Home,
    opts: &FidelityOptions,
) -> anyhow::Result<Vec<(DraftVariant, PathBuf)>> {
    let mut all = vec![(SHIPPED_DRAFT_VARIANT, home.draft_onnx_dir())];
    all.extend(
        DRAFT_VARIANTS
            .iter()
            .map(|v| (*v, home.draft_variant_dir(v.name))),
    );
    for name in &opts.only {
        anyhow::ensure!(
            all.iter().any(|(v, _)| v.name == name),
            "no variant {name:?}; there are: {}",
            all.iter()
                .map(|(v, _)| v.name)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    all.retain(|(v, _)| opts.only.is_empty() || opts.only.iter().any(|n| n == v.name));
    for (v, dir) in &all {
        anyhow::ensure!(
            dir.join(approxy_verifier::draft::DRAFT_GRAPH).is_file(),
            "no {} draft at {}: run `approxy setup --draft-variants` (tests/bench/scripts/bench-draft-fidelity.sh does)",
            v.name,
            dir.display()
        );
    }
    Ok(all)
}

/// The target's answers saved at `answers_path` when they are for this sample and limit, else
/// taken anew (and the measurements on the old ones dropped).
async fn answers(
    home: &Home,
    opts: &FidelityOptions,
    answers_path: &Path,
) -> anyhow::Result<Answers> {
    let prompts = held_out_prompts(
        &approxy_training::corpus::load(&opts.corpus)?,
        opts.per_kind,
    );
    let saved: Option<Answers> = std::fs::read(answers_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|a: &Answers| {
            !opts.fresh
                && a.max_answer_tokens == opts.max_answer_tokens
                && a.answers
                    .iter()
                    .map(|x| x.id)
                    .eq(prompts.iter().map(|p| p.id))
        });
    Ok(match saved {
        Some(a) => a,
        None => {
            let a = take_answers(home, &prompts, opts.max_answer_tokens).await?;
            std::fs::write(answers_path, serde_json::to_vec_pretty(&a)?)?;
            // Measurements on other answers are not comparable.
            let _ = std::fs::remove_dir_all(opts.out.join("raw"));
            std::fs::create_dir_all(opts.out.join("raw"))?;
            a
        }
    })
}

/// One variant's result: its measurements saved under `raw/` when they cover every thread
/// count asked for, else measured anew in a process of its own (`exe`, this binary).
async fn measure_variant(
    opts: &FidelityOptions,
    exe: &Path,
    answers_path: &Path,
    v: DraftVariant,
    dir: &Path,
) -> anyhow::Result<VariantResult> {
    let raw = opts.out.join("raw").join(format!("{}.json", v.name));
    let saved: Option<Measured> = std::fs::read(&raw)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|m: &Measured| {
            !opts.fresh && opts.threads.iter().all(|t| m.ms_per_token.contains_key(t))
        });
    let measured = match saved {
        Some(m) => m,
        None => {
            tracing::info!(variant = v.name, "measuring");
            let status = tokio::process::Command::new(exe)
                .args(["bench", "draft-fidelity-measure", "--model-dir"])
                .arg(dir)
                .arg("--answers")
                .arg(answers_path)
                .arg("--result")
                .arg(&raw)
                .arg("--threads")
                .arg(
                    opts.threads
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                )
                .arg("--decode-tokens")
                .arg(opts.decode_tokens.to_string())
                .arg("--runs")
                .arg(opts.runs.to_string())
                .status()
                .await?;
            anyhow::ensure!(status.success(), "measuring {} failed: {status}", v.name);
            serde_json::from_slice(&std::fs::read(&raw)?)
                .with_context(|| format!("{}", raw.display()))?
        }
    };
    let disk_bytes = ["model.onnx", "model.onnx.data"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum();
    Ok(VariantResult {
        name: v.name.into(),
        about: v.about.into(),
        shipped: v == SHIPPED_DRAFT_VARIANT,
        disk_bytes,
        measured,
    })
}

/// The target's greedy answers, from the benchmark's own llama-server.
async fn take_answers(
    home: &Home,
    prompts: &[CorpusPrompt],
    max_answer_tokens: u32,
) -> anyhow::Result<Answers> {
    let dir = home.draft_onnx_dir();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    let template = ChatTemplate::from_file(&dir.join("chat_template.jinja"))?;
    let logs = home.log("bench-fidelity").with_extension("d");
    let server = servers::start_llama(home, Layout::Shared, false, &logs).await?;
    let target = servers::llama_client(&server.url, TARGET_MODEL)?;
    let mut answers = Vec::new();
    for p in prompts {
        let messages = vec![ChatMessage::new("user".into(), p.prompt.clone())];
        let prompt = tok.encode(&template.render(&messages)?)?;
        let req = ContinuationRequest {
            messages: Some(Arc::new(messages)),
            ..ContinuationRequest::greedy(prompt.clone(), max_answer_tokens)
        };
        let answer = target.continue_tokens(&req).await?.tokens;
        tracing::info!(id = p.id, kind = %p.kind, tokens = answer.len(), "target answer");
        answers.push(Answer {
            id: p.id,
            kind: p.kind.clone(),
            prompt,
            answer,
        });
    }
    server.stop().await;
    Ok(Answers {
        target: TARGET_MODEL.into(),
        max_answer_tokens,
        answers,
    })
}

/// Options of the measuring process (`approxy bench draft-fidelity-measure`, started by the
/// sweep once per variant so that its memory is its own).
// Private fields with plain comments: only the sweep passes these flags, and doc comments would
// become the hidden command's help.
#[derive(Debug, Clone, clap::Args)]
pub struct MeasureOptions {
    // The variant's directory.
    #[arg(long)]
    model_dir: PathBuf,
    // The saved `Answers`.
    #[arg(long)]
    answers: PathBuf,
    // Where to write the `Measured` JSON.
    #[arg(long)]
    result: PathBuf,
    // Thread counts; agreement is taken with the largest.
    #[arg(long, value_delimiter = ',')]
    threads: Vec<usize>,
    // Decode steps per speed run.
    #[arg(long)]
    decode_tokens: usize,
    // Speed runs after one warm-up.
    #[arg(long)]
    runs: usize,
}

/// Measures one variant in this process.
pub fn measure(opts: &MeasureOptions) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let answers: Answers = serde_json::from_slice(&std::fs::read(&opts.answers)?)
        .with_context(|| format!("{}", opts.answers.display()))?;
    let tok = Tokenizer::from_file(&opts.model_dir.join("tokenizer.json"))?;
    let prompt = tok.encode(PROMPT)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let most = opts.threads.iter().copied().max().unwrap_or(2);
    let mut m = Measured::default();
    for &threads in &opts.threads {
        let pool = DraftPool::start(&DraftConfig::one_stream_per_worker(
            opts.model_dir.clone(),
            home.onnxruntime_lib(),
            1,
            threads,
        ))?;
        let (prefill, steps) =
            rt.block_on(decode_speed(&pool, &prompt, opts.decode_tokens, opts.runs))?;
        // decode_speed returns at least one run.
        m.ms_per_token
            .insert(threads, stats::mean(&steps).unwrap_or_default());
        m.prefill_ms
            .insert(threads, stats::mean(&prefill).unwrap_or_default());
        if threads == most {
            m.agree = rt.block_on(agreement(&pool, &answers.answers))?;
        }
    }
    m.peak_rss_bytes = servers::peak_rss_bytes(std::process::id()).unwrap_or(0);
    std::fs::write(&opts.result, serde_json::to_vec_pretty(&m)?)?;
    Ok(())
}

/// Teacher forcing: the draft reads each prompt and the target's answer, and at every answer
/// position its top token is compared with the target's.
async fn agreement(
    pool: &DraftPool,
    answers: &[Answer],
) -> anyhow::Result<BTreeMap<String, (u64, u64)>> {
    let mut agree: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for a in answers.iter().filter(|a| !a.answer.is_empty()) {
        let lease = pool
            .try_lease()
            .ok_or_else(|| anyhow::anyhow!("draft worker busy"))?;
        lease.rollback(usize::MAX).await?;
        let mut outs = vec![lease.prefill(a.prompt.clone()).await?];
        let fed = &a.answer[..a.answer.len() - 1];
        if !fed.is_empty() {
            outs.extend(lease.extend(fed.to_vec(), true).await?);
        }
        anyhow::ensure!(
            outs.len() == a.answer.len(),
            "the draft gave {} outputs for {} positions",
            outs.len(),
            a.answer.len()
        );
        let e = agree.entry(a.kind.clone()).or_default();
        e.1 += a.answer.len() as u64;
        e.0 += outs
            .iter()
            .zip(&a.answer)
            .filter(|(o, t)| argmax(&o.logits).0 as u32 == **t)
            .count() as u64;
    }
    Ok(agree)
}

/// The report's Markdown (also its block in tests/README.md).
pub fn markdown(r: &FidelityReport, answers: &Answers) -> String {
    let threads: Vec<usize> = r
        .variants
        .iter()
        .flat_map(|v| v.measured.ms_per_token.keys().copied())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let most = threads.last().copied().unwrap_or(2);
    let count = |kind: &str| answers.answers.iter().filter(|a| a.kind == kind).count();
    let mut s = format!(
        "Measured {} on {}: `./tests/bench/scripts/bench-draft-fidelity.sh`. Teacher-forced on the target's \
         ({}) greedy answers (up to {} tokens) to the calibration's held-out prompts ({} code, \
         {} chat); agreement = share of answer positions where the draft's top token is the \
         target's. Speed: greedy decode of {} tokens after a short prompt, one draft worker.\n\n",
        r.date,
        r.machine.line(),
        r.target,
        r.max_answer_tokens,
        count("code"),
        count("chat"),
        r.decode_tokens,
    );
    s.push_str("| variant | code agreement | chat agreement | all |");
    for t in &threads {
        s.push_str(&format!(
            " ms/token, {t} thread{} |",
            if *t == 1 { "" } else { "s" }
        ));
    }
    s.push_str(" peak RSS | disk | agreement per ms |\n|---|---|---|---|");
    s.push_str(&"---|".repeat(threads.len() + 3));
    s.push('\n');
    for v in &r.variants {
        s.push_str(&variant_row(v, &threads, most));
    }
    s.push('\n');
    for v in &r.variants {
        s.push_str(&format!("- {}: {}\n", v.name, v.about));
    }
    s.push_str(&choice_line(&r.variants, most));
    s
}

/// A variant's row: its agreement by kind, its speed at each thread count, its memory and disk.
fn variant_row(v: &VariantResult, threads: &[usize], most: usize) -> String {
    let mut s = String::new();
    let positions = |k: &str| v.measured.agree.get(k).map_or(0, |x| x.1);
    s.push_str(&format!(
        "| {}{} | {} of {} | {} of {} | {} |",
        v.name,
        if v.shipped { " (shipped)" } else { "" },
        pct(v.agreement(Some("code"))),
        positions("code"),
        pct(v.agreement(Some("chat"))),
        positions("chat"),
        pct(v.agreement(None)),
    ));
    for t in threads {
        s.push_str(&v.ms(*t).map_or(" – |".into(), |ms| format!(" {ms:.1} |")));
    }
    let per_ms = v
        .agreement(None)
        .zip(v.ms(most))
        .map_or("–".into(), |(a, ms)| format!("{:.2} %", 100.0 * a / ms));
    s.push_str(&format!(
        " {:.2} GiB | {:.2} GiB | {per_ms} |\n",
        v.measured.peak_rss_bytes as f64 / f64::from(1u32 << 30),
        v.disk_bytes as f64 / f64::from(1u32 << 30),
    ));
    s
}

/// Which variant the rule picks at `most` threads, against the shipped one.
fn choice_line(variants: &[VariantResult], most: usize) -> String {
    let mut s = String::new();
    let shipped = variants.iter().find(|v| v.shipped);
    match (choose(variants, most), shipped) {
        (Some(c), Some(sh)) if c.name == sh.name => s.push_str(&format!(
            "\nThe rule (the most agreement per millisecond at {most} threads among variants within \
             {MAX_SLOWDOWN}x of the shipped draft's ms/token) keeps the shipped draft, {}.\n",
            sh.name
        )),
        (Some(c), Some(sh)) => s.push_str(&format!(
            "\nThe rule (the most agreement per millisecond at {most} threads among variants within \
             {MAX_SLOWDOWN}x of the shipped draft's ms/token) picks **{}** over the shipped {} \
             ({} against {} agreement, {:.1} against {:.1} ms/token).\n",
            c.name,
            sh.name,
            pct(c.agreement(None)),
            pct(sh.agreement(None)),
            c.ms(most).unwrap_or(f64::NAN),
            sh.ms(most).unwrap_or(f64::NAN),
        )),
        _ => s.push_str("\nNo variant could be chosen (the shipped draft was not measured).\n"),
    }
    s
}

/// A share as a percentage, or a dash when there is none.
fn pct(x: Option<f64>) -> String {
    x.map_or("–".into(), |x| format!("{:.1} %", 100.0 * x))
}

/// Reads a saved report, for tests/README.md.
pub fn load_markdown(out: &Path) -> Option<String> {
    std::fs::read_to_string(out.join("fidelity.md")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variant(name: &str, shipped: bool, agree: (u64, u64), ms: f64) -> VariantResult {
        VariantResult {
            name: name.into(),
            about: String::new(),
            shipped,
            disk_bytes: 1 << 30,
            measured: Measured {
                agree: [("code".to_string(), agree), ("chat".to_string(), (0, 0))].into(),
                ms_per_token: [(1, 2.0 * ms), (2, ms)].into(),
                prefill_ms: Default::default(),
                peak_rss_bytes: 1 << 30,
            },
        }
    }

    #[test]
    fn the_rule_takes_most_agreement_per_ms_within_the_slowdown_cap() {
        let shipped = variant("int4", true, (80, 100), 25.0);
        // More agreement per ms and within 1.3x: chosen.
        let better = variant("int4-b128", false, (82, 100), 24.0);
        // Best agreement, but 1.4x slower: out.
        let slow = variant("fp32", false, (95, 100), 35.0);
        let vs = [shipped.clone(), better, slow.clone()];
        assert_eq!(choose(&vs, 2).map(|v| v.name.as_str()), Some("int4-b128"));
        // Without the better one, the slow one's agreement per ms (2.7 %) loses to the shipped
        // (3.2 %) even were it allowed, and it is not: the shipped draft stays.
        let vs = [shipped.clone(), slow];
        assert_eq!(choose(&vs, 2).map(|v| v.name.as_str()), Some("int4"));
        // A slower variant within the cap still wins when its agreement makes up for it.
        let vs = [shipped, variant("int8", false, (99, 100), 30.0)];
        assert_eq!(choose(&vs, 2).map(|v| v.name.as_str()), Some("int8"));
        // Nothing shipped measured: no choice.
        assert!(choose(&[variant("x", false, (1, 1), 1.0)], 2).is_none());
    }

    #[test]
    fn agreement_is_per_kind_and_pooled() {
        let mut v = variant("v", true, (9, 10), 1.0);
        v.measured.agree.insert("chat".into(), (1, 10));
        assert_eq!(v.agreement(Some("code")), Some(0.9));
        assert_eq!(v.agreement(Some("chat")), Some(0.1));
        assert_eq!(v.agreement(None), Some(0.5));
        assert_eq!(v.agreement(Some("other")), None);
    }

    #[test]
    fn held_out_prompts_are_the_calibrations_held_out_split() {
        let corpus: Vec<CorpusPrompt> = (0..400)
            .map(|id| CorpusPrompt {
                id,
                kind: if id % 2 == 0 { "code" } else { "chat" }.into(),
                source: String::new(),
                prompt: format!("p{id}"),
            })
            .collect();
        let got = held_out_prompts(&corpus, 5);
        assert_eq!(got.iter().filter(|p| p.kind == "code").count(), 5);
        assert_eq!(got.iter().filter(|p| p.kind == "chat").count(), 5);
        for p in &got {
            assert!(approxy_training::fit::is_held_out(p.id, SPLIT_SEED));
            // Within the first 100 of each kind.
            assert!(p.id < 200, "{}", p.id);
        }
    }

    #[test]
    fn markdown_names_every_variant_and_the_choice() {
        let r = FidelityReport {
            machine: Machine {
                cpu: "cpu".into(),
                cores: 2,
                memory_gib: 24.0,
            },
            date: "2026-11-23".into(),
            target: "t".into(),
            per_kind: 1,
            max_answer_tokens: 96,
            decode_tokens: 64,
            variants: vec![
                variant("int4", true, (80, 100), 25.0),
                variant("int8", false, (99, 100), 30.0),
            ],
        };
        let a = Answers {
            target: "t".into(),
            max_answer_tokens: 96,
            answers: vec![],
        };
        let md = markdown(&r, &a);
        assert!(md.contains("| int4 (shipped) | 80.0 % of 100 |"), "{md}");
        assert!(md.contains("| int8 | 99.0 % of 100 |"), "{md}");
        assert!(md.contains("picks **int8** over the shipped int4"), "{md}");
        assert!(
            md.contains("ms/token, 1 thread | ms/token, 2 threads"),
            "{md}"
        );
    }
}
