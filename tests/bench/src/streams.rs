//! `approxy bench streams`: the draft's batched decode across concurrent streams in one worker
//! (the draft's goals for many streams). C streams, each after its own prompt at a set context length,
//! decode greedily together; for each C: all streams' tokens a second, each stream's (p50 and
//! p10), the ratio to one stream alone, and the memory each stream adds (the process's
//! resident memory, read while the C streams still hold their caches at their longest, and
//! again once they have left).
//! Run at several context lengths, it shows how a stream's context sets what batching gains: the
//! weights are read once a step whatever the width, while attention reads every row's cache.
//! A benchmark, not a test: the goals are reported, never asserted.

use std::sync::Arc;
use std::time::Instant;

use approxy_verifier::sampling::argmax;
use approxy_verifier::{Draft, DraftConfig, DraftPool, DraftWorkers, Tokenizer};
use serde_json::json;

use approxy_setup::Home;

use crate::servers::rss_bytes;
use crate::stats::quantile;

/// Options for the streams benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct StreamsOptions {
    /// Concurrent stream counts, comma-separated.
    #[arg(long, default_value = "1,2,4,8,16", value_delimiter = ',')]
    pub streams: Vec<usize>,
    /// Tokens each stream decodes (after a warm-up of 8).
    #[arg(long, default_value_t = 64)]
    pub tokens: usize,
    /// Prompt tokens before decoding, the context each stream's cache holds; comma-separated
    /// for a sweep. The goals are read at [`GOAL_CONTEXT`] when it is among them.
    #[arg(long, default_value = "1024", value_delimiter = ',')]
    pub context: Vec<u64>,
    /// Intra-op threads of the worker.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Write the JSON report here as well as to stdout.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

/// The context the goals are read at: the memory goal's.
pub const GOAL_CONTEXT: u64 = 1024;

/// Distinct prompts of `context` tokens: the i-th stream's.
fn prompt(tok: &Tokenizer, i: usize, context: usize) -> anyhow::Result<Vec<u32>> {
    let text = format!(
        "<|im_start|>user\nStream {i}. {}<|im_end|>\n<|im_start|>assistant\n",
        "Summarise the following notes on hash maps, trees and queues in order. "
            .repeat(context / 12 + 1)
    );
    let ids = tok.encode(&text)?;
    let tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n")?;
    let keep = context.saturating_sub(tail.len()).min(ids.len());
    Ok(ids[..keep].iter().chain(&tail).copied().collect())
}

/// One stream: prefill, 8 warm-up steps, then `tokens` timed greedy steps after `start`'s
/// barrier; its tokens a second, and its lease (still holding the stream's cache, so that
/// memory is read with every stream at its longest).
async fn stream(
    lease: Box<dyn Draft>,
    prompt: Vec<u32>,
    tokens: usize,
    ready: Arc<tokio::sync::Barrier>,
) -> anyhow::Result<(f64, Box<dyn Draft>)> {
    let mut out = lease.prefill(prompt).await?;
    let step = async |out: &approxy_verifier::draft::PositionOutput| {
        let next = argmax(&out.logits).0 as u32;
        lease
            .extend(vec![next], false)
            .await?
            .pop()
            .ok_or_else(|| anyhow::anyhow!("no output"))
    };
    for _ in 0..8 {
        out = step(&out).await?;
    }
    ready.wait().await;
    let t = Instant::now();
    for _ in 0..tokens {
        out = step(&out).await?;
    }
    let speed = tokens as f64 / t.elapsed().as_secs_f64();
    Ok((speed, lease))
}

