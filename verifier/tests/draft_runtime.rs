//! The ONNX draft runtime on the real converted model: decoding, KV-cache rollback and
//! prefix reuse must give the same numbers as running from scratch.

// Tests fail by panicking; helpers here are test code too.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod common;

use approxy_verifier::draft::PositionOutput;
use approxy_verifier::draft::session::DraftSession;
use approxy_verifier::sampling::argmax;

/// For calls whose caller never leaves.
const NEVER_GONE: &dyn Fn() -> bool = &|| false;

fn session() -> DraftSession {
    let h = common::home();
    DraftSession::load(
        &h.onnxruntime_lib(),
        &h.draft_onnx_dir(),
        common::meta(),
        2,
        false,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn max_diff(a: &PositionOutput, b: &PositionOutput) -> f32 {
    a.logits
        .iter()
        .zip(&b.logits)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn greedy_decode_writes_python() {
    let mut s = session();
    let mut out = s
        .prefill(
            &common::chat_prompt("Write a Python function add(a, b) that returns a + b."),
            NEVER_GONE,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.hidden.len(), common::meta().hidden_size);
    assert_eq!(out.logits.len(), common::meta().vocab_size);
    let mut ids = Vec::new();
    for _ in 0..24 {
        let t = argmax(&out.logits).0 as u32;
        ids.push(t);
        out = s
            .extend(&[t], false, NEVER_GONE)
            .unwrap_or_else(|e| panic!("{e}"))
            .remove(0);
    }
    let text = common::tokenizer()
        .decode(&ids)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(text.contains("def add"), "draft wrote: {text:?}");
}

#[test]
fn rollback_then_rerun_matches() {
    let mut s = session();
    let prompt = common::chat_prompt("Say hello.");
    s.prefill(&prompt, NEVER_GONE)
        .unwrap_or_else(|e| panic!("{e}"));
    let extra = common::tokenizer()
        .encode("Hello there, friend")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(extra.len() >= 3);
    let first = s
        .extend(&extra, true, NEVER_GONE)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first.len(), extra.len());
    assert_eq!(s.tokens().len(), prompt.len() + extra.len());
    s.rollback(2);
    assert_eq!(s.tokens().len(), prompt.len() + extra.len() - 2);
    let again = s
        .extend(&extra[extra.len() - 2..], true, NEVER_GONE)
        .unwrap_or_else(|e| panic!("{e}"));
    for (a, b) in first[first.len() - 2..].iter().zip(&again) {
        assert!(max_diff(a, b) < 1e-2, "logits differ by {}", max_diff(a, b));
        assert_eq!(argmax(&a.logits).0, argmax(&b.logits).0);
    }
}

#[test]
fn prefill_reuses_common_prefix() {
    let mut warm = session();
    let a = common::chat_prompt("What is 2 + 2?");
    let b = common::chat_prompt("What is 2 + 3?");
    warm.prefill(&a, NEVER_GONE)
        .unwrap_or_else(|e| panic!("{e}"));
    let reused = warm
        .prefill(&b, NEVER_GONE)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut cold = session();
    let fresh = cold
        .prefill(&b, NEVER_GONE)
        .unwrap_or_else(|e| panic!("{e}"));
    // Bit-identical: the answer to a prompt must not depend on what the worker did before.
    assert_eq!(reused.logits, fresh.logits);
    // The identical prompt again is answered from the cached last output.
    let same = warm
        .prefill(&b, NEVER_GONE)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(same.logits, reused.logits);
}

#[test]
fn prefill_is_independent_of_history() {
    let long =
        common::chat_prompt(&"Explain how a hash map resolves collisions, in detail. ".repeat(12));
    assert!(long.len() > 130);
    let mut cold = session();
    let fresh = cold
        .prefill(&long, NEVER_GONE)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut warm = session();
    // Histories that leave different cached prefixes: a shorter prompt, generated tokens, a rollback.
    warm.prefill(&long[..70], NEVER_GONE)
        .unwrap_or_else(|e| panic!("{e}"));
    warm.extend(&long[70..100], false, NEVER_GONE)
        .unwrap_or_else(|e| panic!("{e}"));
    warm.extend(&[11, 12, 13], false, NEVER_GONE)
        .unwrap_or_else(|e| panic!("{e}"));
    let again = warm
        .prefill(&long, NEVER_GONE)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.logits, fresh.logits);
    warm.extend(&[5, 6], false, NEVER_GONE)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        warm.prefill(&long, NEVER_GONE)
            .unwrap_or_else(|e| panic!("{e}"))
            .logits,
        fresh.logits
    );
}

