//! Sampled decoding (temperature > 0): the verifier judges the token that is drawn, and exact
//! windows follow speculative sampling's acceptance rule, so that what is emitted is
//! distributed as the target's own sampling. A toy draft and target over three tokens, whose
//! distributions are known, make the distribution checkable in a fraction of a second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rand::{SeedableRng, rngs::StdRng};
use tokio::sync::mpsc;

use super::scripted_tests::request;
use super::*;
use crate::draft::PositionOutput;
use crate::error::TargetError;
use crate::targets::{Continuation, ContinuationRequest, WindowRequest, WindowScore};
use crate::testing::{
    DraftScript, HIDDEN, IM_START, ScriptedTarget, ScriptedWorkers, VOCAB, tiny_tokenizer,
};
use crate::verify::ConfidenceVerifier;
use crate::{DraftWorkers, SamplingParams};

const A: u32 = b'a' as u32;
const B: u32 = b'b' as u32;
const C: u32 = b'c' as u32;

/// The scripted tests' request, at temperature 1 with a seed.
fn sampled_request(
    verification: Verification,
    threshold: f32,
    max_tokens: u32,
    seed: u64,
) -> GenerateRequest {
    let mut req = GenerateRequest {
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            seed: Some(seed),
        },
        ..request(threshold, max_tokens)
    };
    req.settings_mut().verification = verification;
    req
}

async fn generate(
    engine: &Engine,
    draft: &dyn Draft,
    req: GenerateRequest,
) -> Result<(Vec<u32>, Stats), EngineError> {
    let (tx, mut rx) = mpsc::channel(1024);
    let stats = engine.generate(draft, &ConfidenceVerifier, req, tx).await?;
    let mut ids = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        ids.extend(ev.id);
    }
    Ok((ids, stats))
}

#[tokio::test]
async fn at_temperature_one_a_drawn_token_other_than_the_top1_is_judged_as_itself()
-> Result<(), EngineError> {
    // The draft's top-1 is right and has probability 0.6, above the threshold; the other 0.4 is
    // spread thinly over every other token. Judged by the top-1's confidence, a drawn other
    // token would be accepted and emitted; judged as itself, it is rejected and corrected.
    let tok = tiny_tokenizer();
    let target = Arc::new(ScriptedTarget::says("aaaaaaaa", None));
    let engine = Engine::new(tok.clone(), target.clone(), tok.end_of_sequence_ids());
    let workers = ScriptedWorkers::new(DraftScript::says("aaaaaaaa", 0.6), 1);
    let mut rejections = 0;
    for seed in 0..20 {
        let lease = workers.try_lease().ok_or(EngineError::Saturated)?;
        let (ids, stats) = generate(
            &engine,
            lease.as_ref(),
            sampled_request(Verification::Approximate, 0.5, 8, seed),
        )
        .await?;
        assert_eq!(
            ids,
            vec![A; 8],
            "seed {seed}: only the judged token may be emitted"
        );
        assert_eq!(
            stats.verifier_rejections, stats.target_tokens,
            "seed {seed}"
        );
        rejections += stats.verifier_rejections;
    }
    // 40 % of 160 draws are another token.
    assert!((30..=100).contains(&rejections), "{rejections} rejections");
    Ok(())
}

/// Probabilities of a, b and c after `prev`: the target's, and a draft's that differs from it.
fn toy(prev: u32, target: bool) -> [f32; 3] {
    match (prev, target) {
        (A, true) => [0.6, 0.3, 0.1],
        (B, true) => [0.2, 0.5, 0.3],
        (_, true) => [0.3, 0.3, 0.4],
        (A, false) => [0.3, 0.5, 0.2],
        (B, false) => [0.6, 0.2, 0.2],
        (_, false) => [0.1, 0.1, 0.8],
    }
}

fn toy_entries(prev: u32, target: bool) -> Vec<(u32, f32)> {
    [A, B, C]
        .into_iter()
        .zip(toy(prev, target))
        .map(|(t, p)| (t, p.ln()))
        .collect()
}

/// A draft whose distribution is `toy(prev, false)`.
#[derive(Default)]
struct ToyDraft {
    seq: Mutex<Vec<u32>>,
}

