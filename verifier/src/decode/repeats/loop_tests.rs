//! The decode loop over a scripted draft caught in a loop: the target is asked where the loop
//! began to repeat, and its end ends the answer.

use crate::EngineError;
use crate::decode::scripted_tests::{request, run, span};
use crate::decode::{Correction, FinishReason};
use crate::testing::{DraftScript, ScriptedTarget};

/// A confident draft that would repeat its list to `max_tokens`, and a target that stops after
/// saying it once. Before, the answer ran to `max_tokens`, every token the draft's.
#[tokio::test]
async fn a_confident_loop_is_put_to_the_target_which_ends_it() -> Result<(), EngineError> {
    let list = "rain, snow, hail, ";
    let looping = list.repeat(20);
    let said_once = "rain, snow, hail.";
    for correction in [Correction::Fixed { tokens: 1 }, span(8, 2)] {
        let mut req = request(0.5, 200);
        req.settings_mut().correction = correction;
        let o = run(
            DraftScript::says(&looping, 0.99),
            ScriptedTarget::says(said_once, None),
            req,
        )
        .await?;
        assert!(o.stats.loop_checks >= 1, "{correction:?}");
        assert_eq!(
            o.stats.finish_reason,
            Some(FinishReason::Stop),
            "{correction:?}: {:?}",
            o.text
        );
        assert!(
            o.text.len() < 3 * list.len() + said_once.len(),
            "{correction:?}: {:?}",
            o.text
        );
    }
    // A draft that does not loop is never put to the target.
    let o = run(
        DraftScript::says("rain, snow and hail fell all day.", 0.99),
        ScriptedTarget::says("unused", None),
        request(0.5, 200),
    )
    .await?;
    assert_eq!((o.stats.loop_checks, o.stats.target_calls), (0, 0));
    Ok(())
}
