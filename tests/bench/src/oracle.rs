//! `approxy bench oracle`: what each acceptance rule allows, with the target's own
//! probabilities as a perfect verifier. At every position the draft proposes its greedy token,
//! one single-token call asks the target for its top-20 log-probabilities there, and the rule
//! decides: accept the draft's token, or emit the target's. This separates what a rule permits
//! from what a local verifier achieves: no verifier of that rule can let the draft write more
//! at no more than this quality.
//!
//! Configurations: `target-only` (reject everything: the target's greedy answer),
//! `draft-only` (accept everything) and one per rule. Per kind it reports the share of tokens
//! the target wrote (with one-token corrections, also its calls per 100 tokens), pass@1 on
//! HumanEval, and for every answer the target's mean negative log-likelihood per token (read
//! from the same calls, so every configuration is scored by the same target), as the share of
//! the gap between draft-only and target-only that the configuration closes; on chat also
//! ROUGE-L against the target-only answer and how many answers are identical to it.
//!
//! Judged windows (`--judged T@K`) are `verification = "judged"` simulated at the same
//! positions: every token is scored in windows paced as decoding paces them (the same
//! `WindowSize`, up to K draft tokens), a draft token is kept where the target would pick it or
//! the draft's confidence is at least T, a window ends at the first it does not keep, with the
//! target's token, and a window kept whole ends with the target's next token. At temperature 0
//! that is the answer the real decode gives on a target that agrees with this one; the report
//! adds the tokens per target call. `--judged exact@K` keeps no difference: exact windows
//! (`verification = "exact"`), whose answer is the target's.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use approxy_setup::Home;
use approxy_training::cli::parse_rule;
use approxy_training::corpus::{CorpusPrompt, HumanEvalProblem, load_human_eval};
use approxy_verifier::calibration::{Calibration, Curve, threshold_for_kind};
use approxy_verifier::decode::{WINDOW_MAX, WINDOW_MAX_LIMIT, WINDOW_MIN, WindowSize};
use approxy_verifier::targets::{ContinuationRequest, TargetClient};
use approxy_verifier::template::{ChatMessage, ChatTemplate};
use approxy_verifier::verify::{AcceptanceRule, Features, TargetProbs, accepts};
use approxy_verifier::{Draft, DraftConfig, DraftPool, DraftWorkers, Tokenizer};

use super::call_floor::{Rates, cheapest};
use super::chat_sample::{held_out_chat, rouge_l};
use super::humaneval::{self, Sandbox, Verdict};
use super::instructions::{InstructionPrompt, InstructionScores, score_instructions};
use super::machine::{Machine, utc_now};
use super::servers::{self, Layout};

/// The target's top entries asked for at each position (as label collection keeps).
const TOP_K: u32 = 20;

/// What to run.
#[derive(Debug, Clone, clap::Args)]
pub struct OracleOptions {
    /// HumanEval problems, spread evenly (0: none).
    #[arg(long, default_value_t = 24)]
    pub problems: usize,
    /// Held-out chat prompts (0: none).
    #[arg(long, default_value_t = 40)]
    pub chat: usize,
    /// Output limit per code answer.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
    /// Output limit per chat answer.
    #[arg(long, default_value_t = 128)]
    pub chat_max_tokens: u32,
    /// Instruction-following prompts (0: none), from `tests/bench/instructions/`.
    // The first of the set.
    #[arg(long, default_value_t = 40)]
    pub instructions: usize,
    /// Output limit per instruction-following answer.
    #[arg(long, default_value_t = 160)]
    pub instructions_max_tokens: u32,
    /// The instruction-following set.
    // `prompts.jsonl`, `score.py`, `requirements.txt`.
    #[arg(long, default_value = "tests/bench/instructions")]
    pub instructions_dir: PathBuf,
    /// Rules compared, comma-separated (`identical`, `sprinter`, `sprinter-hard`,
    /// `ratio:R`, `typical:EPS;DELTA` with a semicolon here).
    #[arg(
        long = "rules",
        value_name = "RULES",
        default_value = "identical,sprinter,ratio:0.8,ratio:0.5,ratio:0.2,typical:0.09;0.3",
        value_delimiter = ','
    )]
    pub rule_names: Vec<String>,
    /// The rules compared (besides target-only and draft-only): `--rules` parsed by
    /// [`OracleOptions::parse_lists`].
    #[arg(skip)]
    pub rules: Vec<AcceptanceRule>,
    /// Local verifiers run under the same oracle, comma-separated: `confidence:T` (the
    /// draft's confidence at threshold T) or `CALIBRATION@FAR` (the confidence thresholds
    /// per kind that a rule's calibration file gives at that false-accept budget).
    #[arg(long = "verifiers", value_name = "VERIFIERS", value_delimiter = ',')]
    pub verifier_names: Vec<String>,
    /// The local verifiers: `--verifiers` parsed by [`OracleOptions::parse_lists`].
    #[arg(skip)]
    pub verifiers: Vec<VerifierConfig>,
    /// Judged windows run under the same oracle, comma-separated: `T` or `T@K` (the draft's
    /// confidence at threshold T judges the differences, windows of at most K draft tokens,
    /// 16 when not given).
    #[arg(long = "judged", value_name = "JUDGED", value_delimiter = ',')]
    pub judged_names: Vec<String>,
    /// The judged windows: `--judged` parsed by [`OracleOptions::parse_lists`].
    #[arg(skip)]
    pub judged: Vec<JudgedConfig>,
    /// Ask the target again at every position instead of reusing what an earlier run on
    /// this machine was told (kept under $APPROXY_HOME/work/bench-oracle-asked).
    #[arg(long)]
    pub fresh: bool,
    /// The training corpus (the chat sample's source).
    #[arg(long, default_value = "training/data/prompts.jsonl")]
    pub corpus: PathBuf,
    /// Results directory.
    #[arg(long, default_value = "tests/bench/results/oracle")]
    pub out: PathBuf,
    /// An `approxy bench calls` result whose pinned target-only runs give the target's
    /// milliseconds per prompt and per generated token, for the cheapest plans' busy time.
    // None: no busy time (the flag always gives one).
    #[arg(long, default_value = "tests/bench/results/calls/calls.json")]
    pub busy_from: Option<PathBuf>,
}

impl OracleOptions {
    /// These options with [`OracleOptions::rules`] and [`OracleOptions::verifiers`] parsed
    /// from their flags' text.
    // Not clap's value parsers: a bad rule or verifier is the run's error, not a usage error.
    pub fn parse_lists(self) -> anyhow::Result<Self> {
        let rules = self
            .rule_names
            .iter()
            .map(|r| parse_rule(r))
            .collect::<Result<Vec<_>, String>>()
            .map_err(anyhow::Error::msg)?;
        let verifiers = self
            .verifier_names
            .iter()
            .map(|v| VerifierConfig::parse(v))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let judged = self
            .judged_names
            .iter()
            .map(|v| JudgedConfig::parse(v))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self {
            rules,
            verifiers,
            judged,
            ..self
        })
    }
}

/// A local verifier the oracle runs beside the rules: the draft's confidence against a
/// threshold per kind, either fixed (`confidence:T`, as a policy's `threshold = T`) or the one a
/// rule's calibration gives at a false-accept budget (`PATH@FAR`, as a policy's
/// `max_false_accept_rate` with `calibration = PATH`). Run under the same oracle, it shows what
/// share of a rule's saving a verifier realises, at what quality.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifierConfig {
    /// The name the report shows.
    pub name: String,
    /// Threshold on code prompts.
    pub code: f32,
    /// Threshold on chat prompts.
    pub chat: f32,
}

