//! Label collection, in two modes. Teacher forcing: for each prompt, the target's own greedy
//! answer from its API, then the draft teacher-forced over prompt + answer; at every answer
//! position the row holds the draft's features (in the context of the answer before it, as
//! `verify::features::along_answer` computes it for serving too) and whether the draft's top
//! token equals the target's token there. Live: the real decode loop runs with a verifier and
//! a threshold, and the rows are the positions it visits, including those after a wrongly
//! accepted draft token that teacher forcing never sees; each is labelled with the target's
//! greedy token after exactly that prefix. In both, every target call asks for the target's
//! top-[`TARGET_TOP_K`] log-probabilities at each position it generates, and the rows keep them
//! (a target kind that gives none leaves them unknown, with a warning): every acceptance
//! rule's label is computed from them. Target calls run two at a time (a llama-server with
//! two slots), and every finished shard is skipped on a rerun.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use indicatif::ProgressBar;

use approxy_verifier::draft::PositionOutput;
use approxy_verifier::targets::{CacheHints, ContinuationRequest, TargetClient, TargetConfig};
use approxy_verifier::template::ChatMessage;
use approxy_verifier::verify::features::along_answer;
use approxy_verifier::{
    Draft, DraftPool, DraftWorkers, Engine, GenerateRequest, SamplingParams, Source, Tokenizer,
    Verifier,
};

use crate::dataset::{Rows, TARGET_TOP_K, ensure_draft_build, live_shard_path, shard_path};

/// One prompt to collect on.
#[derive(Debug, Clone)]
pub struct CollectItem {
    /// Corpus id.
    pub id: u32,
    /// 0 = code, 1 = chat.
    pub kind: u8,
    /// Prompt token ids (chat template applied).
    pub prompt: Vec<u32>,
    /// The messages the prompt was rendered from (chat-level targets are sent these).
    pub messages: Arc<Vec<ChatMessage>>,
}

impl CollectItem {
    /// A continuation request for the target after `prefix` (this item's prompt and part of
    /// an answer).
    fn request(&self, prefix: Vec<u32>, max_tokens: u32) -> ContinuationRequest {
        ContinuationRequest {
            prefix,
            prompt_len: self.prompt.len(),
            messages: Some(Arc::clone(&self.messages)),
            max_tokens,
            sampling: SamplingParams::default(),
            model: None,
            top_logprobs: TARGET_TOP_K as u32,
            answer: None,
            allowed: Vec::new(),
        }
    }
}

/// Collection settings.
#[derive(Debug, Clone)]
pub struct CollectOptions {
    /// Longest target answer per prompt.
    pub max_answer_tokens: u32,
    /// Prompts per shard file.
    pub shard_prompts: usize,
    /// Target calls in flight.
    pub concurrency: usize,
}

/// What a collection run did.
#[derive(Debug, Clone, Default)]
pub struct CollectSummary {
    /// Shards written in this run.
    pub shards_written: usize,
    /// Shards found from an earlier run.
    pub shards_skipped: usize,
    /// Rows written in this run.
    pub rows: usize,
}

