//! approxy's engine: a local ONNX draft model, verifiers that score each draft token, target
//! clients, and the sequential approximate-verification decode loop that ties them together.
//! It knows nothing of HTTP; the gateway drives it.

pub mod decode;
pub mod draft;
pub mod error;
pub mod home;
pub mod sampling;
pub mod stop;
pub mod target;
pub mod tokenizer;
pub mod verify;

pub use decode::{BailoutBudget, Engine, FinishReason, GenerateRequest, Source, Stats, TokenEvent};
pub use draft::pool::{DraftLease, DraftPool};
pub use draft::{DraftConfig, DraftMeta};
pub use error::{EngineError, TargetError};
pub use sampling::SamplingParams;
pub use target::{TargetClient, TargetConfig, TargetKind};
pub use tokenizer::Tokenizer;
pub use verify::{ConfidenceVerifier, LearnedVerifier, Verifier};
