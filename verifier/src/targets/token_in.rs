//! vLLM's token-in endpoint, `POST /inference/v1/generate`: how the `vllm` kind scores a
//! window from the server's prefix cache.
//!
//! Why not `/v1/completions`: a request that asks for prompt log-probabilities skips reading the
//! prefix cache there (`skip_reading_prefix_cache` defaults to true with `prompt_logprobs`,
//! vllm/sampling_params.py), so every window recomputes its whole prefix. The token-in endpoint
//! takes a whole `SamplingParams`, and with `skip_reading_prefix_cache: false` vLLM computes
//! only what its cache does not hold. It is there only when the server was started with
//! `--enable-scale-out` (else it answers 403), and it says how many prompt tokens the cache
//! served only with `--enable-prompt-tokens-details`.
//!
//! The trap (vLLM's own GitHub issue #42019): rows of `prompt_logprobs` at cached positions are stale,
//! whatever the server held there before. Row `i` (the log-probability of token `i`) needs the
//! logits at position `i - 1`, which are computed exactly when `i > cached_tokens`. So a window
//! is trusted only when its first row is past `cached_tokens`; otherwise it is scored again
//! without reading the cache. The stale rows also carry token ids the detokenizer cannot read,
//! which crashed the server: `detokenize` is always off.
//!
//! The answer (`GenerateResponse`, vllm/entrypoints/scale_out/token_in_token_out/protocol.py):
//! `prompt_logprobs` at the top level, one `{"<id>": {"logprob", "rank"}}` per prompt position
//! (`null` at the first), as `/v1/completions` gives them; `choices[0].token_ids`; and
//! `usage.prompt_tokens_details.cached_tokens`.

use std::sync::atomic::{AtomicU8, Ordering};

use serde_json::{Value, json};

use super::WindowRequest;
use super::api::WindowRoute;
use crate::error::TargetError;
use crate::sampling::SamplingParams;

/// The endpoint, under the server root.
pub(crate) const PATH: &str = "inference/v1/generate";

/// The route when the server offers the endpoint and says what its cache served.
pub(crate) const FROM_CACHE: WindowRoute = WindowRoute {
    endpoint: "/inference/v1/generate",
    reads_cache: true,
};

/// The fallback: `/v1/completions` with `prompt_logprobs`, which recomputes the prefix.
pub(crate) const RECOMPUTED: WindowRoute = WindowRoute {
    endpoint: "/v1/completions",
    reads_cache: false,
};

/// What a client has learned of its server's route: nothing yet, or one of the two. Kept for
/// the client's life (a server's flags do not change while it runs), except that a server whose
/// token-in endpoint refuses [`REFUSALS_TO_GIVE_UP`] windows in a row is moved to the fallback:
/// each refused window costs a call that is lost and then a call that recomputes its prefix.
#[derive(Debug, Default)]
pub(crate) struct RouteCell {
    route: AtomicU8,
    /// Windows refused since the last one scored.
    refusals: std::sync::atomic::AtomicU32,
}

/// Refused windows in a row after which a client scores windows through the fallback. vLLM
/// 0.32's CPU build serving the 1.5B target refused every window scored from its cache (the
/// stale rows held values JSON cannot carry: `deploy/vllm/window_probe.py`); serving the 0.5B
/// draft it refused 4 of 68 (`tests/bench/scripts/bench-windows.sh`). tests/README.md, "Windows from vLLM's
/// prefix cache".
pub(crate) const REFUSALS_TO_GIVE_UP: u32 = 3;

const UNKNOWN: u8 = 0;
const CACHED: u8 = 1;
const FALLBACK: u8 = 2;

impl RouteCell {
    /// The route, once known.
    pub(crate) fn get(&self) -> Option<WindowRoute> {
        match self.route.load(Ordering::Relaxed) {
            CACHED => Some(FROM_CACHE),
            FALLBACK => Some(RECOMPUTED),
            _ => None,
        }
    }

