//! Importance labels, made as AutoJudge makes them, with HumanEval's tests as the judge. Along
//! an answer, at every position where the draft's greedy token differs from the target's, put
//! the draft's token in, let the target finish greedily, and run the problem's tests: the
//! position is important iff the tests' verdict differs from the verdict with the target's
//! token there (also finished by the target). A draft token that differs harmlessly (another
//! name, another comment, another equivalent expression) is then one a verifier may accept.
//!
//! Two paths: the target's own greedy answer (its verdict with the target's token is the
//! answer's own), and approxy's live answer at a threshold (positions the target never
//! reaches; both sides are finished by the target). Labels are kept as JSON lines, one answer
//! a line, in shards of a few problems written whole, so a long run resumes where it stopped
//! and the labels can be committed; the draft's features are computed again from them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use approxy_verifier::targets::{ContinuationRequest, LlamaCppTarget, TargetClient};
use approxy_verifier::verify::Features;
use approxy_verifier::verify::features::along_answer;
use approxy_verifier::{
    Draft, DraftMeta, Engine, GenerateRequest, SamplingParams, Source, Tokenizer, Verifier,
};

use crate::collect::{draft_outputs, emitted_by, patient_target};
use crate::corpus::HumanEvalProblem;
use crate::dataset::{AGREES, HARMLESS, IMPORTANCE_UNKNOWN, IMPORTANT, Rows};
use crate::humaneval::{Sandbox, Verdict, check};

/// Tokens asked of the target per call while it finishes an answer: small enough that an
/// answer cut at a stop wastes little, and each call after the first is served from its cache.
const CHUNK: u32 = 32;

/// One answer along which positions were labelled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabelledAnswer {
    /// HumanEval's id of the problem.
    pub task_id: String,
    /// `target` (the target's own greedy answer) or `live@T` (approxy's at threshold T).
    pub path: String,
    /// The problem's prompt, in tokens.
    pub prompt_tokens: usize,
    /// The answer's tokens, cut at HumanEval's stops.
    pub answer: Vec<u32>,
    /// Who wrote each answer token on a live path (`d` draft, `t` target, `g` grammar);
    /// empty on the target's path.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sources: String,
    /// The tests' verdict on the answer.
    pub passed: bool,
    /// The labelled positions, in answer order.
    pub disagreements: Vec<Disagreement>,
    /// Wall time the answer and its labels took.
    pub seconds: f64,
}

/// One position where the draft's greedy token is not the target's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Disagreement {
    /// Position in the answer.
    pub at: usize,
    /// The draft's greedy token there.
    pub draft: u32,
    /// The target's greedy token there.
    pub target: u32,
    /// The tests' verdict when the draft's token is put in and the target finishes.
    pub passed_with_draft: bool,
    /// The verdict with the target's token there (on the target's path, the answer's own).
    pub passed_with_target: bool,
    /// The verdicts differ: the draft's token there changes the answer.
    pub important: bool,
    /// The completion with the draft's token put in, as tested (to read a label by hand).
    pub completion_with_draft: String,
}

impl LabelledAnswer {
    /// Positions labelled and those of them that are important.
    pub fn counts(&self) -> (usize, usize) {
        let important = self.disagreements.iter().filter(|d| d.important).count();
        (self.disagreements.len(), important)
    }
}

/// The llama-server target labels are made with.
pub fn label_target(url: &str) -> anyhow::Result<std::sync::Arc<dyn TargetClient>> {
    Ok(std::sync::Arc::new(LlamaCppTarget::new(patient_target(
        url, None, "",
    ))?))
}

/// What labelling runs with.
pub struct Labeller<'a> {
    /// The target, greedy.
    pub target: &'a dyn TargetClient,
    /// The draft's (and the target's) tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// How the tests run.
    pub sandbox: Sandbox,
    /// Where test programs are written.
    pub scratch: &'a Path,
    /// Longest answer.
    pub max_answer_tokens: u32,
    /// Texts that end an answer (HumanEval's [`crate::humaneval::STOP`] on code, none on chat).
    pub stops: &'a [&'a str],
    /// Longest a problem's tests may run.
    pub test_timeout: Duration,
    /// Target calls and test runs in flight.
    pub concurrency: usize,
}

