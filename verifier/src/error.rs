//! The engine's error type. The gateway maps these to HTTP in one place.

/// Errors from a target (the remote model server).
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// Could not connect (after retries).
    #[error("target unreachable at {url}: {reason}")]
    Unreachable {
        /// The URL tried (never includes credentials).
        url: String,
        /// What failed.
        reason: String,
    },
    /// No answer in time.
    #[error("target timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The target answered with an error status (after retries for 5xx).
    #[error("target returned HTTP {status}")]
    Status {
        /// HTTP status code.
        status: u16,
        /// Start of the body, for logs only; never sent to clients.
        body: String,
    },
    /// The TLS connection to the target failed (untrusted certificate, name mismatch,
    /// handshake refused). Not retried.
    #[error("TLS with the target failed: {0}")]
    Tls(String),
    /// The answer did not have the expected shape.
    #[error("target answer malformed: {0}")]
    Protocol(String),
}

/// Everything the engine can fail with.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The ONNX draft runtime failed (load or inference).
    #[error("draft model: {0}")]
    Draft(String),
    /// Tokenizer load, encode or decode failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A verifier artifact could not be used.
    #[error("verifier artifact: {0}")]
    Artifact(String),
    /// Draft and target disagree on tokenization: approximate mode is refused.
    #[error("draft and target tokenize differently: {0}")]
    TokenizerMismatch(String),
    /// The target failed.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// All draft workers are busy.
    #[error("all draft workers are busy")]
    Saturated,
    /// The draft worker went away (its thread ended).
    #[error("draft worker stopped")]
    WorkerGone,
    /// The answer's grammar failed (its engine's error, not the client's schema: a schema it
    /// cannot compile passes through before any work).
    #[error("grammar: {0}")]
    Grammar(String),
}

impl From<ort::Error> for EngineError {
    fn from(e: ort::Error) -> Self {
        EngineError::Draft(e.to_string())
    }
}