    /// Keeps `route`; true the first time one is kept (for the one log line that says it).
    pub(crate) fn set(&self, route: WindowRoute) -> bool {
        let v = if route.reads_cache { CACHED } else { FALLBACK };
        self.route.swap(v, Ordering::Relaxed) == UNKNOWN
    }

    /// Counts a window the endpoint scored.
    pub(crate) fn scored(&self) {
        self.refusals.store(0, Ordering::Relaxed);
    }

    /// Counts a window the endpoint refused; true when that makes [`REFUSALS_TO_GIVE_UP`] in a
    /// row and the client has moved to the fallback (once).
    pub(crate) fn refused(&self) -> bool {
        let n = self.refusals.fetch_add(1, Ordering::Relaxed) + 1;
        n >= REFUSALS_TO_GIVE_UP
            && self
                .route
                .compare_exchange(CACHED, FALLBACK, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// The probe: one prompt token, one generated, nothing detokenized. Token 0 is in every
/// vocabulary.
pub(crate) fn probe_body(model: &str) -> Value {
    json!({
        "model": model,
        "token_ids": [0],
        "sampling_params": {"max_tokens": 1, "temperature": 0.0, "detokenize": false},
    })
}

/// What the probe's answer decides: the cached route when the server answered and reported
/// its cached prompt tokens; the fallback when it refused the endpoint as a server without it
/// does (403 without `--enable-scale-out`, 404 on servers that have no such route, 400 or 422
/// from one that does not know a parameter) or answered without the count; an error, to ask
/// again later, for anything else (the server is not up yet, a timeout, an auth failure).
pub(crate) fn route_of(answer: Result<Value, TargetError>) -> Result<WindowRoute, TargetError> {
    match answer {
        Ok(v) if cached_tokens(&v).is_some() => Ok(FROM_CACHE),
        Ok(_) => Ok(RECOMPUTED),
        Err(TargetError::Status {
            status: 400 | 403 | 404 | 405 | 422,
            ..
        }) => Ok(RECOMPUTED),
        Err(e) => Err(e),
    }
}

/// Whether a window call's status is the endpoint refusing that request (a client error other
/// than a rate limit or an auth failure), which the fallback route may still score.
pub(crate) fn refused(status: u16) -> bool {
    matches!(status, 400 | 404 | 405 | 413 | 422)
}

/// Why the fallback is in use, for the log line that says so.
pub(crate) fn fallback_hint() -> &'static str {
    "start vLLM with --enable-scale-out --enable-prefix-caching --enable-prompt-tokens-details \
     to score windows from its prefix cache"
}

/// Prompt tokens the answer says the prefix cache served.
pub(crate) fn cached_tokens(v: &Value) -> Option<u32> {
    super::reported_cached_tokens(&v["usage"])
}

/// Whether every window row of an answer is fresh: its first row (at the prefix's length) is
/// past the tokens the cache served, and there is a row for every prompt token.
pub(crate) fn rows_fresh(v: &Value, prefix_len: usize, prompt_len: usize) -> bool {
    let rows = v["prompt_logprobs"].as_array().map_or(0, Vec::len);
    rows == prompt_len && cached_tokens(v).is_some_and(|c| (c as usize) < prefix_len)
}

/// The window call: `prefix + window`, one token generated after it (greedy, or sampled at
/// `sampling`), `top` log-probabilities at every prompt position; from the cache unless
/// `read_cache` is false.
pub(crate) fn window_body(
    req: &WindowRequest,
    model: &str,
    sampling: &SamplingParams,
    top: u32,
    read_cache: bool,
) -> Value {
    let mut token_ids = req.prefix.clone();
    token_ids.extend_from_slice(&req.window);
    let mut params = json!({
        "max_tokens": 1,
        "temperature": sampling.temperature.max(0.0),
        "top_p": sampling.top_p,
        "prompt_logprobs": top,
        "skip_reading_prefix_cache": !read_cache,
        "detokenize": false,
    });
    if let Some(seed) = sampling.seed {
        params["seed"] = json!(seed as i64);
    }
    json!({"model": model, "token_ids": token_ids, "sampling_params": params})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_decides_by_status_and_by_the_cached_count() {
        let cached = json!({"usage": {"prompt_tokens_details": {"cached_tokens": 0}}});
        assert_eq!(route_of(Ok(cached)).ok(), Some(FROM_CACHE));
        // Without --enable-prompt-tokens-details no row can be trusted from the cache.
        let silent = json!({"usage": {"prompt_tokens": 1}});
        assert_eq!(route_of(Ok(silent)).ok(), Some(RECOMPUTED));
        for status in [400, 403, 404, 405, 422] {
            let refused = TargetError::Status {
                status,
                body: String::new(),
            };
            assert_eq!(route_of(Err(refused)).ok(), Some(RECOMPUTED), "{status}");
        }
        for e in [
            TargetError::Status {
                status: 401,
                body: String::new(),
            },
            TargetError::Status {
                status: 503,
                body: String::new(),
            },
            TargetError::Unreachable {
                url: "u".into(),
                reason: "refused".into(),
            },
        ] {
            assert!(route_of(Err(e)).is_err(), "undecided: ask again later");
        }
    }

    #[test]
    fn a_window_is_fresh_only_past_the_cached_rows() {
        let answer = |cached: u64, rows: usize| {
            json!({
                "prompt_logprobs": vec![Value::Null; rows],
                "usage": {"prompt_tokens_details": {"cached_tokens": cached}},
            })
        };
        // A prefix of 40 and a window of 8: the window's first row is row 40, computed
        // exactly when at most 39 prompt tokens came from the cache.
        assert!(rows_fresh(&answer(32, 48), 40, 48));
        assert!(rows_fresh(&answer(39, 48), 40, 48));
        assert!(!rows_fresh(&answer(40, 48), 40, 48));
        assert!(!rows_fresh(&answer(47, 48), 40, 48));
        assert!(!rows_fresh(&answer(0, 47), 40, 48), "a row missing");
        assert!(
            !rows_fresh(&json!({"prompt_logprobs": []}), 0, 0),
            "no count"
        );
    }

    #[test]
    fn the_window_body_reads_the_cache_and_never_detokenizes() {
        let req = WindowRequest {
            prefix: vec![1, 2, 3],
            window: vec![4, 5],
            model: None,
            sampling: None,
            top_logprobs: 0,
        };
        let s = SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            seed: Some(7),
        };
        let b = window_body(&req, "m", &s, 20, true);
        assert_eq!(b["token_ids"], json!([1, 2, 3, 4, 5]));
        let p = &b["sampling_params"];
        assert_eq!(p["max_tokens"], 1);
        assert_eq!(p["prompt_logprobs"], 20);
        assert_eq!(p["skip_reading_prefix_cache"], false);
        assert_eq!(p["detokenize"], false);
        assert_eq!(p["seed"], 7);
        let fresh = window_body(&req, "m", &SamplingParams::default(), 1, false);
        assert_eq!(fresh["sampling_params"]["skip_reading_prefix_cache"], true);
        assert_eq!(fresh["sampling_params"]["temperature"], 0.0);
        assert!(fresh["sampling_params"].get("seed").is_none());
    }

    #[test]
    fn a_route_is_kept_and_said_once() {
        let cell = RouteCell::default();
        assert_eq!(cell.get(), None);
        assert!(cell.set(FROM_CACHE));
        assert!(!cell.set(FROM_CACHE));
        assert_eq!(cell.get(), Some(FROM_CACHE));
    }

    #[test]
    fn refusals_in_a_row_move_the_client_to_the_fallback_once() {
        let cell = RouteCell::default();
        cell.set(FROM_CACHE);
        assert!(!cell.refused());
        assert!(!cell.refused());
        cell.scored();
        assert!(!cell.refused());
        assert!(!cell.refused());
        assert_eq!(cell.get(), Some(FROM_CACHE), "two in a row");
        assert!(cell.refused(), "the third in a row");
        assert_eq!(cell.get(), Some(RECOMPUTED));
        assert!(!cell.refused(), "said once");
    }
}
