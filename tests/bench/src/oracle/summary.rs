//! Each configuration's answers summed per kind, priced against target-only's, and the share
//! of the likelihood gap it closes.

use serde::{Deserialize, Serialize};

use crate::call_floor::{Rates, cheapest};
use crate::chat_sample::rouge_l;
use crate::humaneval::Verdict;
use crate::instructions::InstructionScores;
use crate::machine::Machine;

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

pub(super) fn summarize(
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
pub(super) fn fill_cheapest(
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
    let mut out: Vec<(String, Rates)> = crate::prices::CLASSES
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
    let runs: Vec<crate::calls::CallsRun> = match std::fs::read(path)
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
        .filter(|r| r.config == crate::calls::CallConfig::TargetOnly && r.layout == "pinned")
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
pub(super) fn gap_closed(summaries: &mut [OracleSummary]) {
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

#[cfg(test)]
pub(super) mod tests {
    use super::super::markdown::markdown;
    use super::*;

    pub(in super::super) fn answer(
        tokens: usize,
        target: usize,
        nll: f64,
        text: &str,
    ) -> OracleAnswer {
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
        assert_eq!(classes.len(), crate::prices::CLASSES.len() + 1);
        assert_eq!(
            cost_classes(Some(std::path::Path::new("/nonexistent"))).len(),
            crate::prices::CLASSES.len()
        );
    }
}