#[test]
fn long_prompt_is_chunked() {
    let mut s = session();
    let long = common::chat_prompt(&"the quick brown fox jumps over the lazy dog. ".repeat(20));
    assert!(long.len() > 150);
    let out = s
        .prefill(&long, NEVER_GONE)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.tokens().len(), long.len());
    assert!(out.logits.iter().all(|x| x.is_finite()));
}

/// A panic inside a worker fails that call only: the worker stays alive and leasable, its
/// session starts over, and it computes what it computed before.
#[cfg(feature = "testing")]
#[tokio::test]
async fn a_worker_that_panics_carries_on() {
    use approxy_verifier::{DraftPool, DraftWorkers};
    let pool = DraftPool::start(&common::draft_config(1)).unwrap_or_else(|e| panic!("{e}"));
    let prompt = common::chat_prompt("Say hello.");
    let before = pool
        .try_lease()
        .unwrap()
        .prefill(prompt.clone())
        .await
        .unwrap();
    assert!(pool.inject_panic().await.is_err());
    assert_eq!((pool.alive(), pool.idle()), (1, 1));
    let lease = pool.try_lease().expect("the worker is leasable again");
    let after = lease.prefill(prompt).await.unwrap();
    assert_eq!(argmax(&before.logits), argmax(&after.logits));
    assert!(
        max_diff(&before, &after) < 1e-3,
        "{}",
        max_diff(&before, &after)
    );
}

/// Trimming an idle session keeps the start of its cache (still reused by the next prompt),
/// gives the rest of the memory back, and changes no result.
#[test]
fn trimming_frees_memory_and_keeps_results() {
    let mut s = session();
    // Long enough that the buffers grew well past their first size.
    let long = common::chat_prompt(&"the quick brown fox jumps over the lazy dog. ".repeat(100));
    let before = s.prefill(&long, NEVER_GONE).unwrap();
    let full = s.kv_bytes();
    s.trim(64);
    assert!(
        s.kv_bytes() < full / 2,
        "{} of {full} bytes kept",
        s.kv_bytes()
    );
    assert_eq!(s.tokens(), &long[..64]);
    let again = s.prefill(&long, NEVER_GONE).unwrap();
    assert_eq!(argmax(&before.logits), argmax(&again.logits));
    assert!(max_diff(&before, &again) < 1e-3);
}

/// A prefill whose caller leaves stops at the next chunk, keeps the cache and its token list in
/// step (whole chunks only), and a later prefill gives exactly what a fresh one does.
#[test]
fn an_abandoned_prefill_stops_between_chunks_and_stays_consistent() {
    let mut s = session();
    let long = common::chat_prompt(&"the quick brown fox jumps over the lazy dog. ".repeat(60));
    assert!(long.len() > 5 * 64);
    let asked = std::cell::Cell::new(0);
    let gone_after_three = || {
        asked.set(asked.get() + 1);
        asked.get() > 3
    };
    assert!(s.prefill(&long, &gone_after_three).is_err());
    assert_eq!(s.tokens(), &long[..3 * 64]);
    let resumed = s.prefill(&long, NEVER_GONE).unwrap();
    let fresh = session().prefill(&long, NEVER_GONE).unwrap();
    assert_eq!(argmax(&resumed.logits), argmax(&fresh.logits));
    assert!(
        max_diff(&resumed, &fresh) < 1e-3,
        "{}",
        max_diff(&resumed, &fresh)
    );
}

/// A client that leaves during a long prefill frees its worker: the next request's prefill
/// does not wait for the rest of the abandoned one. (Relative to a prefill of the same length
/// on the same worker, measured in the test: the abandoned one would add about as much again.)
#[tokio::test]
async fn a_lease_dropped_during_prefill_frees_the_worker() {
    use approxy_verifier::{DraftPool, DraftWorkers};
    use std::time::Instant;
    let pool = DraftPool::start(&common::draft_config(1)).unwrap_or_else(|e| panic!("{e}"));
    let prompt = |word: &str| common::chat_prompt(&format!("{word} ").repeat(1200));
    let started = Instant::now();
    pool.try_lease()
        .unwrap()
        .prefill(prompt("alpha"))
        .await
        .unwrap();
    let alone = started.elapsed();
    // Leaves a fifth of the way in.
    let lease = pool.try_lease().unwrap();
    assert!(
        tokio::time::timeout(alone / 5, lease.prefill(prompt("beta")))
            .await
            .is_err()
    );
    drop(lease);
    let started = Instant::now();
    pool.try_lease()
        .unwrap()
        .prefill(prompt("gamma"))
        .await
        .unwrap();
    let after = started.elapsed();
    assert!(
        after < alone.mul_f64(1.4),
        "the next prefill took {after:?}, one alone {alone:?}: it waited for the abandoned one"
    );
}

