//! Target clients: the remote model that is called only when the verifier rejects.
//!
//! - `api`: the one trait every client implements and the requests and answers it trades in;
//! - `kind`: the kinds a policy names and what each can do (the table the rest asks);
//! - `counters`: a target's own account of its work, read from its `/metrics`;
//! - `transport`: the HTTP every client shares (TLS, retries, the classification of a failed
//!   send, JSON and server-sent events), which passthrough uses too; `retry` its schedule and
//!   `trace` the trace context it forwards;
//! - one file per client: token-level clients (llama.cpp's `/completion`, OpenAI-style
//!   `/v1/completions` with a token-id prompt as vLLM serves, SGLang's `/generate`) and
//!   text-level ones (`/v1/completions` with a text prompt, chat completions that continue a
//!   partial assistant message, both over `text`), which need no tokenizer in common with the
//!   draft. `token_in` is vLLM's token-in endpoint, where the `vllm` kind scores windows from
//!   the server's prefix cache.
//!
//! One shared test suite in `tests/` holds every client to the same contract.

pub mod api;
pub mod chat_only;
pub mod chat_prefix;
pub mod counters;
pub mod kind;
pub mod llamacpp;
pub mod openai;
pub mod openai_text;
pub mod retry;
pub mod sglang;
pub mod slots;
pub mod text;
pub mod token_in;
pub mod trace;
pub mod transport;

pub use api::{
    Continuation, ContinuationRequest, StreamChunk, TargetClient, TargetFacts, TargetTimings,
    TokenStream, WindowRequest, WindowRoute, WindowScore, next_answer,
};
pub use chat_only::ChatOnlyTarget;
pub use chat_prefix::{ChatPrefixTarget, PrefixStyle};
pub use kind::{Abilities, TargetKind, TextSettings, build};
pub use llamacpp::LlamaCppTarget;
pub use openai::OpenAiCompletionsTarget;
pub use openai_text::OpenAiTextTarget;
pub use sglang::SglangTarget;
#[cfg(test)]
pub(crate) use transport::serve_stub;
pub use transport::{
    CacheHints, POOL_IDLE_TIMEOUT, SendFailure, TargetConfig, http_client_builder, load_ca_file,
    tls_failure,
};
pub(crate) use transport::{
    get_json, get_ok, http_client, join, post_json, post_sse, reported_cached_tokens, token_ids,
    tokenized, unless_missing,
};
