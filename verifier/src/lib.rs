//! approxy's engine: a local ONNX draft model, verifiers that score each draft token, target
//! clients, and the sequential approximate-verification decode loop that ties them together.
//! It knows nothing of HTTP; the gateway drives it.
//!
//! A server names three faces and nothing else: [`infer`] (start a generation, get its events
//! and its account; what to build once and keep; the shared HTTP transport), [`request`] (what
//! a validated request is made of) and [`policy`] (what a policy file names). The gateway's
//! house test holds it to them.
//!
//! Layout:
//! - `decode`: the decode loop ([`Engine::generate`]): draft, verify, call the target on rejection;
//!   a model's [`DecodeSettings`], built once, and a request's own [`GenerateRequest`].
//! - `draft`: the [`Draft`] trait and its ONNX Runtime implementation (worker threads, KV cache).
//! - `verify`: verifiers that turn a draft position into `p_accept` (confidence, learned head),
//!   which one a model runs ([`verify::VerifierChoice`]), and the per-token decision.
//! - `targets`: target clients behind one trait, the kinds a policy names and what each can do
//!   ([`TargetKind`]), and the HTTP transport they and passthrough share (TLS, retries).
//! - `cost`: what a generation costs as its target is priced ([`cost::Pricing`], one class per
//!   file), and the cost guards.
//! - `grammar`: structured output: a request's JSON schema compiled by llguidance against the
//!   draft's vocabulary, and the per-answer constraint the decode loop follows.
//! - `calibration`: the calibration file: thresholds with their accept and false-accept rates.
//! - `template`: chat messages to prompt text with the model's own chat template.
//! - `tokenizer`, `stop`, `sampling`: token ids to streamed text, stop strings, the sampler.
//! - `infer`, `request`, `policy`: the faces above.
//! - `home`: where cached models and binaries live (`$APPROXY_HOME`).
//! - `error`: the engine's and the target's error types.
//! - `testing` (feature `testing`): scripted draft and target and a tiny tokenizer, for tests
//!   without models.

pub mod calibration;
pub mod cost;
pub mod decode;
pub mod draft;
pub mod error;
pub mod grammar;
pub mod home;
pub mod infer;
pub mod logits;
pub mod policy;
pub mod request;
pub mod sampling;
pub mod stop;
pub mod targets;
pub mod template;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tokenizer;
pub mod verify;

pub use decode::{
    BailoutBudget, Correction, DecodeSettings, Engine, FinishReason, GenerateRequest, Source,
    SpanAsk, SpanClose, Stats, TokenEvent, Verification,
};
pub use draft::lazy::LazyDraftPool;
pub use draft::pool::{DraftLease, DraftPool};
pub use draft::{Draft, DraftConfig, DraftMeta, DraftWorkers};
pub use error::{EngineError, TargetError};
pub use sampling::SamplingParams;
pub use targets::{TargetClient, TargetConfig, TargetKind};
pub use tokenizer::Tokenizer;
pub use verify::{ConfidenceVerifier, LearnedVerifier, Verifier};