/// A greedy decode of `n` tokens on `lease`: the tokens, and at each the draft's margin
/// between its top two logits and its logits.
async fn greedy(
    lease: Box<dyn approxy_verifier::draft::Draft>,
    prompt: Vec<u32>,
    n: usize,
) -> Vec<(u32, f32, Vec<f32>)> {
    let mut out = lease.prefill(prompt).await.unwrap();
    let mut steps = Vec::new();
    for _ in 0..n {
        let s = out.scan();
        let t = s.top1 as u32;
        let mut second = f32::NEG_INFINITY;
        for (i, &l) in out.logits.iter().enumerate() {
            if i != s.top1 && l > second {
                second = l;
            }
        }
        steps.push((t, out.logits[s.top1] - second, out.logits.clone()));
        out = lease.extend(vec![t], false).await.unwrap().remove(0);
    }
    steps
}

/// Four streams batched in one worker against the same four run alone: the same greedy
/// tokens, or a parting only where the draft's top two were within the batch's numerical
/// noise. (The batch runs other shapes through ONNX Runtime's int4 kernels, so its numbers
/// differ in the last bits; the figures printed are what the many-streams goals read.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_four_matches_four_runs_alone() {
    use approxy_verifier::{DraftPool, DraftWorkers};
    const N: usize = 48;
    let pool = DraftPool::start(&common::batched_config(4)).unwrap_or_else(|e| panic!("{e}"));
    let prompts: Vec<Vec<u32>> = [
        "Write a Python function that checks whether a string is a palindrome.",
        "Explain in two sentences why the sky is blue.",
        "List three uses of a hash map.",
        "Write a haiku about autumn rain.",
    ]
    .iter()
    .map(|p| common::chat_prompt(p))
    .collect();
    let mut alone = Vec::new();
    for p in &prompts {
        alone.push(greedy(pool.try_lease().unwrap(), p.clone(), N).await);
    }
    let together: Vec<_> = prompts
        .iter()
        .map(|p| tokio::spawn(greedy(pool.try_lease().unwrap(), p.clone(), N)))
        .collect();
    let mut parted = 0;
    let mut noise = 0.0f32;
    for (i, (t, a)) in together.into_iter().zip(&alone).enumerate() {
        let b = t.await.unwrap();
        let same = a.iter().zip(&b).take_while(|(x, y)| x.0 == y.0).count();
        for (x, y) in a.iter().zip(&b).take(same + 1).take(N) {
            let d =
                x.2.iter()
                    .zip(&y.2)
                    .map(|(p, q)| (p - q).abs())
                    .fold(0.0, f32::max);
            noise = noise.max(d);
        }
        if same < N {
            parted += 1;
            let margin = a[same].1;
            eprintln!("stream {i}: parts at {same} of {N}, the draft's top two {margin:.4} apart");
            assert!(
                margin <= 2.0 * noise,
                "stream {i} parted at {same} where the top two were {margin} apart (noise {noise})"
            );
        }
    }
    eprintln!(
        "batched against alone: {parted} of 4 streams parted in {N} tokens; largest logit difference {noise:.4}"
    );
    assert!(noise < 2.0, "the batch moved a logit by {noise}");
}

/// Several tokens at once for a stream while another shares its batch (what the target's text
/// and a lookup's proposals feed): the batch runs it, and its outputs are those of the same
/// extend alone, within the batch's numerical noise. The builder's graph refused this step
/// ("batch_size must be 1 when sequence_length > 1 and past context is given"), which is why the
/// runtime loads the regrouped graph.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_extend_of_several_tokens_matches_it_alone() {
    use approxy_verifier::{DraftPool, DraftWorkers};
    let pool = DraftPool::start(&common::batched_config(2)).unwrap_or_else(|e| panic!("{e}"));
    let a = common::chat_prompt("Write a Python function that reverses a list.");
    let b = common::chat_prompt("Name three rivers in Europe.");
    let more = common::tokenizer()
        .encode("def reverse(xs):\n    return xs[::-1]")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(more.len() >= 6);
    let alone = {
        let lease = pool.try_lease().unwrap();
        lease.prefill(a.clone()).await.unwrap();
        lease.extend(more.clone(), true).await.unwrap()
    };
    let la = pool.try_lease().unwrap();
    let lb = pool.try_lease().unwrap();
    la.prefill(a).await.unwrap();
    lb.prefill(b).await.unwrap();
    // A step together first, so that both hold rows of the batch with a past.
    let (x, y) = tokio::join!(la.extend(vec![more[0]], false), lb.extend(vec![13], false));
    x.unwrap();
    y.unwrap();
    la.rollback(1).await.unwrap();
    let (x, y) = tokio::join!(
        la.extend(more.clone(), true),
        lb.extend(vec![13, 14, 15], true)
    );
    let together = x.unwrap_or_else(|e| panic!("a batched extend of several tokens failed: {e}"));
    assert_eq!(y.unwrap_or_else(|e| panic!("{e}")).len(), 3);
    assert_eq!(together.len(), alone.len());
    for (i, (p, q)) in alone.iter().zip(&together).enumerate() {
        let noise = p
            .logits
            .iter()
            .zip(&q.logits)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(
            noise < 2.0,
            "position {i}: the batch moved a logit by {noise}"
        );
        let (top, second) = top_two(&p.logits);
        assert!(
            q.scan().top1 == top || p.logits[top] - p.logits[second] <= 2.0 * noise,
            "position {i}: batched and alone disagree on a top token {} ahead",
            p.logits[top] - p.logits[second]
        );
    }
}

