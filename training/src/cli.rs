//! `approxy train collect` and `approxy train fit`: the commands, wiring this crate's
//! collection, fitting and report to the draft runtime, the chat template and the cache home.
//! The `approxy` binary parses the arguments and calls these.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use approxy_verifier::calibration::{
    Auc, AucReport, ByKind, Calibration, DataSummary, FORMAT, KindGrids, OtherHead,
};
use approxy_verifier::home::{DRAFT_GGUF_SHA256, Home};
use approxy_verifier::target::{CacheHints, PrefixStyle, TargetConfig, TargetKind, TextSettings};
use approxy_verifier::template::{ChatMessage, ChatTemplate};
use approxy_verifier::verify::learned::DEFAULT_CALIBRATION_TARGET;
use approxy_verifier::verify::{Features, LearnedVerifier, Verifier};
use approxy_verifier::{
    ConfidenceVerifier, DraftConfig, DraftPool, Engine, TargetClient, Tokenizer,
};

use crate::collect::{CollectItem, CollectOptions, LiveOptions, collect, collect_live};
use crate::dataset::{Rows, load_dir};
use crate::fit::{FitOptions, HeadKind, fit, is_held_out, raw_input};
use crate::report::{Scored, baseline, grid, roc_auc, standard_thresholds};

/// `approxy train collect` options.
#[derive(Debug, Clone)]
pub struct CollectArgs {
    /// The target's URL (llama-server's root, or a base URL ending in `/v1`).
    pub target_url: String,
    /// What kind of target it is; every kind that can continue a prefix works, so a user can
    /// calibrate for their own target.
    pub target_kind: TargetKind,
    /// How a `chat_prefix` target continues an answer.
    pub prefix_style: PrefixStyle,
    /// Model id sent to OpenAI-style targets.
    pub target_model: String,
    /// Environment variable holding the target's API key.
    pub target_api_key_env: Option<String>,
    /// Corpus JSONL.
    pub corpus: PathBuf,
    /// Output directory for shards.
    pub data: PathBuf,
    /// Prompts to use (half code, half chat).
    pub prompts: usize,
    /// Longest target answer (teacher mode) or live answer (live mode).
    pub max_answer_tokens: u32,
    /// `Some(threshold)`: record the positions the live decode loop visits at that threshold
    /// (with the confidence verifier) instead of teacher forcing.
    pub live_threshold: Option<f32>,
}

/// Collects training rows.
pub fn run_collect(a: &CollectArgs) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let dir = home.draft_onnx_dir();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    let template = ChatTemplate::from_file(&dir.join("chat_template.jinja"))?;
    let corpus = crate::corpus::load(&a.corpus)?;
    let half = a.prompts / 2;
    let code = corpus
        .iter()
        .filter(|p| p.kind == "code")
        .take(a.prompts - half);
    let chat = corpus.iter().filter(|p| p.kind == "chat").take(half);
    let mut items = Vec::new();
    for p in code.chain(chat) {
        let messages = vec![ChatMessage {
            role: "user".into(),
            content: p.prompt.clone(),
        }];
        let text = template.render(&messages)?;
        items.push(CollectItem {
            id: p.id,
            kind: u8::from(p.kind == "chat"),
            prompt: tok.encode(&text)?,
            messages: Arc::new(messages),
        });
    }
    let eos = tok.end_of_sequence_ids();
    let pool = DraftPool::start(&DraftConfig {
        model_dir: dir,
        onnxruntime_lib: home.onnxruntime_lib(),
        workers: 1,
        threads_per_worker: 2,
        spin_wait: false,
    })?;
    anyhow::ensure!(
        a.target_kind.can_continue(),
        "a {} target cannot continue a prefix: nothing to collect",
        a.target_kind.policy_name()
    );
    let cfg = TargetConfig {
        base_url: a.target_url.clone(),
        api_key: a
            .target_api_key_env
            .as_ref()
            .and_then(|v| std::env::var(v).ok())
            .filter(|k| !k.is_empty()),
        model: a.target_model.clone(),
        timeout: Duration::from_secs(300),
        retries: 3,
        backoff: Duration::from_millis(500),
        ca_file: None,
        cache_hints: CacheHints::default(),
        use_env_proxy: false,
    };
    let text = TextSettings {
        prefix_style: a.prefix_style,
        chat_template: None,
    };
    let target: Arc<dyn TargetClient> =
        approxy_verifier::target::build(a.target_kind, cfg, &tok, &text)?;
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
            rt.block_on(collect(pool, target, &items, &a.data, &opts, &pb))?
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
#[derive(Debug, Clone)]
pub struct FitArgs {
    /// Shard directory.
    pub data: PathBuf,
    /// Where the artifact, calibration and report go.
    pub out_dir: PathBuf,
    /// Seed for split, initialisation and shuffling.
    pub seed: u64,
    /// The target model the rows were collected from: the head is bound to this pair.
    pub target: String,
}