impl VerifierConfig {
    /// Parses `confidence:T` or `PATH@FAR`.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        if let Some(t) = s.strip_prefix("confidence:") {
            let t: f32 = t.parse().with_context(|| format!("{s:?}: a threshold"))?;
            return Ok(Self {
                name: format!("confidence {t}"),
                code: t,
                chat: t,
            });
        }
        let (path, far) = s
            .rsplit_once('@')
            .with_context(|| format!("{s:?}: confidence:T or CALIBRATION@FAR"))?;
        let far: f32 = far
            .parse()
            .with_context(|| format!("{s:?}: a false-accept rate"))?;
        let path = std::path::Path::new(path);
        let at = |kind| {
            threshold_for_kind(path, kind, far, Curve::Confidence).map_err(anyhow::Error::msg)
        };
        let (code, chat) = (at("code")?, at("chat")?);
        let c = Calibration::load(path).map_err(anyhow::Error::msg)?;
        let rule = c.rule.as_deref().unwrap_or("identical");
        Ok(Self {
            name: format!(
                "confidence, {rule} at {:.0} % (code {code:.2}, chat {chat:.2})",
                100.0 * far
            ),
            code,
            chat,
        })
    }
}

/// Judged windows: the draft's confidence at a threshold keeps the differences it is sure of,
/// in windows of at most `window_max` draft tokens; with no threshold, exact windows (no
/// difference kept).
#[derive(Debug, Clone, PartialEq)]
pub struct JudgedConfig {
    /// The confidence threshold (both kinds); `None`: exact windows.
    pub threshold: Option<f32>,
    /// The longest window, in draft tokens.
    pub window_max: u32,
}

impl JudgedConfig {
    /// Parses `T` or `T@K`, where T is a threshold or `exact`.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let (t, k) = match s.split_once('@') {
            Some((t, k)) => (
                t,
                k.parse()
                    .with_context(|| format!("{s:?}: a window length after @"))?,
            ),
            None => (s, WINDOW_MAX),
        };
        let threshold = if t == "exact" {
            None
        } else {
            let t: f32 = t
                .parse()
                .with_context(|| format!("{s:?}: a threshold or `exact`"))?;
            anyhow::ensure!(
                (0.0..=1.0).contains(&t),
                "{s:?}: the threshold is outside [0, 1]"
            );
            Some(t)
        };
        anyhow::ensure!(
            (WINDOW_MIN..=WINDOW_MAX_LIMIT).contains(&k),
            "{s:?}: windows of {WINDOW_MIN} to {WINDOW_MAX_LIMIT} tokens, as a policy's `window_max`"
        );
        Ok(Self {
            threshold,
            window_max: k,
        })
    }

    fn name(&self) -> String {
        match self.threshold {
            Some(t) => format!("judged windows, confidence {t} (up to {})", self.window_max),
            None => format!("exact windows (up to {})", self.window_max),
        }
    }
}

/// A configuration: the oracle's decision at every position.
#[derive(Debug, Clone, PartialEq)]
enum Decide {
    TargetOnly,
    DraftOnly,
    Rule(AcceptanceRule),
    Verifier(VerifierConfig),
    Judged(JudgedConfig),
}

impl Decide {
    fn name(&self) -> String {
        match self {
            Self::TargetOnly => "target-only".into(),
            Self::DraftOnly => "draft-only".into(),
            Self::Rule(r) => r.to_string(),
            Self::Verifier(v) => v.name.clone(),
            Self::Judged(j) => j.name(),
        }
    }

    /// The longest window, where every token is scored in windows.
    fn window_max(&self) -> Option<u32> {
        match self {
            Self::Judged(j) => Some(j.window_max),
            _ => None,
        }
    }

    /// Whether the draft's token `token`, of probability `q` under the draft, is emitted on a
    /// prompt of `kind` where the target's probabilities are `target`.
    fn accepts(&self, kind: &str, token: u32, q: f32, target: &TargetProbs) -> bool {
        match self {
            Self::TargetOnly => false,
            Self::DraftOnly => true,
            Self::Rule(r) => r.accepts(token, q, target),
            Self::Verifier(v) => accepts(q, if kind == "code" { v.code } else { v.chat }),
            // A difference the confidence keeps; where the draft's token is the target's own,
            // `decode` keeps it anyway.
            Self::Judged(j) => j.threshold.is_some_and(|t| accepts(q, t)),
        }
    }
}

/// What the target said at each answer prefix already asked about, for one prompt: its greedy
/// token and top-k there. Greedy and deterministic, so configurations that share a prefix (all
/// of them share the first position; `identical` follows target-only's path throughout) need
/// not ask again, nor does a later run on this machine: the answers are kept on disk, one file
/// per prompt, whose first line is the prompt's token ids (another prompt under the same name
/// starts the file over).
struct Asked {
    known: HashMap<Vec<u32>, (u32, TargetProbs)>,
    file: std::fs::File,
}

#[derive(Serialize, Deserialize)]
struct AskedLine {
    answer: Vec<u32>,
    token: u32,
    top: Vec<(u32, f32)>,
}

impl Asked {
    /// The store of prompt `ids` at `path`, with what an earlier run kept there.
    fn open(path: &std::path::Path, ids: &[u32], fresh: bool) -> anyhow::Result<Self> {
        use std::io::{BufRead, Write};
        let mut known = HashMap::new();
        let header = serde_json::to_string(ids)?;
        let reusable = !fresh
            && std::fs::File::open(path).is_ok_and(|f| {
                let mut lines = std::io::BufReader::new(f).lines();
                if lines.next().and_then(Result::ok).as_deref() != Some(header.as_str()) {
                    return false;
                }
                // A line cut short by a killed run ends what is read.
                for l in lines.map_while(Result::ok) {
                    let Ok(a) = serde_json::from_str::<AskedLine>(&l) else {
                        break;
                    };
                    known.insert(a.answer, (a.token, TargetProbs { top: a.top }));
                }
                true
            });
        let file = if reusable {
            // Rewritten whole, so a cut line is not followed by good ones.
            let mut f = std::fs::File::create(path)?;
            writeln!(f, "{header}")?;
            for (answer, (token, probs)) in &known {
                let line = AskedLine {
                    answer: answer.clone(),
                    token: *token,
                    top: probs.top.clone(),
                };
                writeln!(f, "{}", serde_json::to_string(&line)?)?;
            }
            f
        } else {
            known.clear();
            let mut f = std::fs::File::create(path)?;
            writeln!(f, "{header}")?;
            f
        };
        Ok(Self { known, file })
    }

    fn get(&self, answer: &[u32]) -> Option<&(u32, TargetProbs)> {
        self.known.get(answer)
    }

    fn insert(&mut self, answer: Vec<u32>, token: u32, probs: TargetProbs) -> anyhow::Result<()> {
        use std::io::Write;
        let line = AskedLine {
            answer,
            token,
            top: probs.top,
        };
        writeln!(self.file, "{}", serde_json::to_string(&line)?)?;
        self.known
            .insert(line.answer, (line.token, TargetProbs { top: line.top }));
        Ok(())
    }
}

