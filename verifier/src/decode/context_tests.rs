//! The answer's context as the decode loop keeps it equals the context training computes for
//! the same answer (`verify::features::along_answer`), position by position, in every way a
//! token can be emitted: accepted, corrected one token at a time, corrected by a span, and
//! accepted or corrected by a window the target scores.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::scripted_tests::{prompt, request};
use super::*;
use crate::testing::{DraftScript, ScriptedTarget, ScriptedWorkers, tiny_tokenizer};
use crate::verify::Features;
use crate::verify::features::along_answer;
use crate::{DraftWorkers, Verifier};

/// Scores like the confidence baseline, reads the context, and keeps every feature row it
/// was asked about.
#[derive(Debug, Default)]
struct Spy {
    seen: Mutex<Vec<Features>>,
}

impl Verifier for Spy {
    fn p_accept(&self, f: &Features) -> f32 {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(f.clone());
        f.top1_prob
    }
    fn kind(&self) -> &'static str {
        "spy"
    }
    fn reads_context(&self) -> bool {
        true
    }
}

async fn seen_and_replayed(
    correction: Correction,
    verification: Verification,
) -> Result<(Vec<Features>, Vec<Features>), EngineError> {
    let tok = tiny_tokenizer();
    // The draft is unsure but right at 1, and wrong and unsure at 7 and 11 ("X", "Y"); the
    // answer opens a code fence at 3.
    let mut draft = DraftScript::says("ab\n```cXe\nfYhij", 0.9);
    draft.confidence = vec![
        0.9, 0.4, 0.95, 0.9, 0.9, 0.9, 0.9, 0.3, 0.9, 0.9, 0.9, 0.2, 0.9, 0.9, 0.9, 0.1,
    ];
    let target = Arc::new(ScriptedTarget::says("ab\n```cde\nfghij", None).with_windows());
    let engine = Engine::new(tok.clone(), target, tok.end_of_sequence_ids());
    let workers = ScriptedWorkers::new(draft, 1);
    let spy = Spy::default();
    let mut req = request(0.5, 64);
    req.settings_mut().correction = correction;
    req.settings_mut().verification = verification;
    let (tx, mut rx) = mpsc::channel(1024);
    {
        let lease = workers.try_lease().ok_or(EngineError::Saturated)?;
        engine.generate(lease.as_ref(), &spy, req, tx).await?;
    }
    let mut answer = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        answer.extend(ev.id);
    }
    assert_eq!(tok.decode(&answer)?, "ab\n```cde\nfghij");
    // Training's replay: the draft teacher-forced over the same answer.
    let lease = workers.try_lease().ok_or(EngineError::Saturated)?;
    let mut outs = vec![lease.prefill(prompt()).await?];
    outs.extend(
        lease
            .extend(answer[..answer.len() - 1].to_vec(), true)
            .await?,
    );
    let replayed = along_answer(&outs, &answer, &tok)?;
    let seen = std::mem::take(
        &mut *spy
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    Ok((seen, replayed))
}

/// The answer position a feature row was computed at (its context says so).
fn position(f: &Features) -> usize {
    (f.context[0].exp() - 1.0).round() as usize
}

fn assert_same(seen: &[Features], replayed: &[Features]) {
    for f in seen {
        let p = position(f);
        let Some(r) = replayed.get(p) else {
            // The decision at the end-of-answer position has no answer token to replay.
            assert_eq!(p, replayed.len(), "a decision past the answer");
            continue;
        };
        assert_eq!(
            (f.top1, f.stats, f.context),
            (r.top1, r.stats, r.context),
            "position {p}"
        );
    }
}

#[tokio::test]
async fn the_loop_and_training_see_the_same_context_with_one_token_corrections()
-> Result<(), EngineError> {
    let (seen, replayed) =
        seen_and_replayed(Correction::Fixed { tokens: 1 }, Verification::Approximate).await?;
    // Every position is a decision.
    assert_eq!(seen.len(), replayed.len() + 1);
    assert_same(&seen, &replayed);
    // The context moved: inside the fence after "```", and the rejection at 6 shows at 7.
    let in_block = |p: usize| replayed[p].context[2];
    assert_eq!((in_block(3), in_block(7)), (0.0, 1.0));
    assert_eq!(replayed[8].context[3], 0.0, "disagreed at 7 (X)");
    assert!(
        replayed[8].context[7] < 0.0,
        "the emitted token was not the draft's"
    );
    Ok(())
}

#[tokio::test]
async fn the_loop_and_training_see_the_same_context_after_spans() -> Result<(), EngineError> {
    let (seen, replayed) = seen_and_replayed(
        Correction::Span {
            max_span: 8,
            resync: 2,
            end: SpanClose::Resync,
            ask: SpanAsk::All,
        },
        Verification::Approximate,
    )
    .await?;
    assert!(seen.len() > 4, "{} decisions", seen.len());
    assert_same(&seen, &replayed);
    Ok(())
}

#[tokio::test]
async fn the_loop_and_training_see_the_same_context_after_windows() -> Result<(), EngineError> {
    // The window's tokens and the target's own token after them are recorded from the draft's
    // outputs the window ran ahead: a decision after a window sees them as training does.
    let (seen, replayed) = seen_and_replayed(
        Correction::Fixed { tokens: 1 },
        Verification::ApproximateWindows,
    )
    .await?;
    assert!(seen.len() > 4, "{} decisions", seen.len());
    assert_same(&seen, &replayed);
    Ok(())
}
