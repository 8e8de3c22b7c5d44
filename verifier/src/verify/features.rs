//! Features of the draft at one position, for one candidate token. This one function is used
//! by serving and by training, so the two cannot drift apart.

use serde::{Deserialize, Serialize};

use super::context::{Context, N_CONTEXT, Record};
use super::syntax::N_SYNTAX;
use crate::draft::PositionOutput;
use crate::error::EngineError;
use crate::logits::LogitScan;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Names of the logit statistics, in the order [`Features::stats`] holds them.
pub const STAT_NAMES: [&str; 4] = ["top1_prob", "margin", "entropy", "top1_logit"];

/// Features at one position, of the token that is to be emitted there (the scored token).
///
/// The statistics keep their names from greedy decoding, where the scored token is always the
/// draft's top-1: a learned verifier's artifact names them so. At temperature > 0 the sampled
/// token can be another one, and then they describe that token, not the top-1.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Features {
    /// Draft's most likely token.
    pub top1: u32,
    /// The token scored (the top-1 unless a sampler drew another).
    pub token: u32,
    /// Softmax probability of `token` (temperature 1).
    pub top1_prob: f32,
    /// Logit statistics in [`STAT_NAMES`] order, of `token`: its probability, its probability
    /// minus the best other token's (negative when it is not the top-1), the entropy (nats)
    /// and its raw logit.
    pub stats: [f32; 4],
    /// The hidden-state row.
    pub hidden: std::sync::Arc<[f32]>,
    /// The answer's context at this position, in
    /// [`CONTEXT_NAMES`](super::context::CONTEXT_NAMES) order (zero until
    /// [`Features::with_context`] fills it in).
    #[serde(default)]
    pub context: [f32; N_CONTEXT],
    /// Where in code the token falls, in [`SYNTAX_NAMES`](super::syntax::SYNTAX_NAMES) order
    /// (zero until [`Features::with_context`] fills it in).
    #[serde(default)]
    pub syntax: [f32; N_SYNTAX],
}

impl Features {
    /// The features of the draft's own top-1 token (greedy decoding; training's labels).
    pub fn from_output(out: &PositionOutput) -> Self {
        Self::of_token(out, None)
    }

    /// The features of `token` at this position (`None`: the top-1), so that the verifier
    /// judges the token that would be emitted, also when a sampler drew another than the top-1.
    pub fn of_token(out: &PositionOutput, token: Option<u32>) -> Self {
        let l = &out.logits;
        let &LogitScan {
            top1: i1,
            max: v1,
            second: v2,
            z,
            entropy,
        } = out.scan();
        let p1 = (1.0 / z) as f32;
        let p2 = (f64::from(v2 - v1).exp() / z) as f32;
        let top1 = i1 as u32;
        let (token, p, margin, logit) = match token.and_then(|t| Some((t, *l.get(t as usize)?))) {
            Some((t, x)) if t != top1 => {
                let p = (f64::from(x - v1).exp() / z) as f32;
                // The best other token is the top-1.
                (t, p, p - p1, x)
            }
            _ => (top1, p1, p1 - p2, v1),
        };
        Self {
            top1,
            token,
            top1_prob: p,
            stats: [p, margin, entropy, logit],
            hidden: out.hidden.clone(),
            context: [0.0; N_CONTEXT],
            syntax: [0.0; N_SYNTAX],
        }
    }

    /// These features with the context of the answer they would extend.
    pub fn with_context(mut self, ctx: &Context) -> Self {
        self.context = ctx.values(self.stats[2]);
        self.syntax = ctx.syntax_values();
        self
    }

    /// The draft's entropy at this position (nats).
    pub fn entropy(&self) -> f32 {
        self.stats[2]
    }
}

/// The features at every position of `answer`, each in the context of the answer before it,
/// given the draft's output before each answer token (teacher forcing, or a recorded live
/// answer): what the decode loop computes when it emits `answer`, position by position.
pub fn along_answer(
    outs: &[PositionOutput],
    answer: &[u32],
    tokenizer: &Tokenizer,
) -> Result<Vec<Features>, EngineError> {
    let mut ctx = Context::new();
    let mut decoder = StreamDecoder::new(tokenizer.clone());
    let mut all = Vec::with_capacity(outs.len());
    for (out, &token) in outs.iter().zip(answer) {
        let f = Features::from_output(out).with_context(&ctx);
        ctx.push(
            Some(Record::new(out, token, Some(f.entropy()))),
            &decoder.push(token)?,
        );
        all.push(f);
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_known_distribution() {
        // logits ln(0.5), ln(0.3), ln(0.2): probs 0.5/0.3/0.2.
        let out = PositionOutput::new(
            vec![0.3f32.ln(), 0.5f32.ln(), 0.2f32.ln()],
            vec![1.0, 2.0].into(),
        );
        let f = Features::from_output(&out);
        assert_eq!(f.top1, 1);
        assert!((f.top1_prob - 0.5).abs() < 1e-5);
        assert!((f.stats[1] - 0.2).abs() < 1e-5);
        let h = -(0.5f32 * 0.5f32.ln() + 0.3 * 0.3f32.ln() + 0.2 * 0.2f32.ln());
        assert!((f.stats[2] - h).abs() < 1e-4);
        assert_eq!(*f.hidden, [1.0, 2.0]);
    }

    #[test]
    fn a_sampled_token_other_than_the_top1_is_scored_as_itself() {
        let out = PositionOutput::new(vec![0.3f32.ln(), 0.5f32.ln(), 0.2f32.ln()], vec![].into());
        let f = Features::of_token(&out, Some(2));
        assert_eq!((f.top1, f.token), (1, 2));
        assert!((f.top1_prob - 0.2).abs() < 1e-5);
        assert!(
            (f.stats[1] + 0.3).abs() < 1e-5,
            "margin below the top-1: {}",
            f.stats[1]
        );
        assert!((f.stats[3] - 0.2f32.ln()).abs() < 1e-5);
        // The top-1 itself, and an id outside the vocabulary, are the greedy features.
        let top = Features::from_output(&out);
        for t in [Some(1), Some(99), None] {
            assert_eq!(Features::of_token(&out, t).stats, top.stats);
        }
    }
}