/// One answer under one configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OracleAnswer {
    /// Prompt id (HumanEval task id or corpus id).
    pub id: String,
    /// The answer's text (cut at a HumanEval stop string for code).
    pub text: String,
    /// Tokens emitted.
    pub tokens: usize,
    /// Of which the target wrote.
    pub target_tokens: usize,
    /// Sum over emitted tokens of -log p_target(token | prefix).
    pub nll_sum: f64,
    /// Emitted tokens outside the target's top-20 (their log-probability counted as the 20th's,
    /// so the NLL is a lower bound where this is not 0).
    pub outside_top_k: usize,
    /// HumanEval verdict (code only).
    pub verdict: Option<Verdict>,
    /// Prompt tokens (as the target sees them).
    #[serde(default)]
    pub prompt_tokens: usize,
    /// The positions the target wrote, ascending (runs saved before they were kept have none,
    /// and no cheapest plan).
    #[serde(default)]
    pub target_at: Vec<usize>,
    /// Target calls, where every token is scored in windows (judged windows).
    #[serde(default)]
    pub window_calls: Option<usize>,
}

/// One configuration on one kind.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OracleSummary {
    /// `target-only`, `draft-only` or the rule's name.
    pub config: String,
    /// `code` or `chat`.
    pub kind: String,
    /// Answers.
    pub answers: usize,
    /// Share of emitted tokens the target wrote.
    pub target_share: f64,
    /// Target calls per 100 tokens: with one-token corrections one per target token, with
    /// windows the windows.
    pub calls_per_100_tokens: f64,
    /// Tokens per target call, where every token is scored in windows.
    #[serde(default)]
    pub tokens_per_call: Option<f64>,
    /// Passed HumanEval problems (code).
    pub passed: Option<usize>,
    /// Mean NLL per token under the target.
    pub nll_per_token: f64,
    /// (NLL of draft-only - this) / (draft-only - target-only), per-token means.
    pub nll_gap_closed: Option<f64>,
    /// Mean ROUGE-L against the target-only answer (chat, instructions).
    pub rouge_l: Option<f64>,
    /// Instructions followed, checked by code (instructions).
    pub instructions: Option<InstructionScores>,
    /// Answers identical to target-only's.
    pub identical: usize,
    /// Emitted tokens outside the target's top-20.
    pub outside_top_k: usize,
    /// Wall time of the configuration's decoding. Not a speed: a target call one configuration
    /// made at a prefix is not repeated by the next, so later configurations take less.
    pub seconds: f64,
    /// Per cost class, the cheapest call plan for these answers' target positions
    /// (`call_floor`) against what target-only's answers cost through passthrough.
    #[serde(default)]
    pub cheapest: Vec<ClassRatio>,
}

/// A cost against passthrough's, in one cost class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassRatio {
    /// The class (a price class's name, or `target busy`).
    pub class: String,
    /// Cost relative to passthrough's.
    pub ratio: f64,
}

/// The name of the cost class that counts the target's own time.
pub const BUSY: &str = "target busy";

/// The report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OracleReport {
    /// When.
    pub date: String,
    /// Where.
    pub machine: Machine,
    /// Output limit per kind.
    pub max_tokens: Vec<(String, u32)>,
    /// Every configuration per kind.
    pub summaries: Vec<OracleSummary>,
    /// Every answer, by kind and configuration.
    pub answers: Vec<(String, String, Vec<OracleAnswer>)>,
    /// The cost classes the cheapest plans are priced in.
    #[serde(default)]
    pub classes: Vec<(String, Rates)>,
}

/// A prompt to answer.
struct Prompt {
    id: String,
    ids: Vec<u32>,
}

/// Decodes one answer, asking the target at every position it has not been asked about.
#[allow(clippy::too_many_arguments)]
async fn decode(
    draft: &dyn Draft,
    target: &dyn TargetClient,
    tok: &Tokenizer,
    prompt: &Prompt,
    max_tokens: u32,
    stops: &[&str],
    kind: &str,
    decide: &Decide,
    asked: &mut Asked,
) -> anyhow::Result<OracleAnswer> {
    let eos = tok.end_of_sequence_ids();
    let mut out = draft.prefill(prompt.ids.clone()).await?;
    let mut answer: Vec<u32> = Vec::new();
    let (mut nll_sum, mut outside) = (0f64, 0usize);
    // The positions the target wrote (their count is its share).
    let mut target_at = Vec::new();
    // Judged windows: their pacing, the open window's length and the draft tokens it kept, and
    // the calls made.
    let mut pacing = decide.window_max().map(WindowSize::new);
    let (mut window_k, mut kept, mut calls) = (0usize, 0usize, 0usize);
    let mut text = String::new();
    while answer.len() < max_tokens as usize {
        // The draft's token and its probability exactly as the verifier and the rows see them.
        let f = Features::from_output(&out);
        let (x, q) = (f.top1, f.top1_prob);
        let (y, probs) = match asked.get(&answer).cloned() {
            Some(known) => known,
            None => {
                let req = ContinuationRequest {
                    top_logprobs: TOP_K,
                    prompt_len: prompt.ids.len(),
                    ..ContinuationRequest::greedy([prompt.ids.as_slice(), &answer].concat(), 1)
                };
                let c = target.continue_tokens(&req).await?;
                let probs = TargetProbs {
                    top: c.top_logprobs.into_iter().next().unwrap_or_default(),
                };
                let Some(&y) = c.tokens.first() else {
                    anyhow::bail!("the target generated nothing after {} tokens", answer.len());
                };
                asked.insert(answer.clone(), y, probs.clone())?;
                (y, probs)
            }
        };
        let emitted = match &mut pacing {
            None if decide.accepts(kind, x, q, &probs) => x,
            None => {
                target_at.push(answer.len());
                y
            }
            Some(p) => {
                if kept == 0 {
                    // A window opens: its length is fixed before its call, as in decoding.
                    window_k = (p.k() as usize).min(max_tokens as usize - answer.len());
                }
                if kept < window_k && (x == y || decide.accepts(kind, x, q, &probs)) {
                    kept += 1;
                    x
                } else {
                    // The first token the window does not keep, or the call's own next token
                    // after a window kept whole: the target's, and the call is over.
                    p.update(kept, window_k);
                    kept = 0;
                    calls += 1;
                    target_at.push(answer.len());
                    y
                }
            }
        };
        let lp = match probs.logprob(emitted) {
            Some(lp) => lp,
            None => {
                outside += 1;
                probs.top.last().map_or(0.0, |t| t.1)
            }
        };
        nll_sum -= f64::from(lp);
        answer.push(emitted);
        if eos.contains(&emitted) {
            break;
        }
        text = tok.decode(&answer)?;
        if let Some(cut) = stops.iter().filter_map(|s| text.find(s)).min() {
            text.truncate(cut);
            break;
        }
        out = draft
            .extend(vec![emitted], false)
            .await?
            .pop()
            .context("the draft gave no output")?;
    }
    if eos.iter().any(|e| answer.last() == Some(e)) {
        text = tok.decode(&answer[..answer.len() - 1])?;
    }
    // The answer ended inside a window: its call scored what it kept.
    if kept > 0 {
        calls += 1;
    }
    Ok(OracleAnswer {
        id: prompt.id.clone(),
        text,
        tokens: answer.len(),
        target_tokens: target_at.len(),
        nll_sum,
        outside_top_k: outside,
        verdict: None,
        prompt_tokens: prompt.ids.len(),
        target_at,
        window_calls: pacing.map(|_| calls),
    })
}