impl ToyDraft {
    fn output(seq: &[u32]) -> PositionOutput {
        let mut logits = vec![-1e4f32; VOCAB];
        for (t, lp) in toy_entries(seq.last().copied().unwrap_or(IM_START), false) {
            logits[t as usize] = lp;
        }
        PositionOutput::new(logits, vec![0.0; HIDDEN].into())
    }
}

#[async_trait]
impl Draft for ToyDraft {
    async fn prefill(&self, prompt: Vec<u32>) -> Result<PositionOutput, EngineError> {
        let mut seq = self
            .seq
            .lock()
            .map_err(|_| EngineError::Draft("poisoned".into()))?;
        *seq = prompt;
        Ok(Self::output(&seq))
    }

    async fn extend(
        &self,
        tokens: Vec<u32>,
        all: bool,
    ) -> Result<Vec<PositionOutput>, EngineError> {
        let mut seq = self
            .seq
            .lock()
            .map_err(|_| EngineError::Draft("poisoned".into()))?;
        let mut outs = Vec::new();
        for t in tokens {
            seq.push(t);
            if all {
                outs.push(Self::output(&seq));
            }
        }
        if !all {
            outs.push(Self::output(&seq));
        }
        Ok(outs)
    }

    async fn rollback(&self, n: usize) -> Result<(), EngineError> {
        let mut seq = self
            .seq
            .lock()
            .map_err(|_| EngineError::Draft("poisoned".into()))?;
        let keep = seq.len().saturating_sub(n);
        seq.truncate(keep);
        Ok(())
    }
}

/// A target that samples from `toy(prev, true)` and scores windows the way vLLM does with
/// `prompt_logprobs`: its log-probabilities at each window position, and its own sample after
/// the window.
#[derive(Debug)]
struct ToyTarget {
    rng: Mutex<StdRng>,
}

#[async_trait]
impl TargetClient for ToyTarget {
    async fn continue_tokens(
        &self,
        _req: &ContinuationRequest,
    ) -> Result<Continuation, TargetError> {
        Err(TargetError::Protocol(
            "exact mode asks for windows only".into(),
        ))
    }

    async fn score_window(&self, req: &WindowRequest) -> Result<Option<WindowScore>, TargetError> {
        let seq: Vec<u32> = [req.prefix.as_slice(), req.window.as_slice()].concat();
        let after = |i: usize| seq[req.prefix.len() + i - 1];
        let logprobs: Vec<Vec<(u32, f32)>> = (0..req.window.len())
            .map(|i| toy_entries(after(i), true))
            .collect();
        let mut top: Vec<u32> = logprobs
            .iter()
            .map(|e| {
                e.iter()
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                    .map_or(A, |x| x.0)
            })
            .collect();
        let last = toy_entries(after(req.window.len()), true);
        let mut sampler_rng = self
            .rng
            .lock()
            .map_err(|_| TargetError::Protocol("poisoned".into()))?;
        let u: f32 = rand::Rng::random(&mut *sampler_rng);
        let mut r = u;
        let mut next = C;
        for (t, lp) in last {
            if r < lp.exp() {
                next = t;
                break;
            }
            r -= lp.exp();
        }
        top.push(next);
        Ok(Some(WindowScore {
            margins: vec![None; req.window.len()],
            top,
            logprobs,
            ..WindowScore::default()
        }))
    }

    async fn tokenize(&self, _text: &str) -> Result<Option<Vec<u32>>, TargetError> {
        Ok(None)
    }

    async fn health(&self) -> Result<(), TargetError> {
        Ok(())
    }
}

/// Half the L1 distance between two distributions over the same outcomes.
fn total_variation(a: &HashMap<Vec<u32>, f64>, b: &HashMap<Vec<u32>, f64>) -> f64 {
    let keys: std::collections::HashSet<&Vec<u32>> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .map(|k| (a.get(k).unwrap_or(&0.0) - b.get(k).unwrap_or(&0.0)).abs())
        .sum::<f64>()
        / 2.0
}

