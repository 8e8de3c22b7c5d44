//! The policy the benchmark serves: one model per configuration, with the base policy's
//! correction, bail-out and prices.

use std::path::Path;

use approxy_gateway::policy::raw::{
    RawBailout, RawCorrection, RawDraft, RawGateway, RawModel, RawPerKind, RawPolicy, RawPricing,
    RawTarget,
};
use approxy_gateway::policy::{ModelPolicy, Price, Pricing};
use approxy_verifier::{Correction, SpanAsk, SpanClose};

use crate::servers::Layout;

/// A correction as a policy file writes it.
pub(crate) fn raw_correction(c: Correction) -> RawCorrection {
    match c {
        Correction::Fixed { tokens } => RawCorrection {
            mode: "fixed".into(),
            tokens: Some(tokens),
            ..RawCorrection::default()
        },
        Correction::Span {
            max_span,
            resync,
            end,
            ask,
        } => RawCorrection {
            mode: "span".into(),
            max_span: Some(max_span),
            resync: Some(resync),
            end: Some(
                match end {
                    SpanClose::Expected => "expected",
                    SpanClose::Resync => "resync",
                }
                .into(),
            ),
            ask: Some(
                match ask {
                    SpanAsk::Fewest => "fewest",
                    SpanAsk::All => "all",
                }
                .into(),
            ),
            ..RawCorrection::default()
        },
    }
}

/// The correction in words, for the report.
pub fn correction_words(c: Correction) -> String {
    match c {
        Correction::Fixed { tokens: 1 } => "1 target token per rejection".into(),
        Correction::Fixed { tokens } => format!("{tokens} target tokens per rejection"),
        Correction::Span {
            max_span,
            resync,
            end,
            ask,
        } => {
            let mut words = format!(
                "a streamed span of up to {max_span} target tokens per rejection, ended once the draft predicts {resync} in a row"
            );
            if end == SpanClose::Expected {
                words += " if the cost guard would make the next call";
            }
            if ask == SpanAsk::Fewest {
                words += ", each call asking for the fewest tokens that could end it";
            }
            words
        }
    }
}

/// The benchmark bills tokens at a price list: the policy's, or DeepSeek's (the first hosted
/// class of `approxy bench calls`) for a policy priced by the target's time, whose time this
/// benchmark does not measure (`approxy bench calls` does).
pub(super) fn token_prices(p: &Pricing) -> Price {
    match p {
        Pricing::Tokens(t) => *t,
        Pricing::Busy(_) => {
            let d = &crate::prices::CLASSES[1];
            Price {
                input: d.input,
                cached_input: d.cached_input,
                output: d.output,
            }
        }
    }
}

pub(super) fn bench_policy(
    target_url: &str,
    layout: Layout,
    learned: &Path,
    base: &ModelPolicy,
) -> anyhow::Result<String> {
    let approx = |verifier: String| RawModel {
        mode: "approximate".into(),
        verifier: Some(verifier),
        threshold: Some(RawPerKind::All(0.7)),
        correction: Some(raw_correction(base.correction)),
        max_cost_ratio: Some(base.max_cost_ratio),
        threshold_override: Some([0.0, 1.0]),
        bailout: base.bailout.map(|b| RawBailout {
            window: b.window,
            max_rejection_rate: b.max_rejection_rate,
        }),
        price: Some(RawPricing::from(&base.price)),
        ..RawModel::default()
    };
    let policy = RawPolicy {
        passthrough: None,
        target: RawTarget {
            kind: "llama_cpp".into(),
            base_url: target_url.into(),
            // The shipped learned verifier's pair: the benchmark's target is that model.
            model: Some(approxy_verifier::verify::learned::DEFAULT_CALIBRATION_TARGET.into()),
            timeout: Some("300s".into()),
            retries: Some(2),
            backoff: Some("200ms".into()),
            ..RawTarget::default()
        },
        gateway: RawGateway {
            auth: Some("none".into()),
            max_concurrent_requests: Some(4),
            request_timeout: Some("900s".into()),
            ..RawGateway::default()
        },
        draft: RawDraft {
            workers: Some(1),
            threads_per_worker: Some(layout.draft_threads()),
            spin_wait: Some(false),
            ..RawDraft::default()
        },
        models: [
            (
                "bench-passthrough".to_string(),
                RawModel {
                    mode: "passthrough".into(),
                    ..RawModel::default()
                },
            ),
            (
                "bench-learned".to_string(),
                approx(learned.display().to_string()),
            ),
            ("bench-confidence".to_string(), approx("confidence".into())),
        ]
        .into_iter()
        .collect(),
    };
    Ok(format!(
        "# Written by `approxy bench quality`.\n{}",
        toml::to_string(&policy)?
    ))
}

#[cfg(test)]
mod tests {
    use approxy_gateway::policy::Policy;

    use super::*;

    #[test]
    fn the_bench_policy_is_a_valid_policy_with_the_base_settings() -> anyhow::Result<()> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
        let base = Policy::load(&root.join("default.toml"))?;
        let base_model = base
            .model("*")
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no \"*\" entry"))?;
        let learned = root.join("verifier/default.json");
        let text = bench_policy("http://127.0.0.1:9", Layout::Pinned, &learned, &base_model)?;
        let p = Policy::parse(&text, &root.join("bench.toml"))?;
        let m = p
            .model("bench-learned")
            .ok_or_else(|| anyhow::anyhow!("no bench-learned"))?;
        assert_eq!(
            (m.correction, m.bailout, m.price),
            (base_model.correction, base_model.bailout, base_model.price)
        );
        assert_eq!(m.max_cost_ratio, base_model.max_cost_ratio);
        assert_eq!(p.draft.threads_per_worker, Layout::Pinned.draft_threads());
        assert!(
            p.model("bench-passthrough")
                .is_some_and(|m| m.mode == approxy_gateway::policy::Mode::Passthrough)
        );
        Ok(())
    }
}