/// Runs the benchmark and prints (and writes) a JSON report.
pub fn streams(opts: &StreamsOptions) -> anyhow::Result<()> {
    let (counts, contexts) = (&opts.streams, &opts.context);
    let most = counts.iter().copied().max().unwrap_or(1);
    let home = Home::from_env()?;
    let cfg = DraftConfig {
        streams_per_worker: most,
        ..DraftConfig::one_stream_per_worker(
            home.draft_onnx_dir(),
            home.onnxruntime_lib(),
            1,
            opts.threads,
        )
    };
    let tok = Tokenizer::from_file(&cfg.model_dir.join("tokenizer.json"))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let pool = DraftPool::start(&cfg)?;
    let mut rows = Vec::new();
    for &context in contexts {
        let prompts: Vec<Vec<u32>> = (0..most)
            .map(|i| prompt(&tok, i, context as usize))
            .collect::<Result<_, _>>()?;
        rows.extend(run_context(
            &rt,
            &pool,
            &prompts,
            counts,
            context,
            opts.tokens,
        )?);
    }
    let goal_context = if contexts.contains(&GOAL_CONTEXT) {
        GOAL_CONTEXT
    } else {
        contexts.first().copied().unwrap_or(GOAL_CONTEXT)
    };
    let report = json!({
        "benchmark": "draft_streams",
        "date": crate::machine::utc_now(),
        "machine": crate::machine::Machine::read().line(),
        "threads": opts.threads,
        "contexts": contexts,
        "tokens_per_stream": opts.tokens,
        "kv_bytes_per_position": 2 * pool.meta().num_hidden_layers * pool.meta().num_key_value_heads * pool.meta().head_dim * 4,
        "goals": goals_at(&rows, goal_context),
        "by_context": contexts.iter().map(|&c| goals_at(&rows, c)).collect::<Vec<_>>(),
        "results": rows,
        // The allocator's purge delay decides how soon what a batch's re-layouts freed leaves
        // the process (the binary sets it to 0 unless the environment sets it).
        "command": format!(
            "{}approxy bench streams --streams {} --tokens {} --context {} --threads {}",
            std::env::var("MIMALLOC_PURGE_DELAY").map_or(String::new(), |v| format!("MIMALLOC_PURGE_DELAY={v} ")),
            joined(counts), opts.tokens, joined(contexts), opts.threads
        ),
    });
    let text = serde_json::to_string_pretty(&report)?;
    if let Some(p) = &opts.out {
        std::fs::write(p, &text)?;
    }
    println!("{text}");
    Ok(())
}

/// `1,2,4`: a list as its flag is written.
fn joined<T: ToString>(items: &[T]) -> String {
    items.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

/// The runs at one context: for each count of streams, its row of the report (speeds against
/// the first count's, taken as one alone, and resident memory with the streams and after).
fn run_context(
    rt: &tokio::runtime::Runtime,
    pool: &DraftPool,
    prompts: &[Vec<u32>],
    counts: &[usize],
    context: u64,
    tokens: usize,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let pid = std::process::id();
    let mut rows = Vec::new();
    let mut alone = None;
    let mut step_alone = None;
    for &c in counts {
        let before = rss_bytes(pid).unwrap_or(0);
        let rows_before = pool.rows();
        let ready = Arc::new(tokio::sync::Barrier::new(c));
        let (speeds, leases): (Vec<f64>, Vec<Box<dyn Draft>>) = rt.block_on(async {
            let tasks: Vec<_> = (0..c)
                .map(|i| {
                    let lease = pool
                        .try_lease()
                        .ok_or_else(|| anyhow::anyhow!("no stream free"))?;
                    Ok(tokio::spawn(stream(
                        lease,
                        prompts[i].clone(),
                        tokens,
                        Arc::clone(&ready),
                    )))
                })
                .collect::<anyhow::Result<_>>()?;
            let mut v = Vec::new();
            for t in tasks {
                v.push(t.await??);
            }
            anyhow::Ok(v.into_iter().unzip())
        })?;
        let streaming = rss_bytes(pid).unwrap_or(0);
        let rows_after = pool.rows();
        let (stepped, asked) = (rows_after.0 - rows_before.0, rows_after.1 - rows_before.1);
        drop(leases);
        // What the streams' end gives back: the worker frees the batch when the last leaves.
        std::thread::sleep(std::time::Duration::from_millis(500));
        let after = rss_bytes(pid).unwrap_or(0);
        let total: f64 = speeds.iter().sum();
        let p50 = quantile(&speeds, 0.5).unwrap_or(0.0);
        let one = *alone.get_or_insert(p50);
        // The worker's own mean time for a decode step of c rows (ONNX Runtime's run and the
        // outputs' copies): what the model allows, apart from the pool's waits.
        let step_ms = pool.speed(0, c).map(|s| 1e3 / s);
        let step_one = *step_alone.get_or_insert(step_ms);
        eprintln!("{context} tokens, {c} streams: {total:.1} tokens/s in all, {p50:.1} each (p50)");
        rows.push(json!({
            "context": context,
            "streams": c,
            "tokens_per_second_all": total,
            "stream_tokens_per_second_p50": p50,
            "stream_tokens_per_second_p10": quantile(&speeds, 0.1).unwrap_or(0.0),
            "all_vs_one_alone": total / one,
            "stream_vs_alone_p50": p50 / one,
            "step_ms": step_ms,
            // All streams' throughput against one alone if the steps were all the time spent.
            "steps_allow_vs_one_alone": step_ms.zip(step_one).map(|(m, m1)| c as f64 * m1 / m),
            // Of the rows the decode steps ran, the share a stream had asked for: the others
            // ran filler for a stream not back from its last step in time.
            "rows_asked_share": (stepped > 0).then(|| asked as f64 / stepped as f64),
            "rss_mib_before": before as f64 / (1 << 20) as f64,
            "rss_mib_streaming": streaming as f64 / (1 << 20) as f64,
            "rss_mib_after": after as f64 / (1 << 20) as f64,
        }));
    }
    Ok(rows)
}

/// The three goals' readings at `context`.
fn goals_at(rows: &[serde_json::Value], context: u64) -> serde_json::Value {
    let at = |c: usize, key: &str| {
        rows.iter()
            .find(|r| r["context"] == context && r["streams"] == c)
            .and_then(|r| r[key].as_f64())
    };
    let per_stream_mib = match (at(1, "rss_mib_streaming"), at(8, "rss_mib_streaming")) {
        (Some(a), Some(b)) => Some((b - a) / 7.0),
        _ => None,
    };
    json!({
        "context": context,
        "all_at_8_vs_one_alone": { "goal": ">= 3.0", "measured": at(8, "all_vs_one_alone") },
        "stream_at_4_vs_alone": { "goal": ">= 0.6", "measured": at(4, "stream_vs_alone_p50") },
        "mib_per_stream_at_context": { "goal": "<= 30 (28.6 MiB)", "measured": per_stream_mib },
    })
}

/// The report of `streams.json` as a Markdown table, with where each goal stands (read at
/// [`GOAL_CONTEXT`]) and each other context's reading of them.
pub fn markdown(report: &serde_json::Value) -> String {
    // Reports before the context sweep had one context, at the top level.
    let contexts: Vec<u64> = report["contexts"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c.as_u64()).collect())
        .unwrap_or_else(|| report["context_tokens"].as_u64().into_iter().collect());
    let mut md = format!(
        "The draft alone, one worker on one core (`{}`), {} prompt tokens a stream, {} tokens timed; {}, {}.\n\n\
         | context | streams | tokens/s, all streams | each stream (p50 / p10) | all against one alone | each against alone | step ms (what the steps allow) | rows asked for | resident MiB, streaming / after |\n|---|---|---|---|---|---|---|---|---|\n",
        report["command"].as_str().unwrap_or(""),
        contexts
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        report["tokens_per_stream"],
        report["machine"].as_str().unwrap_or(""),
        report["date"].as_str().unwrap_or(""),
    );
    for r in report["results"].as_array().into_iter().flatten() {
        md.push_str(&result_row(report, r));
    }
    md.push_str(&goals_section(report));
    md
}

