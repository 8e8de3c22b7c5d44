//! The configurations the benchmark compares, and what each one sets.

use serde::{Deserialize, Serialize};

/// The most tokens prompt lookup proposes in the `default-lookup` configuration.
pub const LOOKUP_TOKENS: u32 = 8;

/// One configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CallConfig {
    /// Passthrough to llama-server.
    TargetOnly,
    /// The shipped policy.
    Default,
    /// The shipped policy with prompt lookup proposing up to [`LOOKUP_TOKENS`] tokens.
    DefaultLookup,
    /// The shipped policy with each span asked for in one streamed call, closed where the
    /// span ends (`correction.ask = "all"`, the earlier default on llama-server, kept to compare
    /// with: see tests/README.md, "What a span's calls ask for").
    DefaultStreamed,
    /// The shipped policy with the strict guard (the earlier default, kept to compare with).
    Strict,
    /// Spans, no cost guard.
    Span,
    /// Spans, no cost guard, overlap on.
    SpanOverlap,
    /// Passthrough to vLLM.
    VllmTargetOnly,
    /// Exact windows on vLLM.
    VllmExact,
    /// Exact windows on vLLM, overlap on.
    VllmExactOverlap,
    /// Every token through windows on vLLM, a draft token kept where the relaxed rule
    /// (`--relaxed-rule`) accepts it on the target's probabilities; no cost guard.
    VllmRelaxed,
    /// The default verification on vLLM (windows scored where the verifier rejects), no cost
    /// guard.
    VllmApproximate,
    /// The shipped policy on vLLM (windows where the verifier rejects, the budget guard).
    VllmDefault,
}

/// Every configuration, in report order.
pub const ALL: [CallConfig; 13] = [
    CallConfig::TargetOnly,
    CallConfig::Default,
    CallConfig::DefaultLookup,
    CallConfig::DefaultStreamed,
    CallConfig::Strict,
    CallConfig::Span,
    CallConfig::SpanOverlap,
    CallConfig::VllmTargetOnly,
    CallConfig::VllmExact,
    CallConfig::VllmExactOverlap,
    CallConfig::VllmRelaxed,
    CallConfig::VllmApproximate,
    CallConfig::VllmDefault,
];

impl CallConfig {
    /// Its id (`--only`, file names).
    pub fn id(self) -> &'static str {
        match self {
            Self::TargetOnly => "target-only",
            Self::Default => "default",
            Self::DefaultLookup => "default-lookup",
            Self::DefaultStreamed => "default-streamed",
            Self::Strict => "strict",
            Self::Span => "span",
            Self::SpanOverlap => "span-overlap",
            Self::VllmTargetOnly => "vllm-target-only",
            Self::VllmExact => "vllm-exact",
            Self::VllmExactOverlap => "vllm-exact-overlap",
            Self::VllmRelaxed => "vllm-relaxed",
            Self::VllmApproximate => "vllm-approximate",
            Self::VllmDefault => "vllm-default",
        }
    }

    pub(super) fn vllm(self) -> bool {
        matches!(
            self,
            Self::VllmTargetOnly
                | Self::VllmExact
                | Self::VllmExactOverlap
                | Self::VllmRelaxed
                | Self::VllmApproximate
                | Self::VllmDefault
        )
    }

    pub(super) fn passthrough(self) -> bool {
        matches!(self, Self::TargetOnly | Self::VllmTargetOnly)
    }

    /// The target-only run it is compared with.
    pub(super) fn baseline(self) -> Self {
        if self.vllm() {
            Self::VllmTargetOnly
        } else {
            Self::TargetOnly
        }
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Self::TargetOnly => "target only (passthrough)",
            Self::Default => "default policy (spans, budget guard)",
            Self::DefaultLookup => "default policy with prompt lookup (8 tokens)",
            Self::DefaultStreamed => "default policy, one streamed call a span",
            Self::Strict => "default policy, strict guard",
            Self::Span => "spans, no cost guard",
            Self::SpanOverlap => "spans, no cost guard, overlap",
            Self::VllmTargetOnly => "vLLM target only (passthrough)",
            Self::VllmExact => "vLLM exact windows",
            Self::VllmExactOverlap => "vLLM exact windows, overlap",
            Self::VllmRelaxed => {
                "vLLM relaxed windows (--relaxed-rule on the target's probabilities)"
            }
            Self::VllmApproximate => {
                "vLLM approximate (windows where the verifier rejects), no cost guard"
            }
            Self::VllmDefault => {
                "vLLM, default policy (windows where the verifier rejects, budget guard)"
            }
        }
    }
}
