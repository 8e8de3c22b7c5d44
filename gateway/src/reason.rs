//! Why a request passed through to the target: the `x-approxy-passthrough-reason` header's
//! values and the metric's label, whichever check found it.

/// Why a request passed through; [`Reason::as_str`] is the `x-approxy-passthrough-reason`
/// header value and the metric label. The names come from the variants, so that a new reason
/// is named once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumIter)]
#[strum(serialize_all = "snake_case")]
pub enum Reason {
    /// Not a chat or completion request.
    Route,
    /// No policy entry for the model (and no `"*"`).
    ModelWithoutPolicy,
    /// The model's policy says `passthrough`.
    PolicyPassthrough,
    /// The target cannot continue a partial answer (a chat-only API).
    TargetCannotContinue,
    /// Tools approxy does not answer (legacy functions, custom tools, an unmet choice, tools
    /// with a `response_format`, tool traffic to a target that renders its own prompt).
    Tools,
    /// Log-probabilities asked for.
    Logprobs,
    /// `logit_bias`.
    LogitBias,
    /// A `response_format` type approxy does not constrain to (neither text, JSON mode nor a
    /// JSON Schema), or one under a policy whose target scores every token.
    ResponseFormat,
    /// A JSON Schema the grammar engine cannot compile, or not within its size and time limits.
    SchemaUnsupported,
    /// `echo`.
    Echo,
    /// `suffix` (fill in the middle).
    Suffix,
    /// `best_of`.
    BestOf,
    /// Presence or frequency penalties.
    Penalties,
    /// Non-text content parts, or a legacy function message.
    NonTextMessages,
    /// Several prompts in one completion request.
    MultiplePrompts,
    /// Draft and target tokenize differently.
    TokenizerMismatch,
    /// Every draft worker is busy.
    DraftSaturated,
    /// The prompt is longer than the draft takes.
    PromptTooLong,
    /// The draft/target tokenizer comparison could not be made (the target did not answer it).
    TokenizerCheckFailed,
    /// approxy's engine failed before the first token.
    EngineFailed,
}

impl Reason {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strum::IntoEnumIterator;

    /// Clients and dashboards match on these values: a renamed variant must not rename its
    /// header value or metric label unnoticed.
    #[test]
    fn every_reason_keeps_its_name() {
        use Reason::*;
        let names = [
            (Route, "route"),
            (ModelWithoutPolicy, "model_without_policy"),
            (PolicyPassthrough, "policy_passthrough"),
            (TargetCannotContinue, "target_cannot_continue"),
            (Tools, "tools"),
            (Logprobs, "logprobs"),
            (LogitBias, "logit_bias"),
            (ResponseFormat, "response_format"),
            (SchemaUnsupported, "schema_unsupported"),
            (Echo, "echo"),
            (Suffix, "suffix"),
            (BestOf, "best_of"),
            (Penalties, "penalties"),
            (NonTextMessages, "non_text_messages"),
            (MultiplePrompts, "multiple_prompts"),
            (TokenizerMismatch, "tokenizer_mismatch"),
            (DraftSaturated, "draft_saturated"),
            (PromptTooLong, "prompt_too_long"),
            (TokenizerCheckFailed, "tokenizer_check_failed"),
            (EngineFailed, "engine_failed"),
        ];
        let all: Vec<Reason> = Reason::iter().collect();
        assert_eq!(
            all,
            names.map(|(r, _)| r),
            "every variant, once, in declaration order"
        );
        for (r, name) in names {
            assert_eq!(r.as_str(), name, "{r:?}");
        }
    }

    #[test]
    fn reason_names_are_distinct_snake_case() {
        let names: std::collections::BTreeSet<&str> = Reason::iter().map(Reason::as_str).collect();
        assert_eq!(names.len(), Reason::iter().count());
        assert!(names.iter().all(|n| {
            n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        }));
    }
}
