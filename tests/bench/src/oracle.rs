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

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use approxy_setup::Home;
use approxy_training::corpus::{CorpusPrompt, load_human_eval};
use approxy_verifier::target::{ContinuationRequest, TargetClient};
use approxy_verifier::template::{ChatMessage, ChatTemplate};
use approxy_verifier::verify::{AcceptanceRule, Features, TargetProbs};
use approxy_verifier::{Draft, DraftConfig, DraftPool, DraftWorkers, Tokenizer};

use super::chat_sample::{held_out_chat, rouge_l};
use super::humaneval::{self, Sandbox, Verdict};
use super::report::{Machine, utc_now};
use super::servers::{self, Layout};

/// The target's top entries asked for at each position (as label collection keeps).
const TOP_K: u32 = 20;

/// What to run.
#[derive(Debug, Clone)]
pub struct OracleOptions {
    /// HumanEval problems, spread evenly (0: none).
    pub problems: usize,
    /// Held-out chat prompts (0: none).
    pub chat: usize,
    /// Output limit per code answer.
    pub max_tokens: u32,
    /// Output limit per chat answer.
    pub chat_max_tokens: u32,
    /// The rules compared (besides target-only and draft-only).
    pub rules: Vec<AcceptanceRule>,
    /// The training corpus (the chat sample's source).
    pub corpus: PathBuf,
    /// Results directory.
    pub out: PathBuf,
}

/// A configuration: the oracle's decision at every position.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Decide {
    TargetOnly,
    DraftOnly,
    Rule(AcceptanceRule),
}

impl Decide {
    fn name(&self) -> String {
        match self {
            Self::TargetOnly => "target-only".into(),
            Self::DraftOnly => "draft-only".into(),
            Self::Rule(r) => r.to_string(),
        }
    }

    fn accepts(&self, token: u32, q: f32, target: &TargetProbs) -> bool {
        match self {
            Self::TargetOnly => false,
            Self::DraftOnly => true,
            Self::Rule(r) => r.accepts(token, q, target),
        }
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
    /// Target calls per 100 tokens with one-token corrections (one per target token).
    pub calls_per_100_tokens: f64,
    /// Passed HumanEval problems (code).
    pub passed: Option<usize>,
    /// Mean NLL per token under the target.
    pub nll_per_token: f64,
    /// (NLL of draft-only - this) / (draft-only - target-only), per-token means.
    pub nll_gap_closed: Option<f64>,
    /// Mean ROUGE-L against the target-only answer (chat).
    pub rouge_l: Option<f64>,
    /// Answers identical to target-only's.
    pub identical: usize,
    /// Emitted tokens outside the target's top-20.
    pub outside_top_k: usize,
    /// Wall time of the configuration's decoding.
    pub seconds: f64,
}

/// The report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OracleReport {
    /// When.
    pub date: String,
    /// Where.
    pub machine: Machine,
    /// Output limits (code, chat).
    pub max_tokens: (u32, u32),
    /// Every configuration per kind.
    pub summaries: Vec<OracleSummary>,
    /// Every answer, by kind and configuration.
    pub answers: Vec<(String, String, Vec<OracleAnswer>)>,
}

/// A prompt to answer.
struct Prompt {
    id: String,
    ids: Vec<u32>,
}

