//! Importance labels on chat, made as the code labels are ([`crate::importance`]) with two
//! judges in place of the tests. Along the target's greedy answer, at every position where the
//! draft's greedy token differs, the draft's token is put in and the target finishes greedily.
//! The position is important iff
//! - an instruction checked by code (IFEval's checkers, where the prompt carries some) changes
//!   its verdict against the target's own answer, or
//! - the finished answer's mean negative log-likelihood per token under the target rises above
//!   the target's own answer's by more than a margin.
//!
//! The raw figures are kept (the likelihoods, every instruction's verdict, the finished text),
//! so the margin is chosen when rows are made ([`DEFAULT_MARGIN`] says why its value) and can
//! be chosen again without labelling again.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use approxy_setup::Home;
use approxy_verifier::{Draft, DraftMeta, Tokenizer};

use crate::dataset::{AGREES, HARMLESS, IMPORTANT, Rows};
use crate::importance::{
    Labeller, draft_tops, features_along, push_judged, save_shard, shard_path,
};
use crate::instructions::verdicts;

/// The target's most likely tokens kept at each position of its own answer: the draft's token
/// is nearly always among them, and its log-probability is read there.
pub const TOP_K: u32 = 20;

/// Nats per token the finished answer may lose against the target's own before the draft's
/// token counts as important. Chosen on labels read by hand (`training/scripts/
/// chat_margin_sample.py`; the reading is in training/README.md, "Chat importance labels"):
/// above 0.2 most differences changed what the answer says, below it few did.
pub const DEFAULT_MARGIN: f64 = 0.2;

/// A chat prompt to label along: the user message, and whether the instruction-following set's
/// checkers judge it.
#[derive(Debug, Clone)]
pub struct ChatPrompt {
    /// The corpus id, or the instruction set's `if-NN`.
    pub id: String,
    /// A number for grouping rows by prompt.
    pub number: u32,
    /// The prompt rendered through the chat template, in tokens.
    pub tokens: Vec<u32>,
    /// The instruction-following set carries instructions for it.
    pub instructions: bool,
}

/// One chat answer along which positions were labelled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatLabelledAnswer {
    /// The prompt's id.
    pub id: String,
    /// The rendered prompt's length in tokens.
    pub prompt_tokens: usize,
    /// The target's greedy answer.
    pub answer: Vec<u32>,
    /// The target's log-probability of each answer token.
    pub logprobs: Vec<f32>,
    /// Each instruction's strict verdict on the answer (empty: the prompt carries none).
    pub instructions: Vec<bool>,
    /// The labelled positions, in answer order.
    pub disagreements: Vec<ChatDisagreement>,
    /// Wall time the answer and its labels took.
    pub seconds: f64,
}

/// One position where the draft's greedy token is not the target's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatDisagreement {
    /// Position in the answer.
    pub at: usize,
    /// The draft's greedy token there.
    pub draft: u32,
    /// The target's greedy token there.
    pub target: u32,
    /// The target's log-probability of the draft's token there; `None` when it is outside the
    /// target's top [`TOP_K`] (the K-th's is counted in `nll`, so `nll` is then a lower bound).
    pub draft_logprob: Option<f32>,
    /// Tokens in the finished answer with the draft's token.
    pub tokens: usize,
    /// Its mean negative log-likelihood per token under the target.
    pub nll: f64,
    /// The same over the tokens from this position on (the draft's token and what the target
    /// wrote after it): the part that differs from the target's answer.
    pub suffix_nll: f64,
    /// Each instruction's strict verdict on it.
    pub instructions: Vec<bool>,
    /// Its text, to read a label by hand.
    pub text: String,
}

impl ChatLabelledAnswer {
    /// The target's answer's mean negative log-likelihood per token.
    pub fn nll(&self) -> f64 {
        mean_nll(&self.logprobs)
    }

    /// The target's answer's mean negative log-likelihood per token from position `at` on.
    pub fn suffix_nll(&self, at: usize) -> f64 {
        mean_nll(&self.logprobs[at.min(self.logprobs.len())..])
    }

    /// Whether the draft's token at `d` changes the answer, at `margin` nats per token.
    pub fn important(&self, d: &ChatDisagreement, margin: f64) -> bool {
        d.instructions != self.instructions || d.nll - self.nll() > margin
    }
}

fn mean_nll(logprobs: &[f32]) -> f64 {
    if logprobs.is_empty() {
        return 0.0;
    }
    -logprobs.iter().map(|&l| f64::from(l)).sum::<f64>() / logprobs.len() as f64
}

/// The log-probability of `token` in a list of the target's top entries; outside it, the
/// list's last (the least the target gives a token it lists).
pub fn logprob_in(top: &[(u32, f32)], token: u32) -> (Option<f32>, f32) {
    match top.iter().find(|e| e.0 == token) {
        Some(e) => (Some(e.1), e.1),
        None => (None, top.last().map_or(f32::NEG_INFINITY, |e| e.1)),
    }
}

