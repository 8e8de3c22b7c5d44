//! Label collection: for each prompt, the target's own greedy answer from its API, then the
//! draft teacher-forced over prompt + answer. At every answer position the row holds the
//! draft's features and whether the draft's top token equals the target's token there.
//! Target calls run two at a time (a llama-server with two slots) while the draft works on
//! the answer that arrived before, and every finished shard is skipped on a rerun.

use std::path::Path;
use std::sync::Arc;

use futures::StreamExt;
use indicatif::ProgressBar;

use approxy_verifier::target::{ContinuationRequest, TargetClient};
use approxy_verifier::verify::Features;
use approxy_verifier::{DraftPool, SamplingParams};

use crate::dataset::{Rows, shard_path};

/// One prompt to collect on.
#[derive(Debug, Clone)]
pub struct CollectItem {
    /// Corpus id.
    pub id: u32,
    /// 0 = code, 1 = chat.
    pub kind: u8,
    /// Prompt token ids (chat template applied).
    pub prompt: Vec<u32>,
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

/// Collects rows for `items` into shards under `out`.
pub async fn collect(
    pool: Arc<DraftPool>,
    target: Arc<dyn TargetClient>,
    items: &[CollectItem],
    out: &Path,
    opts: &CollectOptions,
    pb: &ProgressBar,
) -> anyhow::Result<CollectSummary> {
    std::fs::create_dir_all(out)?;
    let mut summary = CollectSummary::default();
    let hidden_size = pool.meta().hidden_size;
    for (i, chunk) in items.chunks(opts.shard_prompts.max(1)).enumerate() {
        let path = shard_path(out, i);
        if path.exists() {
            summary.shards_skipped += 1;
            pb.inc(chunk.len() as u64);
            continue;
        }
        let mut rows = Rows::new(hidden_size);
        let answers = futures::stream::iter(chunk.iter().map(|item| {
            let target = Arc::clone(&target);
            let req = ContinuationRequest {
                prefix: item.prompt.clone(),
                max_tokens: opts.max_answer_tokens,
                sampling: SamplingParams::default(),
                model: None,
            };
            async move { (item, target.continue_tokens(&req).await) }
        }))
        .buffered(opts.concurrency.max(1));
        futures::pin_mut!(answers);
        while let Some((item, answer)) = answers.next().await {
            let answer = answer?.tokens;
            teacher_force(&pool, item, &answer, &mut rows).await?;
            pb.inc(1);
        }
        rows.save(&path)?;
        summary.shards_written += 1;
        summary.rows += rows.len();
        // The progress bar hides itself off a terminal; logs still show progress.
        tracing::info!(shard = i, rows = rows.len(), done = pb.position(), of = pb.length().unwrap_or(0), "shard written");
    }
    Ok(summary)
}

/// Runs the draft over prompt + answer and appends one row per answer position.
pub async fn teacher_force(pool: &Arc<DraftPool>, item: &CollectItem, answer: &[u32], rows: &mut Rows) -> anyhow::Result<()> {
    let Some((_, feed)) = answer.split_last() else { return Ok(()) };
    let lease = pool.try_lease().ok_or_else(|| anyhow::anyhow!("no idle draft worker"))?;
    // The output at the last prompt position predicts answer[0]; feeding answer[..n-1]
    // gives the outputs that predict answer[1..].
    let mut outs = vec![lease.prefill(item.prompt.clone()).await?];
    if !feed.is_empty() {
        outs.extend(lease.extend(feed.to_vec(), true).await?);
    }
    for (out, &truth) in outs.iter().zip(answer) {
        let f = Features::from_output(out);
        rows.push(&f.stats, &f.hidden, f.top1 == truth, item.id, item.kind);
    }
    Ok(())
}