/// The indices of the largest and the second largest logit.
fn top_two(logits: &[f32]) -> (usize, usize) {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&x, &y| logits[y].total_cmp(&logits[x]));
    (order[0], order[1])
}

/// A pool with a speed floor steps each batch width before its first stream, so admission
/// reads measured widths, and the probe leaves nothing behind: a stream then drafts exactly
/// what a pool without the probe drafts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probed_pool_measures_its_widths_and_drafts_as_before() {
    use approxy_verifier::{DraftConfig, DraftPool, DraftWorkers};
    const N: usize = 16;
    let probed = DraftPool::start(&DraftConfig {
        min_stream_speed: 0.5,
        ..common::batched_config(4)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    for width in [1, 2, 4] {
        assert!(
            probed.speed(0, width).is_some(),
            "{width} rows were not measured"
        );
    }
    let plain = DraftPool::start(&common::batched_config(4)).unwrap_or_else(|e| panic!("{e}"));
    assert!(plain.speed(0, 1).is_none(), "a pool with no floor probed");
    let prompt = common::chat_prompt("Write a Python function that sums a list.");
    let a = greedy(probed.try_lease().unwrap(), prompt.clone(), N).await;
    let b = greedy(plain.try_lease().unwrap(), prompt, N).await;
    let tokens = |s: &[(u32, f32, Vec<f32>)]| s.iter().map(|x| x.0).collect::<Vec<_>>();
    assert_eq!(tokens(&a), tokens(&b));
    assert_eq!(
        a.iter().map(|x| &x.2).collect::<Vec<_>>(),
        b.iter().map(|x| &x.2).collect::<Vec<_>>()
    );
}

/// Not a check but a measurement (`cargo test --release -p approxy-verifier --test
/// draft_runtime -- --ignored --nocapture layouts_of_a_batch`): what the batch's layouts cost
/// with four rows of 1,024 positions, parking one of them and taking it back, ten times each.
/// Prints each layout's milliseconds; the first ones write pages the process has not touched.
#[test]
#[ignore]
fn layouts_of_a_batch_are_timed() {
    use approxy_verifier::draft::rows::Member;
    const LEN: usize = 1024;
    let mut s = session();
    let prompt: Vec<u32> = (0..LEN as u32).map(|i| 100 + i % 5000).collect();
    for seq in 0..4 {
        s.rows_prefill(seq, &prompt, &|| false).unwrap();
    }
    let member = |seq: u64, row: Option<usize>| Member { seq, row, len: LEN };
    let capacity = approxy_verifier::draft::kv::batch_capacity(LEN + 1);
    let all: Vec<Member> = (0..4).map(|q| member(q, None)).collect();
    s.rows_arrange(&all, &[], capacity).unwrap();
    let (mut parks, mut backs) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        let three: Vec<Member> = (0..3).map(|q| member(q, Some(q as usize))).collect();
        let t = std::time::Instant::now();
        s.rows_arrange(&three, &[member(3, Some(3))], capacity)
            .unwrap();
        parks.push(t.elapsed().as_secs_f64() * 1e3);
        let mut four = three.clone();
        four.push(member(3, None));
        let t = std::time::Instant::now();
        s.rows_arrange(&four, &[], capacity).unwrap();
        backs.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let ms = |v: &[f64]| {
        v.iter()
            .map(|m| format!("{m:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("four rows of {LEN} positions, capacity {capacity}:");
    println!("  park one, lay out three (ms): {}", ms(&parks));
    println!("  lay out four, one back (ms): {}", ms(&backs));
}