/// What chat labelling needs beyond the code [`Labeller`]: where IFEval's checkers live.
pub struct InstructionJudge<'a> {
    /// The cache home (the checkers' venv).
    pub home: &'a Home,
    /// The instruction-following set (`tests/bench/instructions`).
    pub dir: &'a Path,
    /// Scratch space for the checkers' files.
    pub scratch: &'a Path,
}

/// Labels every disagreement along the target's greedy answer to `p`.
pub async fn along_target(
    l: &Labeller<'_>,
    judge: &InstructionJudge<'_>,
    draft: &dyn Draft,
    p: &ChatPrompt,
) -> anyhow::Result<ChatLabelledAnswer> {
    let started = Instant::now();
    let (answer, tops) = l.finish_scored(&p.tokens, &[], TOP_K).await?;
    let logprobs: Vec<f32> = answer
        .iter()
        .zip(&tops)
        .map(|(&t, top)| logprob_in(top, t).1)
        .collect();
    let drafted = draft_tops(draft, &p.tokens, &answer).await?;
    let at: Vec<(usize, u32)> = drafted
        .iter()
        .zip(&answer)
        .enumerate()
        .filter(|(_, (d, t))| d != t)
        .map(|(i, (&d, _))| (i, d))
        .collect();
    let (answer_ref, logprobs_ref, tops_ref) = (&answer, &logprobs, &tops);
    let mut disagreements: Vec<ChatDisagreement> =
        futures::stream::iter(at.into_iter().map(|(i, d)| {
            label_at(
                l,
                p,
                answer_ref,
                logprobs_ref,
                i,
                d,
                logprob_in(&tops_ref[i], d),
            )
        }))
        .buffered(l.concurrency.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    let text = l.completion(&answer)?;
    let instructions = if p.instructions {
        judge_instructions(judge, &p.id, &text, &mut disagreements).await?
    } else {
        Vec::new()
    };
    Ok(ChatLabelledAnswer {
        id: p.id.clone(),
        prompt_tokens: p.tokens.len(),
        answer,
        logprobs,
        instructions,
        disagreements,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The label at position `at` of the target's `answer` (with its `logprobs`), but the
/// instructions' verdicts ([`judge_instructions`] gives them): the draft's token `draft` put
/// in, the target finishing greedily, and the finished answer's likelihood. `draft_logprob`
/// is the target's log-probability of `draft` there (`None`: outside its list) and the one
/// counted for it.
pub async fn label_at(
    l: &Labeller<'_>,
    p: &ChatPrompt,
    answer: &[u32],
    logprobs: &[f32],
    at: usize,
    draft: u32,
    draft_logprob: (Option<f32>, f32),
) -> anyhow::Result<ChatDisagreement> {
    let head = [&answer[..at], &[draft]].concat();
    let (finished, after) = l.finish_scored(&p.tokens, &head, 1).await?;
    let mut lps = logprobs[..at].to_vec();
    lps.push(draft_logprob.1);
    for (&t, top) in finished[at + 1..].iter().zip(&after) {
        lps.push(logprob_in(top, t).1);
    }
    Ok(ChatDisagreement {
        at,
        draft,
        target: answer[at],
        draft_logprob: draft_logprob.0,
        tokens: finished.len(),
        nll: mean_nll(&lps),
        suffix_nll: mean_nll(&lps[at..]),
        instructions: Vec::new(),
        text: l.completion(&finished)?,
    })
}

/// Runs IFEval's checkers once over the target's answer and every finished answer with a draft
/// token, fills each disagreement's verdicts, and returns the target's.
pub async fn judge_instructions(
    judge: &InstructionJudge<'_>,
    id: &str,
    text: &str,
    disagreements: &mut [ChatDisagreement],
) -> anyhow::Result<Vec<bool>> {
    let one = |t: &str| vec![(id.to_string(), t.to_string())];
    let mut runs = vec![("target".to_string(), one(text))];
    for (i, d) in disagreements.iter().enumerate() {
        runs.push((format!("d{i}"), one(&d.text)));
    }
    let mut got = verdicts(judge.home, judge.dir, judge.scratch, &runs).await?;
    let mut take = |config: &str| -> anyhow::Result<Vec<bool>> {
        got.get_mut(config)
            .and_then(|by_id| by_id.remove(id))
            .with_context(|| format!("the checkers gave no verdict for {id} ({config})"))
    };
    let target = take("target")?;
    for (i, d) in disagreements.iter_mut().enumerate() {
        d.instructions = take(&format!("d{i}"))?;
    }
    Ok(target)
}

/// Labels `prompts` in shards of `shard_prompts` under `dir`, named `name`; shards already
/// there are skipped. Returns the answers labelled in this run.
pub async fn label_shards(
    l: &Labeller<'_>,
    judge: &InstructionJudge<'_>,
    draft: &dyn Draft,
    prompts: &[ChatPrompt],
    dir: &Path,
    name: &str,
    shard_prompts: usize,
) -> anyhow::Result<Vec<ChatLabelledAnswer>> {
    let mut done = Vec::new();
    for (i, chunk) in prompts.chunks(shard_prompts.max(1)).enumerate() {
        let file = shard_path(dir, name, i);
        if file.exists() {
            continue;
        }
        let started = Instant::now();
        let mut answers = Vec::new();
        for p in chunk {
            let a = along_target(l, judge, draft, p)
                .await
                .with_context(|| format!("labelling chat prompt {}", p.id))?;
            let important = a
                .disagreements
                .iter()
                .filter(|d| a.important(d, DEFAULT_MARGIN))
                .count();
            tracing::info!(id = %p.id, tokens = a.answer.len(), disagreements = a.disagreements.len(), important, seconds = a.seconds, "labelled");
            answers.push(a);
        }
        save_shard(&file, &answers)?;
        tracing::info!(shard = %file.display(), seconds = started.elapsed().as_secs_f64(), "shard written");
        done.extend(answers);
    }
    Ok(done)
}

/// Rows for an importance router on chat, as [`crate::importance::rows_of`] makes them on code:
/// the draft's features teacher-forced along each labelled answer, acceptable unless the
/// position is important at `margin`. Rows are of the chat kind.
pub async fn rows_of(
    draft: &dyn Draft,
    meta: &DraftMeta,
    tokenizer: &Tokenizer,
    prompts: &HashMap<String, ChatPrompt>,
    answers: &[ChatLabelledAnswer],
    margin: f64,
) -> anyhow::Result<Rows> {
    let mut rows = Rows::for_draft(meta);
    for a in answers {
        let p = prompts
            .get(&a.id)
            .with_context(|| format!("chat prompt {} is not in the sets", a.id))?;
        let features = features_along(
            draft,
            tokenizer,
            &a.id,
            &p.tokens,
            a.prompt_tokens,
            &a.answer,
        )
        .await?;
        for (i, f) in features.iter().enumerate() {
            let d = a.disagreements.iter().find(|d| d.at == i);
            let class = match d {
                None => AGREES,
                Some(d) if a.important(d, margin) => IMPORTANT,
                Some(_) => HARMLESS,
            };
            let proposed = d.map_or(a.answer[i], |d| d.draft);
            push_judged(&mut rows, f, class, proposed, p.number, 1);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer() -> ChatLabelledAnswer {
        let d = |at, nll: f64, instructions: Vec<bool>| ChatDisagreement {
            at,
            draft: 9,
            target: 1,
            draft_logprob: Some(-2.0),
            tokens: 4,
            nll,
            suffix_nll: nll,
            instructions,
            text: String::new(),
        };
        ChatLabelledAnswer {
            id: "if-01".into(),
            prompt_tokens: 3,
            answer: vec![1, 2, 3, 4],
            logprobs: vec![-0.5, -0.5, -0.5, -0.5],
            instructions: vec![true, false],
            disagreements: vec![
                d(0, 0.55, vec![true, false]),
                d(1, 0.7, vec![true, false]),
                d(2, 0.5, vec![true, true]),
            ],
            seconds: 1.0,
        }
    }

    #[test]
    fn a_position_is_important_when_an_instruction_flips_or_the_likelihood_falls_past_the_margin() {
        let a = answer();
        assert!((a.nll() - 0.5).abs() < 1e-9);
        let important: Vec<bool> = a
            .disagreements
            .iter()
            .map(|d| a.important(d, 0.1))
            .collect();
        assert_eq!(important, [false, true, true]);
        let wider: Vec<bool> = a
            .disagreements
            .iter()
            .map(|d| a.important(d, 0.3))
            .collect();
        assert_eq!(wider, [false, false, true]);
    }

    #[test]
    fn a_token_outside_the_targets_list_counts_at_the_lists_last() {
        let top = [(5, -0.1), (7, -3.0)];
        assert_eq!(logprob_in(&top, 7), (Some(-3.0), -3.0));
        assert_eq!(logprob_in(&top, 8), (None, -3.0));
        assert!((mean_nll(&[-1.0, -3.0]) - 2.0).abs() < 1e-9);
        assert_eq!(mean_nll(&[]), 0.0);
    }

    #[test]
    fn chat_shards_round_trip() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let a = answer();
        save_shard(
            &shard_path(dir.path(), "chat-target", 0),
            std::slice::from_ref(&a),
        )?;
        let back: Vec<ChatLabelledAnswer> = crate::importance::load(dir.path(), "chat-")?;
        assert_eq!(back, vec![a]);
        Ok(())
    }
}