fn summarize(
    config: &str,
    kind: &str,
    answers: &[OracleAnswer],
    reference: Option<&[OracleAnswer]>,
    seconds: f64,
) -> OracleSummary {
    let tokens: usize = answers.iter().map(|a| a.tokens).sum();
    let target: usize = answers.iter().map(|a| a.target_tokens).sum();
    let share = target as f64 / tokens.max(1) as f64;
    let windows: Option<usize> = answers
        .iter()
        .map(|a| a.window_calls)
        .sum::<Option<usize>>()
        .filter(|_| !answers.is_empty());
    OracleSummary {
        config: config.into(),
        kind: kind.into(),
        answers: answers.len(),
        target_share: share,
        calls_per_100_tokens: windows
            .map_or(100.0 * share, |w| 100.0 * w as f64 / tokens.max(1) as f64),
        tokens_per_call: windows.map(|w| tokens as f64 / w.max(1) as f64),
        passed: (kind == "code").then(|| {
            answers
                .iter()
                .filter(|a| a.verdict == Some(Verdict::Passed))
                .count()
        }),
        nll_per_token: answers.iter().map(|a| a.nll_sum).sum::<f64>() / tokens.max(1) as f64,
        nll_gap_closed: None,
        instructions: None,
        rouge_l: reference.filter(|_| kind != "code").map(|r| {
            answers
                .iter()
                .zip(r)
                .map(|(a, b)| rouge_l(&a.text, &b.text))
                .sum::<f64>()
                / answers.len().max(1) as f64
        }),
        identical: reference.map_or(0, |r| {
            answers
                .iter()
                .zip(r)
                .filter(|(a, b)| a.text == b.text)
                .count()
        }),
        outside_top_k: answers.iter().map(|a| a.outside_top_k).sum(),
        seconds,
        cheapest: Vec::new(),
    }
}

/// Fills each summary's cheapest plan per cost class, against target-only's answers of its
/// kind through passthrough, where every answer kept its target positions.
fn fill_cheapest(
    summaries: &mut [OracleSummary],
    all: &[(String, String, Vec<OracleAnswer>)],
    classes: &[(String, Rates)],
) {
    for s in summaries.iter_mut() {
        let find = |config: &str| {
            all.iter()
                .find(|r| r.0 == s.kind && r.1 == config)
                .map(|r| &r.2)
        };
        let (Some(answers), Some(reference)) = (find(&s.config), find("target-only")) else {
            continue;
        };
        // Positions that do not add up: a run saved before they were kept. Windows are not
        // the plans' spans: their calls are counted as they are.
        if answers.iter().any(|a| a.window_calls.is_some())
            || reference.iter().any(|a| a.target_at.len() != a.tokens)
            || answers.iter().any(|a| a.target_at.len() != a.target_tokens)
        {
            continue;
        }
        s.cheapest = classes
            .iter()
            .map(|(class, r)| {
                let (mut plan, mut passthrough) = (0.0, 0.0);
                for a in answers {
                    let Some(t) = reference.iter().find(|t| t.id == a.id) else {
                        continue;
                    };
                    plan += cheapest(a.prompt_tokens, a.tokens, &a.target_at, r);
                    passthrough += r.passthrough(t.prompt_tokens, t.tokens);
                }
                ClassRatio {
                    class: class.clone(),
                    ratio: plan / passthrough.max(f64::MIN_POSITIVE),
                }
            })
            .collect();
    }
}

/// The cost classes the cheapest plans are priced in: every price class, and the target's
/// busy time from the milliseconds per prompt and per generated token that llama-server
/// counted over a target-only run of `approxy bench calls` (`calls.json`), where there is one.
pub fn cost_classes(calls_json: Option<&std::path::Path>) -> Vec<(String, Rates)> {
    let mut out: Vec<(String, Rates)> = super::prices::CLASSES
        .iter()
        .map(|p| {
            (
                p.name.to_string(),
                Rates {
                    input: p.input,
                    cached_input: p.cached_input,
                    output: p.output,
                },
            )
        })
        .collect();
    if let Some(r) = calls_json.and_then(busy_rates) {
        out.push((BUSY.to_string(), r));
    }
    out
}

/// Milliseconds per computed prompt token and per generated token over the target-only runs
/// with the target's counters in a `calls.json` (a cached prompt token costs no compute).
fn busy_rates(path: &std::path::Path) -> Option<Rates> {
    let runs: Vec<super::calls::CallsRun> = match std::fs::read(path)
        .map_err(anyhow::Error::from)
        .and_then(|b| Ok(serde_json::from_slice(&b)?))
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "no busy-time rates: the cheapest plans are priced without them");
            return None;
        }
    };
    let (mut pn, mut ps, mut gn, mut gs) = (0u64, 0f64, 0u64, 0f64);
    for r in runs
        .iter()
        .filter(|r| r.config == super::calls::CallConfig::TargetOnly && r.layout == "pinned")
    {
        if let Some(a) = &r.target_account {
            pn += a.prompt_processed;
            ps += a.prompt_seconds;
            gn += a.predicted;
            gs += a.predicted_seconds;
        }
    }
    (pn > 0 && gn > 0).then(|| Rates {
        input: 1e3 * ps / pn as f64,
        cached_input: 0.0,
        output: 1e3 * gs / gn as f64,
    })
}

/// Fills each summary's share of the NLL gap closed, from its kind's draft-only and
/// target-only rows.
fn gap_closed(summaries: &mut [OracleSummary]) {
    let of = |s: &[OracleSummary], kind: &str, config: &str| {
        s.iter()
            .find(|x| x.kind == kind && x.config == config)
            .map(|x| x.nll_per_token)
    };
    let ends: Vec<(String, Option<f64>, Option<f64>)> = ["code", "chat", "instructions"]
        .iter()
        .map(|k| {
            (
                k.to_string(),
                of(summaries, k, "draft-only"),
                of(summaries, k, "target-only"),
            )
        })
        .collect();
    for s in summaries.iter_mut() {
        if let Some((_, Some(d), Some(t))) = ends.iter().find(|e| e.0 == s.kind)
            && (d - t).abs() > 1e-9
        {
            s.nll_gap_closed = Some((d - s.nll_per_token) / (d - t));
        }
    }
}

