//! The policy the benchmark serves: one model per configuration, from the base policy's
//! `"*"` model.

use approxy_gateway::policy::raw::{
    RawBailout, RawCorrection, RawDraft, RawGateway, RawModel, RawPolicy, RawPricing,
    RawStructuredThreshold, RawTarget,
};
use approxy_gateway::policy::{GuardPolicy, ModelPolicy};

use super::config::{CallConfig, LOOKUP_TOKENS};
use super::options::relaxed_rule;
use crate::servers::{self, Layout};

/// The base policy's correction, as a configuration runs it: what a span's calls ask for is
/// left to the target's kind on vLLM (the base was resolved for llama-server), and is one
/// streamed call in `default-streamed`.
fn correction(base: &ModelPolicy, c: CallConfig) -> RawCorrection {
    let mut raw = crate::quality::raw_correction(base.correction);
    match c {
        CallConfig::DefaultStreamed if raw.mode == "span" => raw.ask = Some("all".into()),
        _ if c.vllm() => raw.ask = None,
        _ => {}
    }
    raw
}

fn raw_model(base: &ModelPolicy, c: CallConfig) -> RawModel {
    if c.passthrough() {
        return RawModel {
            mode: "passthrough".into(),
            ..RawModel::default()
        };
    }
    RawModel {
        mode: "approximate".into(),
        verifier: Some("confidence".into()),
        threshold: Some(base.threshold.raw()),
        correction: Some(correction(base, c)),
        verification: match c {
            CallConfig::VllmExact | CallConfig::VllmExactOverlap => Some("exact".into()),
            CallConfig::VllmRelaxed => Some(format!("relaxed:{}", relaxed_rule())),
            _ => None,
        },
        // The guard is off except in the policy's own configurations: elsewhere the calls
        // themselves are what is measured.
        max_cost_ratio: Some(base.max_cost_ratio),
        guard: Some(
            match c {
                CallConfig::Default
                | CallConfig::DefaultLookup
                | CallConfig::DefaultStreamed
                | CallConfig::VllmDefault => base.guard.name(),
                CallConfig::Strict => "strict",
                _ => "off",
            }
            .into(),
        ),
        hard_cost_cap: match (c, base.guard) {
            (
                CallConfig::Default
                | CallConfig::DefaultLookup
                | CallConfig::DefaultStreamed
                | CallConfig::VllmDefault,
                GuardPolicy::Budget { hard_cap, .. },
            ) => Some(hard_cap),
            _ => None,
        },
        budget_window: match (c, base.guard) {
            (
                CallConfig::Default
                | CallConfig::DefaultLookup
                | CallConfig::DefaultStreamed
                | CallConfig::VllmDefault,
                GuardPolicy::Budget { window, .. },
            ) => Some(format!("{}ms", window.as_millis())),
            _ => None,
        },
        overlap: Some(matches!(
            c,
            CallConfig::SpanOverlap | CallConfig::VllmExactOverlap
        )),
        max_target_calls: base.max_target_calls,
        prompt_lookup: Some(if c == CallConfig::DefaultLookup {
            LOOKUP_TOKENS
        } else {
            base.prompt_lookup as u32
        }),
        bailout: base.bailout.map(|b| RawBailout {
            window: b.window,
            max_rejection_rate: b.max_rejection_rate,
        }),
        price: Some(RawPricing::from(&base.price)),
        structured_threshold: base.structured_threshold.map(|t| RawStructuredThreshold {
            value: t.value,
            text: t.text,
        }),
        json_layout: Some(base.json_layout.name().into()),
        json_fence: Some(base.json_fence.name().into()),
        ..RawModel::default()
    }
}

/// The model a configuration's requests name: its id on llama-server, vLLM's served name on
/// vLLM.
pub(crate) fn model_name(c: CallConfig) -> &'static str {
    if c.vllm() {
        servers::vllm_model().served_name()
    } else {
        c.id()
    }
}