impl Labeller<'_> {
    /// The completion HumanEval's harness tests: the answer's text up to the first stop,
    /// without an end-of-sequence token.
    pub fn completion(&self, answer: &[u32]) -> anyhow::Result<String> {
        let eos = self.tokenizer.end_of_sequence_ids();
        let body = match answer.last() {
            Some(last) if eos.contains(last) => &answer[..answer.len() - 1],
            _ => answer,
        };
        let mut text = self.tokenizer.decode(body)?;
        if let Some(cut) = self.stops.iter().filter_map(|s| text.find(s)).min() {
            text.truncate(cut);
        }
        Ok(text)
    }

    /// True when `answer` is finished: it ends in end-of-sequence, its text reached a stop,
    /// or it is as long as allowed.
    fn ended(&self, answer: &[u32]) -> anyhow::Result<bool> {
        if answer.len() >= self.max_answer_tokens as usize {
            return Ok(true);
        }
        let eos = self.tokenizer.end_of_sequence_ids();
        if answer.last().is_some_and(|t| eos.contains(t)) {
            return Ok(true);
        }
        if self.stops.is_empty() {
            return Ok(false);
        }
        let text = self.tokenizer.decode(answer)?;
        Ok(self.stops.iter().any(|s| text.contains(s)))
    }

    /// `head` finished greedily by the target after `prompt`: the whole answer, cut after
    /// the token that ends it.
    pub async fn finish(&self, prompt: &[u32], head: &[u32]) -> anyhow::Result<Vec<u32>> {
        Ok(self.finish_scored(prompt, head, 0).await?.0)
    }

    /// [`Labeller::finish`], with the target's `top_k` most likely tokens and their
    /// log-probabilities (before sampling) at each position it wrote after `head` (none when
    /// `top_k` is 0).
    pub async fn finish_scored(
        &self,
        prompt: &[u32],
        head: &[u32],
        top_k: u32,
    ) -> anyhow::Result<(Vec<u32>, Vec<Vec<(u32, f32)>>)> {
        let mut answer = head.to_vec();
        let mut tops = Vec::new();
        while !self.ended(&answer)? {
            let want = CHUNK.min(self.max_answer_tokens - answer.len() as u32);
            let req = ContinuationRequest {
                prompt_len: prompt.len(),
                top_logprobs: top_k,
                ..ContinuationRequest::greedy([prompt, &answer].concat(), want)
            };
            let c = self.target.continue_tokens(&req).await?;
            let got = c.tokens.len();
            anyhow::ensure!(
                top_k == 0 || c.top_logprobs.len() == got,
                "the target gave {} lists of log-probabilities for {got} tokens",
                c.top_logprobs.len()
            );
            let mut lists = c.top_logprobs.into_iter();
            for t in c.tokens {
                answer.push(t);
                tops.extend(lists.next());
                if self.ended(&answer)? {
                    return Ok((answer, tops));
                }
            }
            if got < want as usize || c.stopped_on_eos {
                break;
            }
        }
        Ok((answer, tops))
    }

    /// The tests' verdict on an answer (a timeout fails).
    pub async fn passes(&self, p: &HumanEvalProblem, answer: &[u32]) -> anyhow::Result<bool> {
        let text = self.completion(answer)?;
        let v = check(self.sandbox, p, &text, self.scratch, self.test_timeout).await?;
        Ok(v == Verdict::Passed)
    }

    /// The target's verdict after `prompt + head`, finished by the target, and the completion.
    async fn finished_verdict(
        &self,
        p: &HumanEvalProblem,
        prompt: &[u32],
        head: Vec<u32>,
    ) -> anyhow::Result<(bool, String)> {
        let answer = self.finish(prompt, &head).await?;
        let passed = self.passes(p, &answer).await?;
        Ok((passed, self.completion(&answer)?))
    }

    /// The label at one position: the draft's token `draft` put in after `prompt + head` and
    /// finished by the target, against the target's token `target` there, finished by the
    /// target too (or with the verdict `passed_with_target` when it is known already).
    pub async fn label_at(
        &self,
        p: &HumanEvalProblem,
        prompt: &[u32],
        head: &[u32],
        draft: u32,
        target: u32,
        passed_with_target: Option<bool>,
    ) -> anyhow::Result<Disagreement> {
        let with = |tok: u32| [head, &[tok]].concat();
        let (with_draft, text) = self.finished_verdict(p, prompt, with(draft)).await?;
        let with_target = match passed_with_target {
            Some(v) => v,
            None => self.finished_verdict(p, prompt, with(target)).await?.0,
        };
        Ok(Disagreement {
            at: head.len(),
            draft,
            target,
            passed_with_draft: with_draft,
            passed_with_target: with_target,
            important: with_draft != with_target,
            completion_with_draft: text,
        })
    }

    /// [`Labeller::label_at`] at each `(position, draft's token, target's token)` of `at`
    /// along `answer`, a few at a time.
    async fn label_all(
        &self,
        p: &HumanEvalProblem,
        prompt: &[u32],
        answer: &[u32],
        at: Vec<(usize, u32, u32)>,
        passed_with_target: Option<bool>,
    ) -> anyhow::Result<Vec<Disagreement>> {
        futures::stream::iter(
            at.into_iter()
                .map(|(i, d, t)| self.label_at(p, prompt, &answer[..i], d, t, passed_with_target)),
        )
        .buffered(self.concurrency.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
    }

    /// Labels every disagreement along the target's own greedy answer.
    pub async fn along_target(
        &self,
        draft: &dyn Draft,
        p: &HumanEvalProblem,
    ) -> anyhow::Result<LabelledAnswer> {
        let started = Instant::now();
        let prompt = self.tokenizer.encode(&p.prompt)?;
        let answer = self.finish(&prompt, &[]).await?;
        let passed = self.passes(p, &answer).await?;
        let tops = draft_tops(draft, &prompt, &answer).await?;
        let at: Vec<(usize, u32, u32)> = tops
            .iter()
            .zip(&answer)
            .enumerate()
            .filter(|(_, (d, t))| d != t)
            .map(|(i, (&d, &t))| (i, d, t))
            .collect();
        let disagreements = self
            .label_all(p, &prompt, &answer, at, Some(passed))
            .await?;
        Ok(LabelledAnswer {
            task_id: p.task_id.clone(),
            path: "target".into(),
            prompt_tokens: prompt.len(),
            answer,
            sources: String::new(),
            passed,
            disagreements,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Labels every disagreement along approxy's live answer: the decode loop with `verifier`
    /// at `threshold` (greedy, one correction token per rejection), as a request to approxy
    /// would run it. Where the target did not write the token, one single-token call finds
    /// its greedy token there; both sides of a disagreement are finished by the target.
    pub async fn along_live(
        &self,
        engine: &Engine,
        draft: &dyn Draft,
        verifier: &dyn Verifier,
        threshold: f32,
        p: &HumanEvalProblem,
    ) -> anyhow::Result<LabelledAnswer> {
        let started = Instant::now();
        let prompt = self.tokenizer.encode(&p.prompt)?;
        let visited = live_answer(engine, draft, verifier, threshold, &prompt, self).await?;
        let mut answer: Vec<u32> = Vec::new();
        let mut sources = String::new();
        for &(t, s) in &visited {
            answer.push(t);
            sources.push(match s {
                Source::Draft => 'd',
                Source::Target => 't',
                Source::Grammar => 'g',
            });
            if self.ended(&answer)? {
                break;
            }
        }
        let passed = self.passes(p, &answer).await?;
        let tops = draft_tops(draft, &prompt, &answer).await?;
        let (prompt_ref, answer_ref) = (&prompt, &answer);
        let greedy = futures::stream::iter(answer.iter().zip(sources.chars()).enumerate().map(
            |(i, (&emitted, s))| async move {
                if s == 't' {
                    return anyhow::Ok(Some(emitted));
                }
                let req = ContinuationRequest {
                    prompt_len: prompt_ref.len(),
                    ..ContinuationRequest::greedy([prompt_ref, &answer_ref[..i]].concat(), 1)
                };
                Ok(self
                    .target
                    .continue_tokens(&req)
                    .await?
                    .tokens
                    .first()
                    .copied())
            },
        ))
        .buffered(self.concurrency.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
        let at: Vec<(usize, u32, u32)> = tops
            .iter()
            .zip(&greedy)
            .enumerate()
            .filter_map(|(i, (&d, t))| t.filter(|&t| t != d).map(|t| (i, d, t)))
            .collect();
        let disagreements = self.label_all(p, &prompt, &answer, at, None).await?;
        Ok(LabelledAnswer {
            task_id: p.task_id.clone(),
            path: format!("live@{threshold}"),
            prompt_tokens: prompt.len(),
            answer,
            sources,
            passed,
            disagreements,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// The draft's greedy token at every answer position (teacher-forced, as the rows see it).
pub(crate) async fn draft_tops(
    draft: &dyn Draft,
    prompt: &[u32],
    answer: &[u32],
) -> anyhow::Result<Vec<u32>> {
    Ok(draft_outputs(draft, prompt, answer)
        .await?
        .iter()
        .map(|o| Features::from_output(o).top1)
        .collect())
}

/// Runs the decode loop once on a completion prompt, cut at HumanEval's stops.
async fn live_answer(
    engine: &Engine,
    draft: &dyn Draft,
    verifier: &dyn Verifier,
    threshold: f32,
    prompt: &[u32],
    l: &Labeller<'_>,
) -> anyhow::Result<Vec<(u32, Source)>> {
    let req = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens: l.max_answer_tokens,
        sampling: SamplingParams::default(),
        stop: l.stops.iter().map(|s| (*s).to_string()).collect(),
        threshold,
        cost_guard: None,
        model: None,
        messages: None,
        settings: Default::default(),
        constraint: None,
    };
    emitted_by(engine, draft, verifier, req).await
}

/// Rows for an importance router: at every position of each labelled answer, the draft's
/// features teacher-forced along the answer (as the decode loop computes them, context and
/// syntax included), labelled acceptable unless the position is an important disagreement.
/// Each row's [`Rows::importance`] says which of agreement, harmless or important it is
/// (unknown where this draft proposes another token than the labelled one).
/// The prompt id is the problem's HumanEval number; rows along live answers are marked live.
pub async fn rows_of(
    draft: &dyn Draft,
    meta: &DraftMeta,
    tokenizer: &Tokenizer,
    problems: &[HumanEvalProblem],
    answers: &[LabelledAnswer],
) -> anyhow::Result<Rows> {
    let mut rows = Rows::for_draft(meta);
    for a in answers {
        let (number, p) = problems
            .iter()
            .enumerate()
            .find(|(_, p)| p.task_id == a.task_id)
            .with_context(|| format!("{} is not a HumanEval problem", a.task_id))?;
        let prompt = tokenizer.encode(&p.prompt)?;
        let features = features_along(
            draft,
            tokenizer,
            &a.task_id,
            &prompt,
            a.prompt_tokens,
            &a.answer,
        )
        .await?;
        let first = rows.len();
        for (i, f) in features.iter().enumerate() {
            let d = a.disagreements.iter().find(|d| d.at == i);
            let class = match d {
                None => AGREES,
                Some(d) if d.important => IMPORTANT,
                Some(_) => HARMLESS,
            };
            let proposed = match d {
                Some(d) => d.draft,
                None if a.path == "target" => a.answer[i],
                None => f.top1,
            };
            push_judged(&mut rows, f, class, proposed, number as u32, 0);
            rows.live[first + i] = a.path != "target";
        }
    }
    Ok(rows)
}

/// The draft's features teacher-forced along a labelled `answer` after `prompt` (as the decode
/// loop computes them, context and syntax included), once the prompt is known to be as long as
/// when it was labelled.
pub(crate) async fn features_along(
    draft: &dyn Draft,
    tokenizer: &Tokenizer,
    id: &str,
    prompt: &[u32],
    labelled_prompt: usize,
    answer: &[u32],
) -> anyhow::Result<Vec<Features>> {
    anyhow::ensure!(
        prompt.len() == labelled_prompt,
        "{id}: the prompt is {} tokens here and {labelled_prompt} in the labels (another tokenizer?)",
        prompt.len(),
    );
    let outs = draft_outputs(draft, prompt, answer).await?;
    Ok(along_answer(&outs, answer, tokenizer)?)
}

/// Adds a row of `class` (acceptable unless important). A draft run on another machine may
/// propose another token than the labelled one (`proposed`) at a near-tie: the label is not
/// about that token, so the row is left unjudged.
pub(crate) fn push_judged(
    rows: &mut Rows,
    f: &Features,
    class: u8,
    proposed: u32,
    prompt_id: u32,
    kind: u8,
) {
    let class = if f.top1 == proposed {
        class
    } else {
        IMPORTANCE_UNKNOWN
    };
    rows.push(f, class != IMPORTANT, prompt_id, kind);
    let at = rows.len() - 1;
    rows.importance[at] = class;
}

/// The file of shard `i` of the labels named `name` (`target`, `live@0.85`; held-out
/// problems' shards are named apart).
pub fn shard_path(dir: &Path, name: &str, i: usize) -> PathBuf {
    dir.join(format!("{}-{i:03}.jsonl", name.replace('@', "-")))
}

/// Reads every label shard in `dir` whose name starts with `prefix`, in name order.
pub fn load<T: DeserializeOwned>(dir: &Path, prefix: &str) -> anyhow::Result<Vec<T>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "jsonl")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        out.extend(read_shard(&f)?);
    }
    Ok(out)
}

/// The labelled answers of one shard.
pub fn read_shard<T: DeserializeOwned>(path: &Path) -> anyhow::Result<Vec<T>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, line)| {
            serde_json::from_str(line).with_context(|| format!("{}:{}", path.display(), n + 1))
        })
        .collect()
}

/// Writes a shard whole (a unique temporary file renamed into place): an interrupted run
/// leaves no half shard for a rerun to skip.
pub fn save_shard<T: Serialize>(path: &Path, answers: &[T]) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut text = String::new();
    for a in answers {
        text.push_str(&serde_json::to_string(a)?);
        text.push('\n');
    }
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, text.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path)?;
    Ok(())
}