/// The Markdown table.
pub fn markdown(r: &OracleReport) -> String {
    let limits: Vec<String> = r
        .max_tokens
        .iter()
        .map(|(k, n)| format!("{n} ({k})"))
        .collect();
    let busy = r
        .classes
        .iter()
        .find(|c| c.0 == BUSY)
        .map_or("not measured".to_string(), |(_, b)| {
            format!(
                "{:.1} ms per computed prompt token and {:.1} ms per generated token, llama-server's counters over `approxy bench calls` target-only runs with cores pinned",
                b.input, b.output
            )
        });
    let mut s = format!(
        "Oracle study, {} on {} ({} cores): at every position the target's top-20 probabilities decide (a rule) or the draft's confidence does (a verifier), and a rejected position gets the target's own token; answers of at most {} tokens, greedy. Instructions: IFEval's checkers on `tests/bench/instructions/` (prompt level / instruction level, strict). Cheapest plan: the least any call plan pays for the positions the target wrote (every call re-sends the prefix, all of it read from the cache but what is new, spans stopped exactly, `call_floor.rs`), against target-only's answers through passthrough; at DeepSeek's prices, and in the target's busy time ({busy}).\n\n| kind | configuration | answers | target share | calls / 100 tokens | pass@1 | instructions followed | NLL / token | NLL gap closed | ROUGE-L vs target | identical to target | cheapest plan, DeepSeek | cheapest plan, target busy |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        r.date,
        r.machine.cpu,
        r.machine.cores,
        limits.join(", ")
    );
    for x in &r.summaries {
        let opt = |v: Option<f64>, pct: bool| {
            v.map_or("-".to_string(), |v| {
                if pct {
                    format!("{:.0} %", 100.0 * v)
                } else {
                    format!("{v:.3}")
                }
            })
        };
        let class = |name: &str| {
            opt(
                x.cheapest.iter().find(|c| c.class == name).map(|c| c.ratio),
                true,
            )
        };
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} % | {} | {} | {} | {:.3} | {} | {} | {} | {} | {} |\n",
            x.kind,
            x.config,
            x.answers,
            100.0 * x.target_share,
            x.tokens_per_call
                .map_or(format!("{:.1}", x.calls_per_100_tokens), |t| format!(
                    "{:.1} ({t:.1} tokens a call)",
                    x.calls_per_100_tokens
                )),
            x.passed
                .map_or("-".into(), |p| format!("{p}/{}", x.answers)),
            x.instructions.map_or("-".into(), |i| format!(
                "{:.1} % / {:.1} %",
                100.0 * i.prompt_level_strict,
                100.0 * i.instruction_level_strict
            )),
            x.nll_per_token,
            opt(x.nll_gap_closed, true),
            opt(x.rouge_l, false),
            x.identical,
            class("DeepSeek"),
            class(BUSY),
        ));
    }
    s
}

/// Runs the study: its own llama-server target, the shipped draft.
pub async fn run(opts: &OracleOptions) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    std::fs::create_dir_all(&opts.out)?;
    let dir = home.draft_onnx_dir();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    let template = ChatTemplate::from_file(&dir.join("chat_template.jinja"))?;
    let pool = DraftPool::start(&DraftConfig::one_stream_per_worker(
        dir,
        home.onnxruntime_lib(),
        1,
        1,
    ))?;
    let logs = home.log("bench-oracle").with_extension("d");
    let server = servers::start_llama(&home, Layout::Shared, false, &logs).await?;
    let target = servers::llama_client(&server.url, "target")?;
    let prompts = StudyPrompts::read(opts, &home, &tok, &template)?;
    let mut configs = vec![Decide::TargetOnly, Decide::DraftOnly];
    configs.extend(opts.rules.iter().map(|r| Decide::Rule(*r)));
    configs.extend(opts.verifiers.iter().cloned().map(Decide::Verifier));
    configs.extend(opts.judged.iter().cloned().map(Decide::Judged));
    // Keyed by the target model: answers from another target are not this one's.
    let store = home.work("bench-oracle-asked").join(format!(
        "{}-top{TOP_K}",
        approxy_verifier::home::TARGET_GGUF_NAME
    ));
    std::fs::create_dir_all(&store)?;
    let sandbox = Sandbox::detect().await;
    // Absolute (the check runs python in this directory on a path inside it), and outside
    // the results.
    let scratch = std::path::absolute(home.work("bench-oracle-exec"))?;
    let study = Study {
        opts,
        pool: &pool,
        target: &target,
        tok: &tok,
        sandbox,
        scratch: &scratch,
        store: &store,
        configs: &configs,
        problems: &prompts.problems,
    };
    let mut results = StudyResults::default();
    for (kind, prompts, max_tokens, stops) in [
        ("code", &prompts.code, opts.max_tokens, &humaneval::STOP[..]),
        ("chat", &prompts.chat, opts.chat_max_tokens, &[][..]),
        (
            "instructions",
            &prompts.instructions,
            opts.instructions_max_tokens,
            &[][..],
        ),
    ] {
        if prompts.is_empty() {
            continue;
        }
        study
            .run_kind(kind, prompts, max_tokens, stops, &mut results)
            .await?;
        if kind == "instructions" {
            let runs: Vec<(String, Vec<(String, String)>)> = results
                .all
                .iter()
                .filter(|r| r.0 == kind)
                .map(|r| {
                    let answers = r.2.iter().map(|a| (a.id.clone(), a.text.clone()));
                    (r.1.clone(), answers.collect())
                })
                .collect();
            let scores = score_instructions(&home, &opts.instructions_dir, &scratch, &runs).await?;
            for s in results.summaries.iter_mut().filter(|s| s.kind == kind) {
                s.instructions = scores.get(&s.config).copied();
            }
        }
        write_report(opts, &results.summaries, &results.all)?;
    }
    server.stop().await;
    let md = write_report(opts, &results.summaries, &results.all)?;
    println!("{md}");
    Ok(())
}

/// The study's prompts, tokenized, per kind; and the HumanEval problems behind the code ones.
struct StudyPrompts {
    problems: Vec<HumanEvalProblem>,
    code: Vec<Prompt>,
    chat: Vec<Prompt>,
    instructions: Vec<Prompt>,
}

impl StudyPrompts {
    /// Reads as many of each kind as `opts` asks for (chat and instruction prompts rendered
    /// through the draft's chat template).
    fn read(
        opts: &OracleOptions,
        home: &Home,
        tok: &Tokenizer,
        template: &ChatTemplate,
    ) -> anyhow::Result<Self> {
        let problems = humaneval::sample(
            load_human_eval(&home.human_eval()).context("HumanEval (run `approxy setup`)")?,
            opts.problems,
        );
        let problems = if opts.problems == 0 {
            Vec::new()
        } else {
            problems
        };
        let corpus: Vec<CorpusPrompt> = approxy_training::corpus::load(&opts.corpus)?;
        let chat = if opts.chat == 0 {
            Vec::new()
        } else {
            held_out_chat(&corpus, opts.chat)
        };
        let code_prompts: Vec<Prompt> = problems
            .iter()
            .map(|p| {
                Ok(Prompt {
                    id: p.task_id.clone(),
                    ids: tok.encode(&p.prompt)?,
                })
            })
            .collect::<anyhow::Result<_>>()?;
        let chat_prompts: Vec<Prompt> = chat
            .iter()
            .map(|p| {
                let messages = [ChatMessage::new("user".into(), p.prompt.clone())];
                Ok(Prompt {
                    id: p.id.to_string(),
                    ids: tok.encode(&template.render(&messages)?)?,
                })
            })
            .collect::<anyhow::Result<_>>()?;
        let instruction_prompts: Vec<Prompt> = if opts.instructions == 0 {
            Vec::new()
        } else {
            let path = opts.instructions_dir.join("prompts.jsonl");
            std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?
                .lines()
                .filter(|l| !l.trim().is_empty())
                .take(opts.instructions)
                .map(|l| {
                    let p: InstructionPrompt = serde_json::from_str(l)?;
                    let messages = [ChatMessage::new("user".into(), p.prompt)];
                    Ok(Prompt {
                        id: p.id,
                        ids: tok.encode(&template.render(&messages)?)?,
                    })
                })
                .collect::<anyhow::Result<_>>()?
        };
        Ok(Self {
            problems,
            code: code_prompts,
            chat: chat_prompts,
            instructions: instruction_prompts,
        })
    }
}

