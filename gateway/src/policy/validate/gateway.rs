//! The gateway, draft and passthrough sections: the listener's bounds, auth, the draft's
//! workers and what goes straight to the target.

use std::time::Duration;

use crate::policy::raw::{RawDraft, RawGateway, RawPassthrough};
use crate::policy::typed::{Auth, DraftPolicy, GatewayPolicy, PassthroughPolicy, SpecialTokenText};

use super::*;

impl Validator {
    /// The `gateway` table: who may call, and the bounds every request and connection keeps.
    pub(super) fn gateway(&mut self, g: RawGateway) -> GatewayPolicy {
        let auth = self.auth(g.auth.as_deref(), g.api_keys_env.as_deref());
        let gateway = GatewayPolicy {
            auth,
            api_keys_env: g.api_keys_env,
            max_body_bytes: g.max_body_bytes.unwrap_or(4 << 20),
            max_concurrent_requests: g.max_concurrent_requests.unwrap_or(64),
            request_timeout: self.duration(
                "gateway.request_timeout",
                g.request_timeout,
                Duration::from_secs(600),
                LEAST_REQUEST_TIMEOUT,
            ),
            header_timeout: self.duration(
                "gateway.header_timeout",
                g.header_timeout,
                Duration::from_secs(10),
                LEAST_DEADLINE,
            ),
            body_timeout: self.duration(
                "gateway.body_timeout",
                g.body_timeout,
                Duration::from_secs(30),
                LEAST_DEADLINE,
            ),
            body_idle_timeout: self.duration(
                "gateway.body_idle_timeout",
                g.body_idle_timeout,
                Duration::from_secs(10),
                LEAST_DEADLINE,
            ),
            max_n: g.max_n.unwrap_or(16),
            max_response_bytes: g.max_response_bytes.unwrap_or(32 << 20),
            max_connections: g.max_connections.unwrap_or(1024),
            idle_timeout: self.duration(
                "gateway.idle_timeout",
                g.idle_timeout,
                Duration::from_secs(60),
                LEAST_DEADLINE,
            ),
            max_connections_per_ip: g.max_connections_per_ip.unwrap_or(256),
            write_idle_timeout: self.duration(
                "gateway.write_idle_timeout",
                g.write_idle_timeout,
                Duration::from_secs(60),
                LEAST_DEADLINE,
            ),
            max_tokens_limit: g.max_tokens_limit.unwrap_or(8192),
            default_max_tokens: g.default_max_tokens.unwrap_or(512),
        };
        self.gateway_bounds(&gateway);
        gateway
    }

    pub(super) fn auth(&mut self, auth: Option<&str>, api_keys_env: Option<&str>) -> Auth {
        // Fail closed: running without keys is a choice the policy states.
        match (auth, api_keys_env) {
            (None | Some("keys"), Some(_)) => Auth::Keys,
            (None | Some("keys"), None) => {
                self.err("gateway.api_keys_env: needed for client keys; to run without them, say gateway.auth = \"none\"");
                Auth::Keys
            }
            (Some("none"), None) => Auth::None,
            (Some("none"), Some(_)) => {
                self.err("gateway.auth = \"none\" and gateway.api_keys_env: give one, not both");
                Auth::None
            }
            (Some(other), _) => {
                self.err(format!(
                    "gateway.auth: {other:?} is not one of \"keys\", \"none\""
                ));
                Auth::Keys
            }
        }
    }

    pub(super) fn gateway_bounds(&mut self, gateway: &GatewayPolicy) {
        if gateway.max_n == 0 {
            self.err("gateway.max_n: at least 1");
        }
        if gateway.max_response_bytes < 1024 {
            self.err("gateway.max_response_bytes: at least 1024");
        }
        if gateway.max_body_bytes < 1024 {
            self.err("gateway.max_body_bytes: at least 1024");
        }
        if gateway.max_connections == 0 || u32::try_from(gateway.max_connections).is_err() {
            self.err("gateway.max_connections: at least 1, at most 4294967295");
        }
        if gateway.max_concurrent_requests == 0 {
            self.err("gateway.max_concurrent_requests: at least 1");
        }
        if gateway.default_max_tokens == 0 || gateway.default_max_tokens > gateway.max_tokens_limit
        {
            self.err("gateway.default_max_tokens: must be in 1..=gateway.max_tokens_limit");
        }
    }

    pub(super) fn draft(&mut self, d: RawDraft) -> DraftPolicy {
        let draft = DraftPolicy {
            model_dir: d.model_dir.as_deref().map(|p| self.path(p)),
            model_sha256: d.model_sha256,
            workers: d.workers.unwrap_or(1),
            threads_per_worker: d.threads_per_worker.unwrap_or(2),
            spin_wait: d.spin_wait.unwrap_or(false),
            streams_per_worker: d.streams_per_worker.unwrap_or(DEFAULT_STREAMS_PER_WORKER),
            min_stream_speed: d.min_stream_speed.unwrap_or(DEFAULT_MIN_STREAM_SPEED),
            kv_memory_mb: d.kv_memory_mb.unwrap_or(DEFAULT_KV_MEMORY_MB),
        };
        if draft.streams_per_worker == 0 || draft.streams_per_worker > 64 {
            self.err("draft.streams_per_worker: must be in 1..=64");
        }
        if !(draft.min_stream_speed.is_finite()
            && (0.0..=10_000.0).contains(&draft.min_stream_speed))
        {
            self.err("draft.min_stream_speed: must be in 0..=10000 tokens a second");
        }
        if draft.kv_memory_mb == 0 {
            self.err("draft.kv_memory_mb: at least 1");
        }
        if draft.workers == 0 || draft.workers > 64 {
            self.err("draft.workers: must be in 1..=64");
        }
        if draft.threads_per_worker == 0 {
            self.err("draft.threads_per_worker: at least 1");
        }
        draft
    }

    pub(super) fn passthrough(&mut self, p: Option<RawPassthrough>) -> PassthroughPolicy {
        let (extra_routes, special) = p
            .map(|p| (p.extra_routes, p.special_token_text))
            .unwrap_or_default();
        let special_token_text = match special.as_deref() {
            None | Some("refuse") => SpecialTokenText::Refuse,
            Some("forward") => SpecialTokenText::Forward,
            Some(other) => {
                self.err(format!(
                    "passthrough.special_token_text: {other:?} is not one of \"refuse\", \"forward\""
                ));
                SpecialTokenText::Refuse
            }
        };
        for route in &extra_routes {
            let ok = route.split_once(' ').is_some_and(|(m, p)| {
                matches!(m, "GET" | "POST" | "PUT" | "PATCH" | "DELETE")
                    && p.starts_with("/v1/")
                    && !crate::route::has_dot_segments(p)
            });
            if !ok {
                self.err(format!("passthrough.extra_routes: {route:?} is not \"METHOD /v1/path\" (a path ending in /* covers what is below it)"));
            }
        }
        PassthroughPolicy {
            extra_routes,
            special_token_text,
        }
    }
}