/// The probability of every three-token answer when each token is drawn from `toy(prev, target)`.
fn exact_answers(target: bool) -> HashMap<Vec<u32>, f64> {
    let mut out = HashMap::new();
    for (x, px) in [A, B, C].into_iter().zip(toy(IM_START, target)) {
        for (y, py) in [A, B, C].into_iter().zip(toy(x, target)) {
            for (z, pz) in [A, B, C].into_iter().zip(toy(y, target)) {
                out.insert(vec![x, y, z], f64::from(px * py * pz));
            }
        }
    }
    out
}

/// Exact mode at temperature 1 over 5,000 fixed seeds: the three-token answers are distributed
/// as the target's own sampling gives them, within a total variation of 0.06. Sampling noise
/// alone, for 5,000 draws from the target's distribution, has a mean of 0.027 and stayed below
/// 0.042 in 200 simulated runs; at 200,000 seeds this test measured 0.0036, so the rule has no
/// bias of that size. The draft's own distribution is 0.55 away, and drawing the token after
/// a rejection from the target's distribution instead of the residual gives 0.21: both fail.
#[tokio::test]
async fn exact_sampling_gives_the_targets_distribution() -> Result<(), EngineError> {
    const RUNS: u64 = 5_000;
    let tok = tiny_tokenizer();
    let target = Arc::new(ToyTarget {
        rng: Mutex::new(StdRng::seed_from_u64(1)),
    });
    let engine = Engine::new(tok.clone(), target, tok.end_of_sequence_ids());
    let draft = ToyDraft::default();
    let mut counts: HashMap<Vec<u32>, f64> = HashMap::new();
    let (mut draft_tokens, mut windows) = (0u64, 0u64);
    for seed in 0..RUNS {
        let (ids, stats) = generate(
            &engine,
            &draft,
            sampled_request(Verification::Exact, 0.5, 3, seed),
        )
        .await?;
        assert_eq!(ids.len(), 3, "seed {seed}: {ids:?}");
        *counts.entry(ids).or_default() += 1.0 / RUNS as f64;
        draft_tokens += u64::from(stats.draft_tokens);
        windows += u64::from(stats.windows);
    }
    let target_tv = total_variation(&counts, &exact_answers(true));
    let draft_tv = total_variation(&exact_answers(false), &exact_answers(true));
    assert!(
        draft_tv > 0.3,
        "the test's draft must differ from its target: {draft_tv}"
    );
    assert!(
        target_tv < 0.06,
        "total variation from the target's distribution: {target_tv}"
    );
    // The draft wrote a good part of it, in few calls.
    assert!(
        draft_tokens > RUNS,
        "draft tokens: {draft_tokens} of {}",
        3 * RUNS
    );
    assert!(windows < 2 * RUNS, "windows: {windows}");
    Ok(())
}

#[tokio::test]
async fn each_window_call_gets_its_own_seed_within_the_apis_integer() -> Result<(), EngineError> {
    let tok = tiny_tokenizer();
    let target = Arc::new(ScriptedTarget::says("abcdefgh", None).with_windows());
    let engine = Engine::new(tok.clone(), target.clone(), tok.end_of_sequence_ids());
    let workers = ScriptedWorkers::new(DraftScript::says("abcXefgY", 0.9), 1);
    let lease = workers.try_lease().ok_or(EngineError::Saturated)?;
    let (ids, _) = generate(
        &engine,
        lease.as_ref(),
        sampled_request(Verification::Exact, 0.5, 8, 5),
    )
    .await?;
    assert_eq!(ids, "abcdefgh".bytes().map(u32::from).collect::<Vec<_>>());
    let seeds: Vec<u64> = target
        .window_calls()
        .iter()
        .filter_map(|w| w.sampling.and_then(|s| s.seed))
        .collect();
    assert!(seeds.len() >= 2, "{seeds:?}");
    // vLLM refuses a seed above i64::MAX with a 400.
    assert!(seeds.iter().all(|&s| s <= i64::MAX as u64), "{seeds:?}");
    let distinct: std::collections::HashSet<_> = seeds.iter().collect();
    assert_eq!(distinct.len(), seeds.len(), "{seeds:?}");
    Ok(())
}