/// What the study runs with: the draft, the target, and where checks and asked calls live.
struct Study<'a> {
    opts: &'a OracleOptions,
    pool: &'a DraftPool,
    target: &'a approxy_verifier::targets::LlamaCppTarget,
    tok: &'a Tokenizer,
    sandbox: Sandbox,
    scratch: &'a std::path::Path,
    store: &'a std::path::Path,
    configs: &'a [Decide],
    problems: &'a [HumanEvalProblem],
}

/// The study's results so far: one summary per (kind, configuration), and the answers
/// behind each as (kind, configuration, answers).
#[derive(Default)]
struct StudyResults {
    summaries: Vec<OracleSummary>,
    all: Vec<(String, String, Vec<OracleAnswer>)>,
}

impl Study<'_> {
    /// Answers every prompt of `kind` under every configuration, target-only first.
    async fn run_kind(
        &self,
        kind: &str,
        prompts: &[Prompt],
        max_tokens: u32,
        stops: &[&str],
        results: &mut StudyResults,
    ) -> anyhow::Result<()> {
        let mut reference: Option<Vec<OracleAnswer>> = None;
        let mut asked: Vec<Asked> = prompts
            .iter()
            .map(|p| {
                let name: String = format!("{kind}-{}", p.id)
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '-' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                Asked::open(
                    &self.store.join(format!("{name}.jsonl")),
                    &p.ids,
                    self.opts.fresh,
                )
            })
            .collect::<anyhow::Result<_>>()?;
        for decide in self.configs {
            let started = Instant::now();
            let mut answers = Vec::new();
            for (p, asked) in prompts.iter().zip(&mut asked) {
                let lease = self.pool.try_lease().context("no idle draft worker")?;
                let a = decode(
                    lease.as_ref(),
                    self.target,
                    self.tok,
                    p,
                    max_tokens,
                    stops,
                    kind,
                    decide,
                    asked,
                )
                .await?;
                tracing::info!(kind, config = %decide.name(), id = %a.id, tokens = a.tokens, target = a.target_tokens, "answer");
                answers.push(a);
            }
            let seconds = started.elapsed().as_secs_f64();
            if kind == "code" {
                for (a, p) in answers.iter_mut().zip(self.problems) {
                    let v = humaneval::check(
                        self.sandbox,
                        p,
                        &a.text,
                        self.scratch,
                        Duration::from_secs(20),
                    )
                    .await?;
                    a.verdict = Some(v);
                }
            }
            // Target-only runs first: every configuration, itself included, is compared with it.
            if *decide == Decide::TargetOnly {
                reference = Some(answers.clone());
            }
            results.summaries.push(summarize(
                &decide.name(),
                kind,
                &answers,
                reference.as_deref(),
                seconds,
            ));
            results.all.push((kind.to_string(), decide.name(), answers));
        }
        Ok(())
    }
}

