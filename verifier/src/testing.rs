//! Scripted parts for tests that run without models: a byte-level tokenizer built in memory,
//! a draft that says a fixed answer with set confidences, and a target that writes another
//! fixed answer and records its calls. Both answers start after the last `<|im_start|>` in
//! the sequence, so a test's prompt is any text ending in that token.

mod draft;
mod target;
mod tokens;

pub use draft::{DraftScript, ScriptedWorkers};
pub use target::{ScriptedTarget, TargetFault};
pub use tokens::{
    CONTEXT, END_OF_TEXT, HIDDEN, IM_END, IM_START, VOCAB, merging_tokenizer, tiny_tokenizer,
    tiny_tokenizer_spec,
};

/// Cases a property test runs: `default` (the budget of every test run), or `PROPTEST_CASES`
/// for a long run.
pub fn property_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// What the tests below (`use super::*`) read beside the scripted parts.
#[cfg(test)]
use crate::error::EngineError;
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_tokenizer_round_trips_bytes_and_specials() -> Result<(), EngineError> {
        let t = tiny_tokenizer();
        let ids = t.encode("<|im_start|>héllo")?;
        assert_eq!(ids[0], IM_START);
        assert_eq!(ids[1], u32::from(b'h'));
        assert_eq!(ids.len(), 1 + "héllo".len());
        assert_eq!(t.decode(&ids)?, "héllo");
        assert_eq!(t.end_of_sequence_ids(), vec![IM_END, END_OF_TEXT]);
        Ok(())
    }

    #[test]
    fn scripted_draft_has_the_confidence_it_is_given() {
        let s = DraftScript::says("ab", 0.9);
        let out = s.output(&[1, 2, IM_START, u32::from(b'a')]);
        let f = crate::verify::Features::from_output(&out);
        assert_eq!(f.top1, u32::from(b'b'));
        assert!((f.top1_prob - 0.9).abs() < 1e-4, "{}", f.top1_prob);
        assert_eq!(
            crate::verify::Features::from_output(&s.output(&[IM_START, 1, 2])).top1,
            IM_END
        );
    }
}