/// Which answers to label along.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PathKind {
    /// The target's own greedy answers.
    Target,
    /// approxy's live answers at this threshold (confidence verifier).
    Live(f32),
}

impl PathKind {
    /// The name the labels carry and their shards are named by.
    pub fn name(self) -> String {
        match self {
            Self::Target => "target".into(),
            Self::Live(t) => format!("live@{t}"),
        }
    }
}

/// Labels `problems` in shards of `shard_problems` under `dir`, named `prefix` + the path;
/// shards already there are skipped, and a shard's problems already labelled (its
/// `.jsonl.partial` file, read by no study and committed with the shards, so a fresh machine
/// resumes too) are not labelled again. Returns the answers of the shards written in this run.
#[allow(clippy::too_many_arguments)]
pub async fn label_shards(
    l: &Labeller<'_>,
    engine: &Engine,
    draft: &dyn Draft,
    verifier: &dyn Verifier,
    path: PathKind,
    problems: &[HumanEvalProblem],
    dir: &Path,
    prefix: &str,
    shard_problems: usize,
) -> anyhow::Result<Vec<LabelledAnswer>> {
    let name = format!("{prefix}{}", path.name());
    let mut done = Vec::new();
    for (i, chunk) in problems.chunks(shard_problems.max(1)).enumerate() {
        let file = shard_path(dir, &name, i);
        if file.exists() {
            continue;
        }
        let started = Instant::now();
        // Each problem's labels are kept as they are made (a problem can take half an hour),
        // so a run stopped mid-shard resumes at its next problem.
        let partial = file.with_extension("jsonl.partial");
        let mut answers: Vec<LabelledAnswer> = if partial.exists() {
            read_shard(&partial)?
        } else {
            Vec::new()
        };
        for p in chunk {
            if answers.iter().any(|a| a.task_id == p.task_id) {
                continue;
            }
            let a = match path {
                PathKind::Target => l.along_target(draft, p).await,
                PathKind::Live(t) => l.along_live(engine, draft, verifier, t, p).await,
            }
            .with_context(|| format!("labelling {}", p.task_id))?;
            let (n, important) = a.counts();
            tracing::info!(task = %p.task_id, tokens = a.answer.len(), passed = a.passed, disagreements = n, important, seconds = a.seconds, "labelled");
            answers.push(a);
            save_shard(&partial, &answers)?;
        }
        save_shard(&file, &answers)?;
        std::fs::remove_file(&partial).ok();
        tracing::info!(shard = %file.display(), seconds = started.elapsed().as_secs_f64(), "shard written");
        done.extend(answers);
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(important: &[bool]) -> LabelledAnswer {
        LabelledAnswer {
            task_id: "HumanEval/0".into(),
            path: "target".into(),
            prompt_tokens: 3,
            answer: vec![1, 2, 3],
            sources: String::new(),
            passed: true,
            disagreements: important
                .iter()
                .enumerate()
                .map(|(i, &imp)| Disagreement {
                    at: i,
                    draft: 9,
                    target: 1,
                    passed_with_draft: !imp,
                    passed_with_target: true,
                    important: imp,
                    completion_with_draft: String::new(),
                })
                .collect(),
            seconds: 1.0,
        }
    }

    #[test]
    fn shards_round_trip_and_are_read_by_prefix() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let a = answer(&[true, false]);
        save_shard(
            &shard_path(dir.path(), "target", 0),
            std::slice::from_ref(&a),
        )?;
        save_shard(
            &shard_path(dir.path(), "held-out-target", 0),
            &[answer(&[])],
        )?;
        let back: Vec<LabelledAnswer> = load(dir.path(), "target")?;
        assert_eq!(back, vec![a]);
        assert_eq!(back[0].counts(), (2, 1));
        assert_eq!(load::<LabelledAnswer>(dir.path(), "held-out-")?.len(), 1);
        assert!(shard_path(dir.path(), "live@0.85", 3).ends_with("live-0.85-003.jsonl"));
        Ok(())
    }
}
