//! The routes and the tower stack around them, stated once. A request passes the layers top
//! to bottom; each line says why its layer sits where it does. The diagram in gateway/README.md is this
//! function.

use axum::Router;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post};
use tower::ServiceBuilder;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;

use crate::error::ApiError;
use crate::middleware;
use crate::passthrough::Passthrough;
use crate::routes;
use crate::state::AppState;

#[derive(Clone, Default)]
struct RandomRequestId;

impl MakeRequestId for RandomRequestId {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        axum::http::HeaderValue::from_str(&format!("req-{:024x}", rand::random::<u128>() >> 32))
            .ok()
            .map(RequestId::new)
    }
}

/// The whole HTTP surface: the OpenAI API under `/v1` behind the stack, and the probes and
/// metrics outside it (a probe must answer even when the gateway is full or keys are set).
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route(
            "/v1/chat/completions",
            post(routes::chat_completions).fallback_service(Passthrough::new(state.clone())),
        )
        .route(
            "/v1/completions",
            post(routes::completions).fallback_service(Passthrough::new(state.clone())),
        )
        .route_service("/v1/models", Passthrough::new(state.clone()))
        // llama-server and vLLM serve only the list; the gateway answers from it.
        .route("/v1/models/{*id}", axum::routing::get(routes::model))
        .route_service("/v1/{*rest}", Passthrough::new(state.clone()))
        .layer(
            ServiceBuilder::new()
                // Before the id is set: a client's id that could forge or bloat log lines is
                // replaced by the gateway's own.
                .layer(from_fn(middleware::request_id))
                // First, so every response, refusals included, carries an id the client can quote.
                .layer(SetRequestIdLayer::x_request_id(RandomRequestId))
                // Inside the id, so the request's span carries it.
                .layer(TraceLayer::new_for_http())
                .layer(PropagateRequestIdLayer::x_request_id())
                // Before any work, inside the id: a refusal carries it.
                .layer(from_fn(middleware::protocol_limits))
                // Before any layer reads the policy: the request keeps this runtime to its end.
                .layer(from_fn_with_state(state.clone(), middleware::snapshot))
                // Before anything costs work: an unauthenticated request is refused at once.
                .layer(from_fn_with_state(state.clone(), middleware::auth))
                // Before a slot is taken: an oversize, slow or stalled body never holds one.
                .layer(from_fn_with_state(state.clone(), middleware::read_body))
                // Load shedding: 429 at once when full; the slot is held until the body ends.
                .layer(from_fn_with_state(state.clone(), middleware::concurrency))
                // Inside the slot, so a timed-out request frees it.
                .layer(from_fn_with_state(state.clone(), middleware::timeout))
                // Innermost: counts what ran, by route (refusals are counted where refused).
                .layer(from_fn(middleware::request_metrics)),
        );
    Router::new()
        .route("/health", get(routes::health))
        .route("/ready", get(routes::ready))
        .route("/metrics", get(routes::metrics))
        .merge(api)
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}
