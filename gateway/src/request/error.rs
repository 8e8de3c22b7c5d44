//! The request checks' one error type: why a request is refused with 400, naming the offending
//! field. The API error (`crate::error::ApiError`) turns it into the OpenAI shape.

use super::{Endpoint, THRESHOLD_HEADER};

/// Why a request is refused with 400.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    /// Not JSON at all.
    #[error("request body is not valid JSON: {0}")]
    NotJson(String),
    /// JSON, but not an object.
    #[error("request body must be a JSON object")]
    NotObject,
    /// A required field is absent.
    #[error("`{0}` is required")]
    Missing(String),
    /// A field has the wrong type or shape.
    #[error("`{param}` is invalid: {reason}")]
    Invalid {
        /// The field, e.g. `messages[0].content`.
        param: String,
        /// What serde found.
        reason: String,
    },
    /// A number outside its range.
    #[error("`{param}` must be in {range}")]
    OutOfRange {
        /// The field.
        param: &'static str,
        /// The allowed range.
        range: String,
    },
    /// `stop` with more than four strings.
    #[error("`stop` must be a string or up to 4 strings")]
    TooManyStops,
    /// A message role approxy does not know.
    #[error("unknown role {role:?}")]
    UnknownRole {
        /// Message index.
        index: usize,
        /// The role given.
        role: String,
    },
    /// The chat template refused the conversation.
    #[error("chat template: {0}")]
    Template(String),
    /// Nothing to continue.
    #[error("the prompt is empty")]
    EmptyPrompt(Endpoint),
    /// The prompt and the answer it may get do not fit the draft's context.
    #[error(
        "the prompt ({prompt} tokens) and max_tokens ({max_tokens}) exceed the draft's context of {context} tokens"
    )]
    ContextTooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Requested answer length.
        max_tokens: u32,
        /// The draft's context.
        context: usize,
    },
    /// The prompt does not fit the target's context, or with `max_tokens` more than it allows.
    #[error(
        "this model's context is {context} tokens; the prompt has {prompt} and max_tokens asks for {max_tokens} more"
    )]
    TargetContextExceeded {
        /// Prompt tokens.
        prompt: usize,
        /// Requested answer length.
        max_tokens: u32,
        /// The target's context.
        context: usize,
    },
    /// More prompt tokens than approxy tokenizes.
    #[error("the prompt has more than {max} tokens (at least {tokens})")]
    PromptTooLong {
        /// Endpoint (names the field).
        endpoint: Endpoint,
        /// Tokens in the prompt, at least (tokenizing stops past `max`).
        tokens: usize,
        /// The most the approximate path takes.
        max: usize,
    },
    /// The prompt has more tokens than the target's context holds, known without all of them
    /// counted (from its length, or tokenizing stopped past approxy's own limit).
    #[error(
        "the prompt has at least {at_least} tokens; this model's context is {context} tokens, prompt and answer together"
    )]
    CannotFit {
        /// Endpoint (names the field).
        endpoint: Endpoint,
        /// The fewest tokens the prompt can have.
        at_least: usize,
        /// The target's context.
        context: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token ids must be below {0}")]
    TokenOutOfVocabulary(usize),
    /// The threshold header is not a number.
    #[error("{THRESHOLD_HEADER} must be a number")]
    ThresholdNotANumber,
    /// The threshold header is outside what the model's policy allows.
    #[error(
        "{THRESHOLD_HEADER} {value} is outside the range [{lo}, {hi}] this model's policy allows"
    )]
    ThresholdOutOfRange {
        /// Asked for.
        value: f32,
        /// Policy minimum.
        lo: f32,
        /// Policy maximum.
        hi: f32,
    },
}

impl ValidationError {
    /// The field to name in the error's `param`.
    pub fn param(&self) -> Option<String> {
        match self {
            Self::NotJson(_) | Self::NotObject => None,
            Self::Missing(p) | Self::Invalid { param: p, .. } => Some(p.clone()),
            Self::OutOfRange { param, .. } => Some((*param).to_string()),
            Self::TooManyStops => Some("stop".into()),
            Self::UnknownRole { index, .. } => Some(format!("messages[{index}].role")),
            Self::Template(_) => Some("messages".into()),
            Self::EmptyPrompt(e)
            | Self::PromptTooLong { endpoint: e, .. }
            | Self::CannotFit { endpoint: e, .. } => Some(e.prompt_field().into()),
            Self::ContextTooLong { .. } => Some("max_tokens".into()),
            Self::TargetContextExceeded {
                prompt, context, ..
            } => Some(
                if prompt >= context {
                    "messages"
                } else {
                    "max_tokens"
                }
                .into(),
            ),
            Self::TokenOutOfVocabulary(_) => Some("prompt".into()),
            Self::ThresholdNotANumber | Self::ThresholdOutOfRange { .. } => {
                Some(THRESHOLD_HEADER.into())
            }
        }
    }

    /// From a typed-parse failure at `path` (serde reports a missing field at its parent).
    pub fn from_parse(path: String, reason: String) -> Self {
        let missing = reason
            .strip_prefix("missing field `")
            .and_then(|r| r.strip_suffix('`'));
        match missing {
            Some(field) if path == "." => Self::Missing(field.to_string()),
            Some(field) => Self::Missing(format!("{path}.{field}")),
            None => Self::Invalid {
                param: path,
                reason,
            },
        }
    }
}
