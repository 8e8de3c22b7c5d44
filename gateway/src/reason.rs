//! Why a request passed through to the target: the `x-approxy-passthrough-reason` header's
//! values and the metric's label, whichever check found it.

/// Why a request passed through; [`Reason::as_str`] is the `x-approxy-passthrough-reason`
/// header value and the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
        match self {
            Reason::Route => "route",
            Reason::ModelWithoutPolicy => "model_without_policy",
            Reason::PolicyPassthrough => "policy_passthrough",
            Reason::TargetCannotContinue => "target_cannot_continue",
            Reason::Tools => "tools",
            Reason::Logprobs => "logprobs",
            Reason::LogitBias => "logit_bias",
            Reason::ResponseFormat => "response_format",
            Reason::SchemaUnsupported => "schema_unsupported",
            Reason::Echo => "echo",
            Reason::Suffix => "suffix",
            Reason::BestOf => "best_of",
            Reason::Penalties => "penalties",
            Reason::NonTextMessages => "non_text_messages",
            Reason::MultiplePrompts => "multiple_prompts",
            Reason::TokenizerMismatch => "tokenizer_mismatch",
            Reason::DraftSaturated => "draft_saturated",
            Reason::PromptTooLong => "prompt_too_long",
            Reason::TokenizerCheckFailed => "tokenizer_check_failed",
            Reason::EngineFailed => "engine_failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_names_are_distinct_snake_case() {
        use Reason::*;
        let all = [
            Route,
            ModelWithoutPolicy,
            PolicyPassthrough,
            TargetCannotContinue,
            Tools,
            Logprobs,
            LogitBias,
            ResponseFormat,
            SchemaUnsupported,
            Echo,
            Suffix,
            BestOf,
            Penalties,
            NonTextMessages,
            MultiplePrompts,
            TokenizerMismatch,
            DraftSaturated,
            PromptTooLong,
            TokenizerCheckFailed,
            EngineFailed,
        ];
        let names: std::collections::BTreeSet<&str> = all.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), all.len());
        assert!(names.iter().all(|n| {
            n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        }));
    }
}