/// Decodes one answer, asking the target at every position.
async fn decode(
    draft: &dyn Draft,
    target: &dyn TargetClient,
    tok: &Tokenizer,
    prompt: &Prompt,
    max_tokens: u32,
    stops: &[&str],
    decide: Decide,
) -> anyhow::Result<OracleAnswer> {
    let eos = tok.end_of_sequence_ids();
    let mut out = draft.prefill(prompt.ids.clone()).await?;
    let mut answer: Vec<u32> = Vec::new();
    let (mut target_tokens, mut nll_sum, mut outside) = (0usize, 0f64, 0usize);
    let mut text = String::new();
    while answer.len() < max_tokens as usize {
        // The draft's token and its probability exactly as the verifier and the rows see them.
        let f = Features::from_output(&out);
        let (x, q) = (f.top1, f.top1_prob);
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
        let emitted = if decide.accepts(x, q, &probs) {
            x
        } else {
            target_tokens += 1;
            y
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
    Ok(OracleAnswer {
        id: prompt.id.clone(),
        text,
        tokens: answer.len(),
        target_tokens,
        nll_sum,
        outside_top_k: outside,
        verdict: None,
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
    OracleSummary {
        config: config.into(),
        kind: kind.into(),
        answers: answers.len(),
        target_share: share,
        calls_per_100_tokens: 100.0 * share,
        passed: (kind == "code").then(|| {
            answers
                .iter()
                .filter(|a| a.verdict == Some(Verdict::Passed))
                .count()
        }),
        nll_per_token: answers.iter().map(|a| a.nll_sum).sum::<f64>() / tokens.max(1) as f64,
        nll_gap_closed: None,
        rouge_l: reference.filter(|_| kind == "chat").map(|r| {
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
    }
}

/// Fills each summary's share of the NLL gap closed, from its kind's draft-only and
/// target-only rows.
fn gap_closed(summaries: &mut [OracleSummary]) {
    let of = |s: &[OracleSummary], kind: &str, config: &str| {
        s.iter()
            .find(|x| x.kind == kind && x.config == config)
            .map(|x| x.nll_per_token)
    };
    let ends: Vec<(String, Option<f64>, Option<f64>)> = ["code", "chat"]
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
    let mut s = format!(
        "Oracle study, {} on {} ({} cores): the target's top-20 probabilities decide at every position; answers of at most {} tokens (code) and {} (chat), greedy.\n\n| kind | configuration | answers | target share | calls / 100 tokens | pass@1 | NLL / token | NLL gap closed | ROUGE-L vs target | identical to target |\n|---|---|---|---|---|---|---|---|---|---|\n",
        r.date, r.machine.cpu, r.machine.cores, r.max_tokens.0, r.max_tokens.1
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
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} % | {:.1} | {} | {:.3} | {} | {} | {} |\n",
            x.kind,
            x.config,
            x.answers,
            100.0 * x.target_share,
            x.calls_per_100_tokens,
            x.passed
                .map_or("-".into(), |p| format!("{p}/{}", x.answers)),
            x.nll_per_token,
            opt(x.nll_gap_closed, true),
            opt(x.rouge_l, false),
            x.identical
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
    let pool = DraftPool::start(&DraftConfig {
        model_dir: dir,
        onnxruntime_lib: home.onnxruntime_lib(),
        workers: 1,
        threads_per_worker: 1,
        spin_wait: false,
    })?;
    let logs = home.log("bench-oracle").with_extension("d");
    let server = servers::start_llama(&home, Layout::Shared, false, &logs).await?;
    let target = servers::llama_client(&server.url, "target")?;
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
            let messages = [ChatMessage {
                role: "user".into(),
                content: p.prompt.clone(),
            }];
            Ok(Prompt {
                id: p.id.to_string(),
                ids: tok.encode(&template.render(&messages)?)?,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let mut configs = vec![Decide::TargetOnly, Decide::DraftOnly];
    configs.extend(opts.rules.iter().map(|r| Decide::Rule(*r)));
    let sandbox = Sandbox::detect().await;
    // Absolute (the check runs python in this directory on a path inside it), and outside
    // the results.
    let scratch = std::path::absolute(home.work("bench-oracle-exec"))?;
    let mut summaries = Vec::new();
    let mut all = Vec::new();
    for (kind, prompts, max_tokens, stops) in [
        ("code", &code_prompts, opts.max_tokens, &humaneval::STOP[..]),
        ("chat", &chat_prompts, opts.chat_max_tokens, &[][..]),
    ] {
        if prompts.is_empty() {
            continue;
        }
        let mut reference: Option<Vec<OracleAnswer>> = None;
        for decide in &configs {
            let started = Instant::now();
            let mut answers = Vec::new();
            for p in prompts.iter() {
                let lease = pool.try_lease().context("no idle draft worker")?;
                let a =
                    decode(lease.as_ref(), &target, &tok, p, max_tokens, stops, *decide).await?;
                tracing::info!(kind, config = %decide.name(), id = %a.id, tokens = a.tokens, target = a.target_tokens, "answer");
                answers.push(a);
            }
            let seconds = started.elapsed().as_secs_f64();
            if kind == "code" {
                for (a, p) in answers.iter_mut().zip(&problems) {
                    let v =
                        humaneval::check(sandbox, p, &a.text, &scratch, Duration::from_secs(20))
                            .await?;
                    a.verdict = Some(v);
                }
            }
            // Target-only runs first: every configuration, itself included, is compared with it.
            if *decide == Decide::TargetOnly {
                reference = Some(answers.clone());
            }
            summaries.push(summarize(
                &decide.name(),
                kind,
                &answers,
                reference.as_deref(),
                seconds,
            ));
            all.push((kind.to_string(), decide.name(), answers));
        }
    }
    server.stop().await;
    gap_closed(&mut summaries);
    let report = OracleReport {
        date: utc_now(),
        machine: Machine::read(),
        max_tokens: (opts.max_tokens, opts.chat_max_tokens),
        summaries,
        answers: all,
    };
    std::fs::write(
        opts.out.join("oracle.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    let md = markdown(&report);
    std::fs::write(opts.out.join("oracle.md"), &md)?;
    println!("{md}");
    Ok(())
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
                max_tokens: (1, 2),
                summaries: s,
                answers: Vec::new(),
            })
            .contains("| chat | ratio:0.2 | 1 | 30.0 % | 30.0 | - | 0.450 | 75 % | 0.667 | 0 |")
        );
    }
}
