//! The engine: draft model, tokenizer and target, and `generate`, which runs one generation
//! through the stages in [`super::run`].

use std::sync::Arc;

use crate::error::EngineError;
use crate::targets::TargetClient;
use crate::tokenizer::Tokenizer;

/// Draft model, tokenizer and target: everything a generation needs but the verifier.
#[derive(Debug, Clone)]
pub struct Engine {
    pub(super) tokenizer: Tokenizer,
    pub(super) target: Arc<dyn TargetClient>,
    pub(super) eos: Vec<u32>,
}

/// Log-probability margin (nats) below which the target's preference over the draft's token
/// counts as a numerical tie.
pub const TIE_MARGIN: f32 = 0.01;

/// Fixed text that exercises specials, code, whitespace runs and multi-byte characters.
const PROBE: &str = "<|im_start|>user\nfn main() {\n    println!(\"héllo, 世界 🚀\");\n}\t  x = 3.14e-2<|im_end|>\n";

impl Engine {
    /// An engine; `eos` lists the ids that end a generation.
    pub fn new(tokenizer: Tokenizer, target: Arc<dyn TargetClient>, eos: Vec<u32>) -> Self {
        Self {
            tokenizer,
            target,
            eos,
        }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The target.
    pub fn target(&self) -> &Arc<dyn TargetClient> {
        &self.target
    }

    /// Refuses approximate mode when draft and target tokenize a probe text differently.
    /// Returns `Ok(false)` when the target has no tokenize endpoint to compare with.
    pub async fn check_tokenizer(&self) -> Result<bool, EngineError> {
        let ours = self.tokenizer.encode(PROBE)?;
        match self.target.tokenize(PROBE).await? {
            None => Ok(false),
            Some(theirs) if theirs == ours => Ok(true),
            Some(theirs) => Err(EngineError::TokenizerMismatch(format!(
                "probe text gives {} draft tokens and {} target tokens (first difference at {})",
                ours.len(),
                theirs.len(),
                ours.iter().zip(&theirs).take_while(|(a, b)| a == b).count()
            ))),
        }
    }
}