/// One result's row: its context, its streams and what they measured.
fn result_row(report: &serde_json::Value, r: &serde_json::Value) -> String {
    let context = r["context"]
        .as_u64()
        .or_else(|| report["context_tokens"].as_u64());
    let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
    format!(
        "| {} | {} | {:.1} | {:.1} / {:.1} | {:.2}x | {:.2}x | {} | {} | {:.0} / {:.0} |\n",
        context.map_or("-".into(), |c| c.to_string()),
        r["streams"],
        f("tokens_per_second_all"),
        f("stream_tokens_per_second_p50"),
        f("stream_tokens_per_second_p10"),
        f("all_vs_one_alone"),
        f("stream_vs_alone_p50"),
        r["step_ms"].as_f64().map_or("-".into(), |m| format!(
            "{m:.1} ({:.2}x)",
            r["steps_allow_vs_one_alone"].as_f64().unwrap_or(0.0)
        )),
        // Reports before the rows were counted have none.
        r["rows_asked_share"]
            .as_f64()
            .map_or("-".into(), |s| format!("{:.1} %", 100.0 * s)),
        f("rss_mib_streaming"),
        f("rss_mib_after"),
    )
}

/// Where each goal stands at the goals' context, and the same readings at the other contexts.
fn goals_section(report: &serde_json::Value) -> String {
    let mut md = String::new();
    let goals = &report["goals"];
    let read = |g: &serde_json::Value| g["measured"].as_f64();
    let shown = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
    let line = |name: &str, goal: &serde_json::Value, met: fn(f64) -> bool| {
        let m = read(goal);
        format!(
            "- {name}: goal {}, measured {}: {}.\n",
            goal["goal"].as_str().unwrap_or(""),
            shown(m),
            if m.is_some_and(met) { "met" } else { "not met" }
        )
    };
    md.push_str(&format!(
        "\nThe goals, read at {} tokens of context:\n\n",
        goals["context"]
            .as_u64()
            .or_else(|| report["context_tokens"].as_u64())
            .map_or("-".into(), |c| format!("{c}"))
    ));
    md.push_str(&line(
        "all streams at 8 against one alone",
        &goals["all_at_8_vs_one_alone"],
        |v| v >= 3.0,
    ));
    md.push_str(&line(
        "each stream at 4 against alone",
        &goals["stream_at_4_vs_alone"],
        |v| v >= 0.6,
    ));
    md.push_str(&line(
        "MiB each stream adds (8 against 1)",
        &goals["mib_per_stream_at_context"],
        |v| v <= 28.6,
    ));
    let others: Vec<&serde_json::Value> = report["by_context"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["context"] != goals["context"])
        .collect();
    if !others.is_empty() {
        md.push_str("\nThe same readings at the other contexts:\n\n");
        for g in others {
            md.push_str(&format!(
                "- {} tokens: all streams at 8 {}x one alone, each stream at 4 {}x alone, {} MiB a stream.\n",
                g["context"],
                shown(read(&g["all_at_8_vs_one_alone"])),
                shown(read(&g["stream_at_4_vs_alone"])),
                shown(read(&g["mib_per_stream_at_context"])),
            ));
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(context: Option<u64>, streams: u64, all: f64) -> serde_json::Value {
        let mut r = json!({
            "streams": streams, "tokens_per_second_all": all * 20.0,
            "stream_tokens_per_second_p50": 20.0, "stream_tokens_per_second_p10": 19.0,
            "all_vs_one_alone": all, "stream_vs_alone_p50": all / streams as f64,
            "step_ms": 40.0, "steps_allow_vs_one_alone": all,
            "rss_mib_streaming": 500.0, "rss_mib_after": 490.0,
        });
        if context != Some(128) {
            r["rows_asked_share"] = json!(0.875);
        }
        if let Some(c) = context {
            r["context"] = json!(c);
        }
        r
    }

    fn goals(context: u64, all8: f64) -> serde_json::Value {
        json!({
            "context": context,
            "all_at_8_vs_one_alone": { "goal": ">= 3.0", "measured": all8 },
            "stream_at_4_vs_alone": { "goal": ">= 0.6", "measured": 0.5 },
            "mib_per_stream_at_context": { "goal": "<= 30 (28.6 MiB)", "measured": 28.0 },
        })
    }

    #[test]
    fn a_sweep_reads_the_goals_at_their_context_and_lists_the_others() {
        let report = json!({
            "contexts": [128, 1024], "tokens_per_stream": 48, "command": "c", "machine": "m", "date": "d",
            "results": [row(Some(128), 8, 3.2), row(Some(1024), 8, 2.1)],
            "goals": goals(1024, 2.1),
            "by_context": [goals(128, 3.2), goals(1024, 2.1)],
        });
        let md = markdown(&report);
        assert!(md.contains("128, 1024 prompt tokens"), "{md}");
        assert!(md.contains("| 128 | 8 | 64.0 |"), "{md}");
        assert!(md.contains("(2.10x) | 87.5 % |"), "{md}");
        assert!(md.contains("read at 1024 tokens"), "{md}");
        assert!(md.contains("measured 2.10: not met"), "{md}");
        assert!(
            md.contains(
                "MiB each stream adds (8 against 1): goal <= 30 (28.6 MiB), measured 28.00: met"
            ),
            "{md}"
        );
        assert!(
            md.contains("- 128 tokens: all streams at 8 3.20x one alone"),
            "{md}"
        );
        assert!(!md.contains("- 1024 tokens:"), "{md}");
    }

    #[test]
    fn a_report_of_one_context_before_the_sweep_still_reads() {
        let mut g = goals(0, 2.1);
        g.as_object_mut().map(|o| o.remove("context"));
        let report = json!({
            "context_tokens": 1024, "tokens_per_stream": 48, "command": "c", "machine": "m", "date": "d",
            "results": [row(None, 8, 2.1)], "goals": g,
        });
        let md = markdown(&report);
        assert!(md.contains("| 1024 | 8 |"), "{md}");
        assert!(md.contains("(2.10x) | 87.5 % |"), "{md}");
        assert!(md.contains("read at 1024 tokens"), "{md}");
        assert!(!md.contains("other contexts"), "{md}");
    }
}