pub(super) fn policy_text(
    target_url: &str,
    vllm: bool,
    layout: Layout,
    base: &ModelPolicy,
    configs: &[CallConfig],
) -> anyhow::Result<String> {
    let policy = raw_policy(target_url, vllm, layout, base, configs);
    Ok(format!(
        "# Written by `approxy bench calls`.\n{}",
        toml::to_string(&policy)?
    ))
}

/// The policy of a benchmark's gateway: `configs` as models in front of the target at
/// `target_url`, one draft worker with the layout's threads.
pub(crate) fn raw_policy(
    target_url: &str,
    vllm: bool,
    layout: Layout,
    base: &ModelPolicy,
    configs: &[CallConfig],
) -> RawPolicy {
    RawPolicy {
        passthrough: None,
        target: RawTarget {
            kind: if vllm { "vllm" } else { "llama_cpp" }.into(),
            base_url: if vllm {
                format!("{target_url}/v1")
            } else {
                target_url.into()
            },
            model: Some(if vllm {
                servers::vllm_model().served_name().into()
            } else {
                approxy_verifier::verify::learned::DEFAULT_CALIBRATION_TARGET.into()
            }),
            timeout: Some("600s".into()),
            retries: Some(2),
            backoff: Some("200ms".into()),
            ..RawTarget::default()
        },
        gateway: RawGateway {
            auth: Some("none".into()),
            max_concurrent_requests: Some(4),
            request_timeout: Some("1800s".into()),
            ..RawGateway::default()
        },
        draft: RawDraft {
            workers: Some(1),
            threads_per_worker: Some(layout.draft_threads()),
            spin_wait: Some(false),
            ..RawDraft::default()
        },
        models: configs
            .iter()
            .map(|&c| (model_name(c).to_string(), raw_model(base, c)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use approxy_gateway::policy::Policy;

    use super::super::config::ALL;
    use super::*;
    use approxy_verifier::{Correction, SpanAsk};

    #[test]
    fn the_calls_policy_is_valid_and_configures_each_run_as_named() -> anyhow::Result<()> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
        let base = Policy::load(&root.join("default.toml"))?;
        let m = base
            .model("*")
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no *"))?;
        // As the benchmark serves them: the llama.cpp ones together, each vLLM one alone.
        let llama: Vec<CallConfig> = ALL.into_iter().filter(|c| !c.vllm()).collect();
        let mut sets = vec![(false, llama)];
        sets.extend(
            ALL.into_iter()
                .filter(|c| c.vllm())
                .map(|c| (true, vec![c])),
        );
        for (vllm, group) in sets {
            let text = policy_text("http://127.0.0.1:9", vllm, Layout::Shared, &m, &group)?;
            let p = Policy::parse(&text, &root.join("calls.toml"))?;
            for c in group {
                let got = p
                    .model(model_name(c))
                    .ok_or_else(|| anyhow::anyhow!("{}", c.id()))?;
                if c.passthrough() {
                    assert_eq!(got.mode, approxy_gateway::policy::Mode::Passthrough);
                    continue;
                }
                assert_eq!(got.overlap, c.id().ends_with("overlap"), "{}", c.id());
                // The shipped policy's spans ask for the fewest tokens on llama-server; on
                // vLLM, and in `default-streamed`, one streamed call a span.
                let want = match m.correction {
                    Correction::Span {
                        max_span,
                        resync,
                        end,
                        ..
                    } if c == CallConfig::DefaultStreamed || c.vllm() => Correction::Span {
                        max_span,
                        resync,
                        end,
                        ask: SpanAsk::All,
                    },
                    other => other,
                };
                assert_eq!(got.correction, want, "{}", c.id());
                let guard = match c {
                    CallConfig::Default
                    | CallConfig::DefaultLookup
                    | CallConfig::DefaultStreamed
                    | CallConfig::VllmDefault => m.guard,
                    CallConfig::Strict => GuardPolicy::Strict,
                    _ => GuardPolicy::Off,
                };
                assert_eq!(
                    (got.guard, got.max_cost_ratio),
                    (guard, m.max_cost_ratio),
                    "{}",
                    c.id()
                );
                assert_eq!(
                    got.verification == approxy_verifier::Verification::Exact,
                    c.id().contains("exact")
                );
            }
        }
        Ok(())
    }
}