/// The shard loop both modes share: `items` in shards of `shard_prompts` under `out`, a
/// shard already on disk skipped (so a rerun resumes), each new one filled by `fill` and saved.
async fn write_shards<'a, F, Fut>(
    items: &'a [CollectItem],
    out: &Path,
    shard_prompts: usize,
    draft_build: &str,
    path_of: fn(&Path, usize) -> PathBuf,
    pb: &ProgressBar,
    mut fill: F,
) -> anyhow::Result<CollectSummary>
where
    F: FnMut(&'a [CollectItem]) -> Fut,
    Fut: Future<Output = anyhow::Result<Rows>>,
{
    std::fs::create_dir_all(out)?;
    ensure_draft_build(out, draft_build)?;
    let mut summary = CollectSummary::default();
    for (i, chunk) in items.chunks(shard_prompts.max(1)).enumerate() {
        let path = path_of(out, i);
        if path.exists() {
            summary.shards_skipped += 1;
            pb.inc(chunk.len() as u64);
            continue;
        }
        let rows = fill(chunk).await?;
        rows.save(&path)?;
        summary.shards_written += 1;
        summary.rows += rows.len();
        // The progress bar hides itself off a terminal; logs still show progress.
        tracing::info!(shard = %path.display(), rows = rows.len(), done = pb.position(), of = pb.length().unwrap_or(0), "shard written");
    }
    Ok(summary)
}

/// Collects teacher-forced rows for `items` into shards under `out`.
pub async fn collect(
    pool: Arc<DraftPool>,
    target: Arc<dyn TargetClient>,
    tokenizer: &Tokenizer,
    items: &[CollectItem],
    out: &Path,
    opts: &CollectOptions,
    pb: &ProgressBar,
) -> anyhow::Result<CollectSummary> {
    let (pool, target) = (&pool, &target);
    write_shards(
        items,
        out,
        opts.shard_prompts,
        &pool.meta().build(),
        shard_path,
        pb,
        |chunk| async move {
            let mut rows = Rows::for_draft(pool.meta());
            let answers = futures::stream::iter(chunk.iter().map(|item| {
                let target = Arc::clone(target);
                let req = item.request(item.prompt.clone(), opts.max_answer_tokens);
                async move { (item, target.continue_tokens(&req).await) }
            }))
            .buffered(opts.concurrency.max(1));
            futures::pin_mut!(answers);
            while let Some((item, answer)) = answers.next().await {
                let answer = answer?;
                warn_without_probs(&answer.top_logprobs, answer.tokens.len());
                let probs = (answer.top_logprobs.len() == answer.tokens.len())
                    .then_some(answer.top_logprobs.as_slice());
                teacher_force(pool, tokenizer, item, &answer.tokens, probs, &mut rows).await?;
                pb.inc(1);
            }
            Ok(rows)
        },
    )
    .await
}

/// Says once per process that the target gave no probabilities (a kind that cannot): the rows
/// then carry only the identity label.
fn warn_without_probs(probs: &[Vec<(u32, f32)>], tokens: usize) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if tokens > 0 && probs.len() != tokens {
        WARNED.call_once(|| {
            tracing::warn!(
                got = probs.len(),
                tokens,
                "the target gave no top log-probabilities: rows carry the identity label only"
            );
        });
    }
}

/// Runs the draft over prompt + answer and appends one row per answer position, with the
/// target's top log-probabilities at each position when `target_probs` has them.
pub async fn teacher_force(
    pool: &Arc<DraftPool>,
    tokenizer: &Tokenizer,
    item: &CollectItem,
    answer: &[u32],
    target_probs: Option<&[Vec<(u32, f32)>]>,
    rows: &mut Rows,
) -> anyhow::Result<()> {
    let lease = pool
        .try_lease()
        .ok_or_else(|| anyhow::anyhow!("no idle draft worker"))?;
    let outs = draft_outputs(lease.as_ref(), &item.prompt, answer).await?;
    for (i, (f, &truth)) in along_answer(&outs, answer, tokenizer)?
        .iter()
        .zip(answer)
        .enumerate()
    {
        let probs = target_probs.and_then(|p| p.get(i)).map(Vec::as_slice);
        rows.push_with_target(f, f.top1 == truth, item.id, item.kind, probs);
    }
    Ok(())
}

/// The draft's output at every answer position: the one that predicts `answer[i]`.
pub(crate) async fn draft_outputs(
    lease: &dyn Draft,
    prompt: &[u32],
    answer: &[u32],
) -> anyhow::Result<Vec<PositionOutput>> {
    let Some((_, feed)) = answer.split_last() else {
        return Ok(Vec::new());
    };
    // The output at the last prompt position predicts answer[0]; feeding answer[..n-1]
    // gives the outputs that predict answer[1..].
    let mut outs = vec![lease.prefill(prompt.to_vec()).await?];
    if !feed.is_empty() {
        outs.extend(lease.extend(feed.to_vec(), true).await?);
    }
    Ok(outs)
}

/// Live-decode collection settings.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// Longest live answer per prompt.
    pub max_tokens: u32,
    /// Threshold the live loop decides with.
    pub threshold: f32,
    /// Prompts per shard file.
    pub shard_prompts: usize,
    /// Target calls in flight while labelling.
    pub concurrency: usize,
}