/// Writes `oracle.json` and `oracle.md` for the kinds finished so far (after each kind, so an
/// interrupted study keeps what it measured), and returns the Markdown.
fn write_report(
    opts: &OracleOptions,
    summaries: &[OracleSummary],
    all: &[(String, String, Vec<OracleAnswer>)],
) -> anyhow::Result<String> {
    let mut summaries = summaries.to_vec();
    gap_closed(&mut summaries);
    let classes = cost_classes(opts.busy_from.as_deref());
    fill_cheapest(&mut summaries, all, &classes);
    let done: Vec<&str> = summaries.iter().map(|s| s.kind.as_str()).collect();
    let report = OracleReport {
        date: utc_now(),
        machine: Machine::read(),
        max_tokens: [
            ("code", opts.max_tokens),
            ("chat", opts.chat_max_tokens),
            ("instructions", opts.instructions_max_tokens),
        ]
        .into_iter()
        .filter(|k| done.contains(&k.0))
        .map(|(k, n)| (k.to_string(), n))
        .collect(),
        summaries,
        answers: all.to_vec(),
        classes,
    };
    std::fs::write(
        opts.out.join("oracle.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    let md = markdown(&report);
    std::fs::write(opts.out.join("oracle.md"), &md)?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(tokens: usize, target: usize, nll: f64, text: &str) -> OracleAnswer {
        OracleAnswer {
            id: "p".into(),
            text: text.into(),
            tokens,
            target_tokens: target,
            nll_sum: nll,
            outside_top_k: 0,
            verdict: None,
            prompt_tokens: 0,
            target_at: Vec::new(),
            window_calls: None,
        }
    }

    #[test]
    fn summaries_measure_share_and_the_nll_gap_between_the_two_ends() {
        let target = [answer(10, 10, 2.0, "a b c")];
        let draft = [answer(10, 0, 12.0, "a x y")];
        let rule = [answer(10, 3, 4.5, "a b y")];
        let mut s = vec![
            summarize("target-only", "chat", &target, Some(&target), 1.0),
            summarize("draft-only", "chat", &draft, Some(&target), 1.0),
            summarize("ratio:0.2", "chat", &rule, Some(&target), 1.0),
        ];
        gap_closed(&mut s);
        assert_eq!(s[0].nll_gap_closed, Some(1.0));
        assert_eq!(s[1].nll_gap_closed, Some(0.0));
        // NLL per token 0.2 (target), 1.2 (draft), 0.45: (1.2 - 0.45) / 1.0 closed.
        assert!((s[2].nll_gap_closed.unwrap_or(0.0) - 0.75).abs() < 1e-9);
        assert!((s[2].target_share - 0.3).abs() < 1e-12);
        assert_eq!((s[0].identical, s[2].identical), (1, 0));
        assert!((s[2].rouge_l.unwrap_or(0.0) - 2.0 / 3.0).abs() < 1e-9);
        assert!(
            markdown(&OracleReport {
                date: "d".into(),
                machine: Machine::read(),
                max_tokens: vec![("chat".into(), 2)],
                summaries: s,
                answers: Vec::new(),
                classes: Vec::new(),
            })
            .contains(
                "| chat | ratio:0.2 | 1 | 30.0 % | 30.0 | - | - | 0.450 | 75 % | 0.667 | 0 | - | - |"
            )
        );
    }

    /// The cheapest plans are priced per class against target-only's answers through
    /// passthrough, matched by prompt; a run whose answers kept no positions gets none.
    #[test]
    fn cheapest_plans_are_priced_against_target_only_through_passthrough() {
        let with = |id: &str, tokens: usize, at: Vec<usize>| OracleAnswer {
            id: id.into(),
            prompt_tokens: 10,
            target_tokens: at.len(),
            target_at: at,
            ..answer(tokens, 0, 0.0, "")
        };
        let all = vec![
            (
                "chat".to_string(),
                "target-only".to_string(),
                vec![with("p", 4, vec![0, 1, 2, 3]), with("q", 2, vec![0, 1])],
            ),
            (
                "chat".to_string(),
                "ratio:0.5".to_string(),
                // q first: matched by id, not by order.
                vec![with("q", 3, vec![]), with("p", 5, vec![3])],
            ),
        ];
        let r = Rates {
            input: 1.0,
            cached_input: 0.1,
            output: 3.0,
        };
        let mut s = vec![
            summarize("target-only", "chat", &all[0].2, None, 1.0),
            summarize("ratio:0.5", "chat", &all[1].2, None, 1.0),
        ];
        fill_cheapest(&mut s, &all, &[("c".into(), r)]);
        // Passthrough: 10 + 12 and 10 + 6; ratio:0.5 pays only p's call at 3: 13 + 3.
        assert_eq!(s[0].cheapest[0].ratio, 1.0);
        assert!((s[1].cheapest[0].ratio - 16.0 / 38.0).abs() < 1e-12);
        // Positions missing on either side: no plan priced (as 0, it would read as a saving).
        for (run, answer) in [(0, 1), (1, 1)] {
            let mut old = all.clone();
            old[run].2[answer].target_at.clear();
            let mut s = vec![summarize("ratio:0.5", "chat", &old[1].2, None, 1.0)];
            fill_cheapest(&mut s, &old, &[("c".into(), r)]);
            assert!(s[0].cheapest.is_empty(), "{run} {answer}");
        }
    }

    /// The busy-time class reads llama-server's own counters from the committed calls
    /// results: a computed prompt token is cheaper than a generated one, a cached one free.
    #[test]
    fn busy_time_is_priced_from_the_target_counters_of_a_calls_run() {
        let committed = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/bench/results/calls/calls.json");
        let classes = cost_classes(Some(&committed));
        let (_, busy) = classes.iter().find(|c| c.0 == BUSY).expect("a busy class");
        assert_eq!(busy.cached_input, 0.0);
        assert!(0.0 < busy.input && busy.input < busy.output, "{busy:?}");
        assert_eq!(classes.len(), super::super::prices::CLASSES.len() + 1);
        assert_eq!(
            cost_classes(Some(std::path::Path::new("/nonexistent"))).len(),
            super::super::prices::CLASSES.len()
        );
    }

    /// What the target said is kept per prompt and read back by the next run; a line cut by a
    /// killed run ends the reading, and a file of another prompt (or `--fresh`) starts over.
    #[test]
    fn target_answers_are_kept_per_prompt_and_reused() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("chat-1.jsonl");
        let probs = |t: u32| TargetProbs {
            top: vec![(t, -0.1), (t + 1, -2.5)],
        };
        let mut a = Asked::open(&path, &[1, 2, 3], false)?;
        a.insert(vec![], 7, probs(7))?;
        a.insert(vec![7], 8, probs(8))?;
        drop(a);
        let mut text = std::fs::read_to_string(&path)?;
        text.push_str("{\"answer\":[7,8],\"tok");
        std::fs::write(&path, text)?;
        let b = Asked::open(&path, &[1, 2, 3], false)?;
        assert_eq!(b.get(&[]), Some(&(7, probs(7))));
        assert_eq!(b.get(&[7]), Some(&(8, probs(8))));
        assert_eq!(b.get(&[7, 8]), None);
        drop(b);
        // Rewritten without the cut line: still both answers.
        assert_eq!(Asked::open(&path, &[1, 2, 3], false)?.known.len(), 2);
        assert!(Asked::open(&path, &[1, 2, 4], false)?.known.is_empty());
        assert!(Asked::open(&path, &[1, 2, 4], false)?.known.is_empty());
        let mut c = Asked::open(&path, &[1, 2, 3], false)?;
        c.insert(vec![], 7, probs(7))?;
        drop(c);
        assert!(Asked::open(&path, &[1, 2, 3], true)?.known.is_empty());
        Ok(())
    }

    /// A verifier configuration reads its thresholds per kind from a rule's calibration at a
    /// budget (the lowest threshold within it on that kind's confidence grid), or takes one
    /// fixed threshold; it then decides by the draft's confidence alone.
    #[test]
    fn verifier_configurations_resolve_thresholds_and_decide_by_confidence() -> anyhow::Result<()> {
        let committed = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../policies/verifier/calibration.json");
        let c = Calibration::load(&committed).map_err(anyhow::Error::msg)?;
        let v = VerifierConfig::parse(&format!("{}@0.05", committed.display()))?;
        let want = |g: &[approxy_verifier::calibration::CalibrationPoint]| {
            approxy_verifier::calibration::pick(g, 0.05).map(|p| p.threshold)
        };
        assert_eq!(Some(v.code), want(&c.by_kind.code.confidence));
        assert_eq!(Some(v.chat), want(&c.by_kind.chat.confidence));
        assert!(
            v.name.starts_with("confidence, identical at 5 %"),
            "{}",
            v.name
        );
        let fixed = VerifierConfig::parse("confidence:0.7")?;
        assert_eq!((fixed.code, fixed.chat), (0.7, 0.7));
        assert!(VerifierConfig::parse("nonsense").is_err());
        assert!(VerifierConfig::parse(&format!("{}@0", committed.display())).is_ok());
        let d = Decide::Verifier(VerifierConfig {
            name: "v".into(),
            code: 0.5,
            chat: 0.9,
        });
        // The target's probabilities play no part: only the draft's confidence and the kind.
        let t = TargetProbs {
            top: vec![(2, 0.0)],
        };
        assert!(d.accepts("code", 1, 0.6, &t));
        assert!(!d.accepts("chat", 1, 0.6, &t));
        assert!(!d.accepts("instructions", 1, 0.6, &t));
        assert!(d.accepts("instructions", 1, 0.95, &t));
        Ok(())
    }

    /// A target that gives, at each answer position, a fixed top list (by position after the
    /// prompt), and counts its calls.
    #[derive(Debug)]
    struct TableTarget {
        table: Vec<Vec<(u32, f32)>>,
        calls: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl TargetClient for TableTarget {
        async fn continue_tokens(
            &self,
            req: &ContinuationRequest,
        ) -> Result<approxy_verifier::targets::Continuation, approxy_verifier::TargetError>
        {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let top = self.table[req.prefix.len() - req.prompt_len].clone();
            Ok(approxy_verifier::targets::Continuation {
                tokens: vec![top[0].0],
                top_logprobs: vec![top],
                ..Default::default()
            })
        }
        async fn tokenize(
            &self,
            _: &str,
        ) -> Result<Option<Vec<u32>>, approxy_verifier::TargetError> {
            Ok(None)
        }
        async fn health(&self) -> Result<(), approxy_verifier::TargetError> {
            Ok(())
        }
    }

    /// The scripted pairs' one-token prompt, and a fresh store of what the target said.
    fn scripted_prompt() -> anyhow::Result<(Prompt, tempfile::TempDir, Asked)> {
        let prompt = Prompt {
            id: "p".into(),
            ids: vec![approxy_verifier::testing::IM_START],
        };
        let dir = tempfile::tempdir()?;
        let asked = Asked::open(&dir.path().join("p.jsonl"), &prompt.ids, false)?;
        Ok((prompt, dir, asked))
    }

    /// Each rule and a verifier decided by hand on a scripted pair: the draft says "abc" (then
    /// end of turn) at confidence 0.9; the target prefers `a` (0.95), then `x` over `b` (0.6
    /// against 0.35), then `c` (0.5), then end of turn. A rule accepting `b` (ratio:0.5) gives
    /// the draft's answer with no target token; identity and ratio:0.8 take the target's `x`.
    /// The target is asked once per distinct prefix over all configurations.
    #[tokio::test]
    async fn each_rule_decides_as_worked_out_by_hand_on_a_scripted_pair() -> anyhow::Result<()> {
        use approxy_verifier::DraftWorkers;
        use approxy_verifier::testing::{DraftScript, IM_END, ScriptedWorkers, tiny_tokenizer};
        let ln = |p: f64| p.ln() as f32;
        let (a, b, c, x) = (97u32, 98u32, 99u32, 120u32);
        let target = TableTarget {
            table: vec![
                vec![(a, ln(0.95)), (b, ln(0.03))],
                vec![(x, ln(0.6)), (b, ln(0.35))],
                vec![(c, ln(0.5)), (b, ln(0.4))],
                vec![(IM_END, ln(0.99))],
            ],
            calls: Default::default(),
        };
        let workers = ScriptedWorkers::new(DraftScript::says("abc", 0.9), 1);
        let tok = tiny_tokenizer();
        let (prompt, _dir, mut asked) = scripted_prompt()?;
        let verifier = |t: f32| {
            Decide::Verifier(VerifierConfig {
                name: format!("confidence {t}"),
                code: 0.0,
                chat: t,
            })
        };
        let cases = [
            (Decide::TargetOnly, "axc", 4),
            (Decide::DraftOnly, "abc", 0),
            (Decide::Rule(AcceptanceRule::Identical), "axc", 1),
            (Decide::Rule(AcceptanceRule::Ratio(0.8)), "axc", 1),
            (Decide::Rule(AcceptanceRule::Ratio(0.5)), "abc", 0),
            (Decide::Rule(AcceptanceRule::MEDUSA_TYPICAL), "abc", 0),
            (verifier(0.95), "axc", 4),
            (verifier(0.5), "abc", 0),
        ];
        for (decide, text, target_tokens) in cases {
            let lease = workers.try_lease().context("no draft")?;
            let got = decode(
                lease.as_ref(),
                &target,
                &tok,
                &prompt,
                16,
                &[],
                "chat",
                &decide,
                &mut asked,
            )
            .await?;
            assert_eq!(
                (got.text.as_str(), got.target_tokens, got.tokens),
                (text, target_tokens, 4),
                "{}",
                decide.name()
            );
            // Where the target wrote: all four, none, or the second (`x`).
            let at: Vec<usize> = match target_tokens {
                4 => vec![0, 1, 2, 3],
                1 => vec![1],
                _ => vec![],
            };
            assert_eq!(
                (got.target_at, got.prompt_tokens),
                (at, 1),
                "{}",
                decide.name()
            );
            let nll = if text == "abc" {
                -(ln(0.95) + ln(0.35) + ln(0.5) + ln(0.99))
            } else {
                -(ln(0.95) + ln(0.6) + ln(0.5) + ln(0.99))
            };
            assert!(
                (got.nll_sum - f64::from(nll)).abs() < 1e-5,
                "{}",
                decide.name()
            );
        }
        // Prefixes asked: "", "a", "ax", "ab", "axc", "abc".
        assert_eq!(target.calls.load(std::sync::atomic::Ordering::SeqCst), 6);
        Ok(())
    }

    /// Judged windows worked out by hand. The draft says "abcdefghij" (then end of turn) at
    /// confidence 0.9; the target agrees everywhere but at the third position (`x`). Windows
    /// start at 8 draft tokens and follow the kept lengths as decoding's pacing does.
    /// - Judged at 0.5 (the difference kept): the first window keeps 8 tokens and its call's own
    ///   next token is the target's (`i`); the second keeps `j` and the end of turn: 2 calls.
    /// - Judged at 0.95: the first window ends at `x`, the target's (1 call; the next window is
    ///   6 long: the mean of 6 and 2, plus 2); the second keeps `d` to `i` whole and ends with
    ///   the target's `j`; the third scores the end of turn: 3 calls.
    /// - A token limit of 5 cuts the first window to 5 tokens, all kept: 1 call.
    #[tokio::test]
    async fn judged_windows_are_paced_and_counted_as_worked_out_by_hand() -> anyhow::Result<()> {
        use approxy_verifier::DraftWorkers;
        use approxy_verifier::testing::{DraftScript, IM_END, ScriptedWorkers, tiny_tokenizer};
        let mut table: Vec<Vec<(u32, f32)>> = "abxdefghij"
            .bytes()
            .map(|b| vec![(u32::from(b), -0.1)])
            .collect();
        table.push(vec![(IM_END, -0.01)]);
        let target = TableTarget {
            table,
            calls: Default::default(),
        };
        let workers = ScriptedWorkers::new(DraftScript::says("abcdefghij", 0.9), 1);
        let tok = tiny_tokenizer();
        let (prompt, _dir, mut asked) = scripted_prompt()?;
        let judged = |t: &str| JudgedConfig::parse(t).map(Decide::Judged);
        let cases = [
            (judged("0.5")?, 16, "abcdefghij", vec![8], 11, 2),
            // Exact windows keep no difference: as at 0.95, whatever the confidence.
            (judged("exact")?, 16, "abxdefghij", vec![2, 9], 11, 3),
            (judged("0.95@16")?, 16, "abxdefghij", vec![2, 9], 11, 3),
            (judged("0.5")?, 5, "abcde", vec![], 5, 1),
        ];
        for (decide, limit, text, at, tokens, calls) in cases {
            let lease = workers.try_lease().context("no draft")?;
            let got = decode(
                lease.as_ref(),
                &target,
                &tok,
                &prompt,
                limit,
                &[],
                "code",
                &decide,
                &mut asked,
            )
            .await?;
            assert_eq!(
                (
                    got.text.as_str(),
                    got.target_at,
                    got.tokens,
                    got.window_calls
                ),
                (text, at, tokens, Some(calls)),
                "{} at {limit}",
                decide.name()
            );
        }
        let s = summarize(
            "j",
            "code",
            &[answer(11, 1, 0.0, ""), answer(11, 2, 0.0, "")].map(|a| OracleAnswer {
                window_calls: Some(2),
                ..a
            }),
            None,
            0.0,
        );
        assert_eq!(s.tokens_per_call, Some(5.5));
        assert!((s.calls_per_100_tokens - 100.0 * 4.0 / 22.0).abs() < 1e-9);
        assert!(JudgedConfig::parse("0.5@65").is_err() && JudgedConfig::parse("2").is_err());
        assert!(JudgedConfig::parse("0.5@3").is_err());
        assert_eq!(JudgedConfig::parse("0.85@32")?.window_max, 32);
        assert_eq!(JudgedConfig::parse("exact@32")?.threshold, None);
        Ok(())
    }

    /// The instruction-following scorer installs from its pinned requirements into a venv of
    /// its own and passes its self-test there (crafted answers that must pass and must fail
    /// each instruction type of the set, and a small answer file scored to known figures).
    #[test]
    fn the_instruction_scorer_installs_and_passes_its_self_test() -> anyhow::Result<()> {
        let home = Home::from_env()?;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("instructions");
        let venv =
            approxy_setup::requirements_venv(&home, "instructions", &dir.join("requirements.txt"))?;
        let out = std::process::Command::new(venv.join("bin").join("python"))
            .arg(dir.join("score.py"))
            .arg("--self-test")
            .output()?;
        let said = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{said}");
        assert!(
            said.contains("40 prompts") && said.contains(" 0 failed"),
            "{said}"
        );
        Ok(())
    }
}
