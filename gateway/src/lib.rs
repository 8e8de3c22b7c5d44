//! approxy's serving library: the OpenAI-compatible HTTP API in front of a target model. It
//! decides per request whether the local draft and verifier answer it (the engine in
//! `approxy-verifier`) or the target does unchanged, and runs the tower stack around both.
//! It links nothing the server does not need; the tools live in their own crates.
//!
//! Layout:
//! - `probe`: `approxy health`, the container health check.
//! - `server`: `approxy serve`: loads the draft and policy, listens, drains on shutdown, reloads.
//! - `connection`: below HTTP: deadlines for a quiet connection, the per-address cap.
//! - `stack`: the routes and the tower stack around them, in order, each layer with its reason.
//! - `routes`: one handler per endpoint (`/v1/chat/completions`, `/v1/completions`, health, ...).
//! - `decide`: the approximate-or-passthrough decision.
//! - `reason`: every passthrough [`reason::Reason`].
//! - `request`: request checking: the OpenAI request bodies as typed structs (unknown fields
//!   kept), the limits every chat and completions request is held to whichever path serves it,
//!   the features the draft loop lacks, validation to a [`request::validate::ValidRequest`] or
//!   a [`request::error::ValidationError`], and the prompt's kind (code or chat).
//! - `route`: which paths are served or forwarded, and which could resolve elsewhere upstream.
//! - `respond`: engine tokens to an OpenAI response (SSE or JSON) with `usage.approxy` and cost.
//! - `tool_calls`: an answer's text to OpenAI's `tool_calls`, whole or as streamed deltas.
//! - `passthrough`: forwards a request to the target unchanged and streams the answer back.
//! - `middleware`: auth, body limit, load shedding, timeout, request metrics.
//! - `body_budget`: the bytes bodies being read may hold, and one client address's share.
//! - `policy`: policy files: raw TOML, validated into typed values; their JSON Schema.
//! - `state`: process-wide parts and the per-policy runtime swapped on reload.
//! - `error`: the API error type, the one place errors become OpenAI-shaped responses.
//! - `telemetry`: logging and the Prometheus metrics.
//! - `docs_tests` (tests only): the references in the Markdown files checked against the code.

pub mod body_budget;
pub mod budget;
pub mod connection;
pub mod decide;
pub mod error;
pub mod meters;
pub mod middleware;
pub mod passthrough;
pub mod policy;
pub mod probe;
pub mod reason;
pub mod request;
pub mod respond;
pub mod route;
pub mod routes;
pub mod server;
pub mod stack;
pub mod state;
pub mod telemetry;
pub mod tool_calls;

#[cfg(test)]
mod connection_tests;
#[cfg(test)]
mod docs_tests;
#[cfg(test)]
mod router_tests;