/// The second mode: rows at the positions the live decode loop visits (greedy, one
/// correction token per rejection, no bail-out, so every position is a verifier decision).
/// Features come from the draft run over the live answer, which gives exactly the numbers
/// the loop saw (the draft's prefill is deterministic whatever its history), and the context
/// is the live answer's own (where the target corrected the draft, the draft disagreed).
pub async fn collect_live(
    pool: Arc<DraftPool>,
    engine: &Engine,
    verifier: &dyn Verifier,
    items: &[CollectItem],
    out: &Path,
    opts: &LiveOptions,
    pb: &ProgressBar,
) -> anyhow::Result<CollectSummary> {
    let pool = &pool;
    write_shards(
        items,
        out,
        opts.shard_prompts,
        &pool.meta().build(),
        live_shard_path,
        pb,
        |chunk| async move {
            let mut rows = Rows::for_draft(pool.meta());
            for item in chunk {
                let lease = pool
                    .try_lease()
                    .ok_or_else(|| anyhow::anyhow!("no idle draft worker"))?;
                let visited = live_decode(engine, lease.as_ref(), verifier, item, opts).await?;
                let tokens: Vec<u32> = visited.iter().map(|v| v.0).collect();
                let outs = draft_outputs(lease.as_ref(), &item.prompt, &tokens).await?;
                drop(lease);
                let truths =
                    label_visited(engine.target(), item, &visited, opts.concurrency).await?;
                let features = along_answer(&outs, &tokens, engine.tokenizer())?;
                for (f, (truth, probs)) in features.iter().zip(truths) {
                    let probs = (!probs.is_empty()).then_some(probs.as_slice());
                    rows.push_with_target(f, truth == Some(f.top1), item.id, item.kind, probs);
                }
                pb.inc(1);
            }
            Ok(rows)
        },
    )
    .await
}

/// Runs the live loop once; returns each emitted token and who produced it.
async fn live_decode(
    engine: &Engine,
    lease: &dyn Draft,
    verifier: &dyn Verifier,
    item: &CollectItem,
    opts: &LiveOptions,
) -> anyhow::Result<Vec<(u32, Source)>> {
    let req = GenerateRequest {
        prompt: item.prompt.clone(),
        max_tokens: opts.max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        threshold: opts.threshold,
        cost_guard: None,
        model: None,
        messages: Some(Arc::clone(&item.messages)),
        settings: Default::default(),
        constraint: None,
    };
    emitted_by(engine, lease, verifier, req).await
}

/// Runs the decode loop on `req`; returns each emitted token and who produced it.
pub(crate) async fn emitted_by(
    engine: &Engine,
    lease: &dyn Draft,
    verifier: &dyn Verifier,
    req: GenerateRequest,
) -> anyhow::Result<Vec<(u32, Source)>> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<approxy_verifier::TokenEvent>(64);
    let drain = async move {
        let mut v = Vec::new();
        while let Some(e) = rx.recv().await {
            if let Some(id) = e.id {
                v.push((id, e.source));
            }
        }
        v
    };
    let (stats, visited) = tokio::join!(engine.generate(lease, verifier, req, tx), drain);
    stats?;
    Ok(visited)
}

/// The target's greedy token after each visited prefix, and its top log-probabilities there:
/// one single-token call per position (where the loop rejected, the target already chose the
/// emitted token, but its probabilities there need the call too). `None` means the target
/// would have ended the answer there.
async fn label_visited(
    target: &Arc<dyn TargetClient>,
    item: &CollectItem,
    visited: &[(u32, Source)],
    concurrency: usize,
) -> anyhow::Result<Vec<(Option<u32>, Vec<(u32, f32)>)>> {
    let prompt = item.prompt.as_slice();
    let tokens: Vec<u32> = visited.iter().map(|v| v.0).collect();
    let calls = visited.iter().enumerate().map(|(i, &(id, source))| {
        let target = Arc::clone(target);
        let prefix = [prompt, &tokens[..i]].concat();
        async move {
            let req = item.request(prefix, 1);
            let c = target.continue_tokens(&req).await?;
            warn_without_probs(&c.top_logprobs, c.tokens.len());
            // Where the loop rejected, the emitted token is the target's own choice.
            let truth = if source == Source::Target {
                Some(id)
            } else {
                c.tokens.first().copied()
            };
            let probs = c.top_logprobs.into_iter().next().unwrap_or_default();
            anyhow::Ok((truth, probs))
        }
    });
    futures::stream::iter(calls)
        .buffered(concurrency.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// How training reaches a target: patient (long answers on a loaded CPU) and retried.
pub fn patient_target(url: &str, api_key: Option<String>, model: &str) -> TargetConfig {
    TargetConfig {
        base_url: url.to_string(),
        api_key,
        model: model.to_string(),
        timeout: Duration::from_secs(300),
        retries: 3,
        backoff: Duration::from_millis(500),
        ca_file: None,
        cache_hints: CacheHints::default(),
        use_env_proxy: false,
    }
}