fn scored(v: &dyn Verifier, rows: &Rows, idx: &[usize]) -> Scored {
    let mut b = baseline(rows, idx);
    b.scores = idx
        .iter()
        .map(|&i| {
            let x = raw_input(rows, i, true);
            let mut stats = [0f32; 4];
            stats.copy_from_slice(&x[..4]);
            v.p_accept(&Features {
                top1: 0,
                token: 0,
                top1_prob: stats[0],
                stats,
                hidden: x[4..].to_vec(),
            })
        })
        .collect();
    b
}

/// Scores and labels of one prompt kind (`None`: all).
fn of_kind(s: &Scored, k: Option<u8>) -> (Vec<f32>, Vec<bool>) {
    (0..s.scores.len())
        .filter(|&i| k.is_none_or(|k| s.kinds[i] == k))
        .map(|i| (s.scores[i], s.labels[i]))
        .unzip()
}

fn aucs(s: &Scored) -> Auc {
    let sub = |k: Option<u8>| {
        let (sc, lb) = of_kind(s, k);
        roc_auc(&sc, &lb)
    };
    Auc {
        all: sub(None),
        code: sub(Some(0)),
        chat: sub(Some(1)),
    }
}

/// Fits both heads, picks the better on held-out AUC, writes artifact + calibration + report.
pub fn run_fit(a: &FitArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let rows = load_dir(&a.data)?;
    let (held, train): (Vec<usize>, Vec<usize>) =
        (0..rows.len()).partition(|&i| is_held_out(rows.prompt_ids[i], a.seed));
    eprintln!(
        "{} rows: {} train, {} held out",
        rows.len(),
        train.len(),
        held.len()
    );
    let draft_sha = DRAFT_GGUF_SHA256;
    let base = baseline(&rows, &held);
    let key = |a: &Auc| a.all.unwrap_or(0.0);
    // Weight decay is picked on a validation fifth of the training prompts (never the held-out
    // split), then the head is refitted on all training rows.
    let (val, fit_rows): (Vec<usize>, Vec<usize>) = train
        .iter()
        .partition(|&&i| is_held_out(rows.prompt_ids[i], a.seed.wrapping_add(1)));
    let mut candidates = Vec::new();
    let heads = [
        ("logistic", HeadKind::Logistic, true),
        ("mlp", HeadKind::Mlp(4), true),
        ("logistic-stats", HeadKind::Logistic, false),
        ("mlp-stats", HeadKind::Mlp(8), false),
    ];
    for (name, kind, use_hidden) in heads {
        let opts = |wd: f32| FitOptions {
            kind,
            epochs: 20,
            batch: 128,
            learning_rate: 0.003,
            weight_decay: wd,
            seed: a.seed,
            use_hidden,
        };
        let mut best = (f64::NEG_INFINITY, 0.0f32);
        for wd in [0.0f32, 1e-3, 1e-2, 1e-1, 0.3, 1.0] {
            let v = LearnedVerifier::from_artifact(
                fit(&rows, &fit_rows, &opts(wd), draft_sha),
                draft_sha,
            )?;
            let auc = key(&aucs(&scored(&v, &rows, &val)));
            if auc > best.0 {
                best = (auc, wd);
            }
        }
        let art = fit(&rows, &train, &opts(best.1), draft_sha);
        let v = LearnedVerifier::from_artifact(art.clone(), draft_sha)?;
        let s = scored(&v, &rows, &held);
        let auc = aucs(&s);
        eprintln!(
            "{name}: weight decay {} (validation AUC {:.4}); held-out AUC {auc}",
            best.1, best.0
        );
        candidates.push((name, art, s, auc, best.0));
    }
    let base_auc = aucs(&base);
    eprintln!("confidence baseline: held-out AUC {base_auc}");
    // The learned head is chosen on validation AUC; the held-out split only judges it.
    candidates.sort_by(|x, y| y.4.total_cmp(&x.4));
    let (best_name, mut best_art, best_scores, best_auc, _) = candidates.remove(0);
    // Named only when it is not the shipped pair's target, so the committed artifact
    // regenerates byte for byte.
    best_art.target = (a.target != DEFAULT_CALIBRATION_TARGET).then(|| a.target.clone());
    let learned_wins = key(&best_auc) > key(&base_auc);
    let chosen = if learned_wins {
        best_name
    } else {
        "confidence"
    };
    let chosen_scores = if learned_wins { &best_scores } else { &base };
    let th = standard_thresholds();
    let by_kind_of = |s: &Scored, k: u8| grid(s, |i| s.kinds[i] == k, &th);
    let by_kind = |k: u8| KindGrids {
        learned: by_kind_of(&best_scores, k),
        confidence: by_kind_of(&base, k),
    };
    let calibration = Calibration {
        format: FORMAT.to_string(),
        chosen_verifier: chosen.to_string(),
        artifact: learned_wins.then(|| "default.json".to_string()),
        draft_sha256: draft_sha.to_string(),
        data: DataSummary {
            rows: rows.len(),
            train_rows: train.len(),
            held_out_rows: held.len(),
            held_out_code_rows: base.kinds.iter().filter(|k| **k == 0).count(),
            held_out_chat_rows: base.kinds.iter().filter(|k| **k == 1).count(),
            held_out_agreement: base.labels.iter().filter(|l| **l).count() as f64
                / base.labels.len().max(1) as f64,
            seed: a.seed,
        },
        auc: AucReport {
            learned: best_auc,
            learned_kind: best_name.to_string(),
            confidence: base_auc,
            other_learned: candidates
                .iter()
                .map(|c| OtherHead {
                    kind: c.0.to_string(),
                    auc: c.3,
                })
                .collect(),
        },
        thresholds: grid(chosen_scores, |_| true, &th),
        learned_thresholds: grid(&best_scores, |_| true, &th),
        confidence_thresholds: grid(&base, |_| true, &th),
        by_kind: ByKind {
            code: by_kind(0),
            chat: by_kind(1),
        },
        fit_seconds: started.elapsed().as_secs_f64(),
    };
    std::fs::create_dir_all(&a.out_dir)?;
    charts(&a.out_dir, best_name, &best_scores, &base, &th);
    std::fs::write(
        a.out_dir.join("default.json"),
        serde_json::to_vec(&best_art)?,
    )?;
    std::fs::write(
        a.out_dir.join("calibration.json"),
        calibration.to_json_pretty()?,
    )?;
    std::fs::write(a.out_dir.join("report.md"), markdown(&calibration))?;
    eprintln!(
        "wrote {}/{{default.json,calibration.json,report.md,roc.png,thresholds.png}}; chosen: {chosen}",
        a.out_dir.display()
    );
    Ok(())
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
    s.push_str("# Verifier calibration report\n\nGenerated by `approxy train fit` from the rows that `approxy train collect` gathered (see `deploy/train-default.sh`). ");
    s.push_str(&format!(
        "{} rows, {} held out by prompt ({} code, {} chat); the draft agrees with the target on {:.1} % of held-out positions.\n\n",
        d.rows, d.held_out_rows, d.held_out_code_rows, d.held_out_chat_rows, d.held_out_agreement * 100.0
    ));
    s.push_str(
        "## ROC AUC on the held-out split\n\n| verifier | all | code | chat |\n|---|---|---|---|\n",
    );
    s.push_str(&format!(
        "| learned ({}) | {} | {} | {} |\n",
        a.learned_kind,
        f(a.learned.all),
        f(a.learned.code),
        f(a.learned.chat)
    ));
    s.push_str(&format!(
        "| draft confidence (baseline) | {} | {} | {} |\n",
        f(a.confidence.all),
        f(a.confidence.code),
        f(a.confidence.chat)
    ));
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
    s.push_str(&format!(
        "\n\nChosen for the default policy: **{}**.\n",
        c.chosen_verifier
    ));
    s.push_str("\n![ROC curves](roc.png)\n\n![False-accept rate and target calls against threshold](thresholds.png)\n");
    for (title, grids) in [("code", &c.by_kind.code), ("chat", &c.by_kind.chat)] {
        s.push_str(&format!(
            "\n## Thresholds on {title} prompts\n\nFAR = false-accept rate: share of accepted draft tokens the target would not have produced. Calls = target calls per 100 output tokens (one correction token per rejection, no bail-out).\n\n| threshold | learned accept | learned FAR | learned calls | baseline accept | baseline FAR | baseline calls |\n|---|---|---|---|---|---|---|\n"
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

/// Default data directory for collected rows.
pub fn default_data_dir() -> anyhow::Result<PathBuf> {
    Ok(Home::from_env()?.root.join("training").join("rows"))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn committed_report_regenerates_from_committed_calibration() -> Result<(), String> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/verifier");
        let c = Calibration::load(&dir.join("calibration.json"))?;
        let committed =
            std::fs::read_to_string(dir.join("report.md")).map_err(|e| e.to_string())?;
        assert_eq!(markdown(&c), committed);
        Ok(())
    }
}
