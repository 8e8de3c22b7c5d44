//! `ApproxVerifyLayer`: the tower layer that sends eligible chat and completion requests
//! through the engine and everything else to the inner (passthrough) service. Eligibility:
//! a model whose policy mode is `approximate`, a request the draft loop can serve (no tools,
//! `n` = 1, no logprobs ...), identical draft/target tokenizers, and an idle draft worker.
//! When all draft workers are busy the request degrades to passthrough instead of queueing.

mod respond;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{Method, Request};
use axum::response::{IntoResponse, Response};
use tower::{Layer, Service, ServiceExt};

use approxy_verifier::GenerateRequest;

use crate::error::ApiError;
use crate::openai::{self, Endpoint, Prompt, ValidRequest};
use crate::passthrough::{BufferedBody, PassthroughReason};
use crate::policy::{Mode, ModelPolicy};
use crate::state::{AppState, TokenizerCheck};

/// Header for a per-request threshold within the policy's allowed range.
pub const THRESHOLD_HEADER: &str = "x-approxy-threshold";

/// Longest prompt (in tokens) the approximate path takes; the draft's context is 32k.
const MAX_PROMPT_TOKENS: usize = 30_000;

/// Layer constructor.
#[derive(Clone)]
pub struct ApproxVerifyLayer {
    state: AppState,
}

impl ApproxVerifyLayer {
    /// A layer over the given state.
    pub fn new(state: AppState) -> Self {
        Self { state }
    }
}

impl<S> Layer<S> for ApproxVerifyLayer {
    type Service = ApproxVerify<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ApproxVerify { inner, state: self.state.clone() }
    }
}

/// The service the layer builds.
#[derive(Clone)]
pub struct ApproxVerify<S> {
    inner: S,
    state: AppState,
}

impl<S> Service<Request<Body>> for ApproxVerify<S>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let state = self.state.clone();
        let inner = self.inner.clone();
        Box::pin(async move { Ok(handle(state, inner, req).await.unwrap_or_else(IntoResponse::into_response)) })
    }
}

fn endpoint_of(req: &Request<Body>) -> Option<Endpoint> {
    if req.method() != Method::POST {
        return None;
    }
    match req.uri().path() {
        "/v1/chat/completions" => Some(Endpoint::Chat),
        "/v1/completions" => Some(Endpoint::Completions),
        _ => None,
    }
}

async fn handle<S>(state: AppState, inner: S, req: Request<Body>) -> Result<Response, ApiError>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send,
{
    let Some(endpoint) = endpoint_of(&req) else {
        return Ok(inner.oneshot(req).await.unwrap_or_else(|e| match e {}));
    };
    let rt = state.runtime();
    let (mut parts, body) = req.into_parts();
    let limit = rt.policy.gateway.max_body_bytes;
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| ApiError::PayloadTooLarge(limit))?;
    let valid = openai::parse(endpoint, &bytes, &rt.policy.gateway)?;
    let model_policy = rt.policy.model(&valid.model).cloned();
    let threshold = requested_threshold(&parts.headers, model_policy.as_ref())?;

    let decision = match (&model_policy, valid.passthrough_reason) {
        (None, _) => Err("model_without_policy"),
        (Some(m), _) if m.mode == Mode::Passthrough => Err("policy_passthrough"),
        (Some(_), _) if !rt.policy.target.kind.can_continue() => Err("target_cannot_continue"),
        (Some(_), Some(r)) => Err(r),
        (Some(m), None) => match rt.tokenizer_check().await {
            Ok(TokenizerCheck::Different(_)) => Err("tokenizer_mismatch"),
            Ok(_) => Ok(m.clone()),
            Err(e) => return Err(e.into()),
        },
    };
    let lease = match &decision {
        Ok(_) => state.shared.draft.try_lease(),
        Err(_) => None,
    };
    match (decision, lease) {
        (Ok(mp), Some(lease)) => {
            let verifier = rt.verifiers.get(&valid.model).or_else(|| rt.verifiers.get("*")).cloned()
                .ok_or_else(|| ApiError::Internal("no verifier for model".into()))?;
            let request = generation(&state, &valid, &mp, threshold.unwrap_or(mp.threshold))?;
            respond::approximate(Arc::clone(&rt), valid, mp, verifier, lease, request).await
        }
        (decision, _) => {
            let reason = decision.err().unwrap_or("draft_saturated");
            parts.extensions.insert(PassthroughReason(reason));
            parts.extensions.insert(BufferedBody(bytes.clone()));
            let req = Request::from_parts(parts, Body::from(bytes));
            Ok(inner.oneshot(req).await.unwrap_or_else(|e| match e {}))
        }
    }
}

/// The per-request threshold from the header, checked against the policy's range.
fn requested_threshold(headers: &axum::http::HeaderMap, mp: Option<&ModelPolicy>) -> Result<Option<f32>, ApiError> {
    let Some(v) = headers.get(THRESHOLD_HEADER) else { return Ok(None) };
    let t: f32 = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|t: &f32| t.is_finite())
        .ok_or_else(|| ApiError::bad(THRESHOLD_HEADER, format!("{THRESHOLD_HEADER} must be a number")))?;
    if let Some(mp) = mp {
        let (lo, hi) = mp.threshold_override;
        if t < lo || t > hi {
            return Err(ApiError::bad(THRESHOLD_HEADER, format!("{THRESHOLD_HEADER} {t} is outside the range [{lo}, {hi}] this model's policy allows")));
        }
    }
    Ok(Some(t))
}

/// Prompt tokens and engine parameters for a valid request.
fn generation(state: &AppState, v: &ValidRequest, mp: &ModelPolicy, threshold: f32) -> Result<GenerateRequest, ApiError> {
    let tok = &state.shared.tokenizer;
    let prompt = match &v.prompt {
        Some(Prompt::Chat(msgs)) => {
            let text = state.shared.template.render(msgs).map_err(|e| ApiError::bad("messages", format!("chat template: {e}")))?;
            tok.encode(&text)?
        }
        Some(Prompt::Text(t)) => tok.encode(t)?,
        Some(Prompt::Tokens(ids)) => ids.clone(),
        None => return Err(ApiError::Internal("approximate path without a prompt".into())),
    };
    let param = if v.endpoint == Endpoint::Chat { "messages" } else { "prompt" };
    if prompt.is_empty() {
        return Err(ApiError::bad(param, "the prompt is empty"));
    }
    if prompt.len() > MAX_PROMPT_TOKENS {
        return Err(ApiError::bad(param, format!("the prompt has {} tokens; at most {MAX_PROMPT_TOKENS}", prompt.len())));
    }
    let vocab = state.shared.draft.meta().vocab_size as u32;
    if prompt.iter().any(|&t| t >= vocab) {
        return Err(ApiError::bad(param, format!("token ids must be below {vocab}")));
    }
    Ok(GenerateRequest {
        prompt,
        max_tokens: v.max_tokens,
        sampling: v.sampling,
        stop: v.stop.clone(),
        threshold,
        correction_tokens: mp.correction_tokens,
        bailout: mp.bailout,
        model: Some(v.model.clone()),
    })
}

