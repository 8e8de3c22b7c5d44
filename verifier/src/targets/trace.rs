//! W3C trace context (<https://www.w3.org/TR/trace-context/>) carried from a client's request
//! to every target call the engine makes for it, so a tracing system sees the target's work
//! under the client's trace. It travels as a task-local around the engine's run rather than
//! through every call signature; `transport::send_with_retries`, the one place calls are sent,
//! adds the headers.

use std::future::Future;

tokio::task_local! {
    static CONTEXT: TraceContext;
}

/// The `traceparent` and `tracestate` headers of one request, when well-formed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl TraceContext {
    /// Keeps a `traceparent` only in the W3C form (`00-<32 hex>-<16 hex>-<2 hex>`, ids not all
    /// zero) and a `tracestate` only beside one, at most 512 printable ASCII bytes; anything
    /// else is dropped, never forwarded.
    pub fn from_headers(traceparent: Option<&str>, tracestate: Option<&str>) -> Self {
        let traceparent = traceparent
            .map(str::trim)
            .filter(|t| valid_traceparent(t))
            .map(str::to_string);
        let tracestate = tracestate
            .map(str::trim)
            .filter(|s| {
                traceparent.is_some()
                    && !s.is_empty()
                    && s.len() <= 512
                    && s.bytes().all(|b| (0x20..0x7f).contains(&b))
            })
            .map(str::to_string);
        Self {
            traceparent,
            tracestate,
        }
    }

    /// Header pairs to send.
    pub fn headers(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("traceparent", &self.traceparent),
            ("tracestate", &self.tracestate),
        ]
        .into_iter()
        .filter_map(|(n, v)| v.as_deref().map(|v| (n, v)))
    }
}

fn valid_traceparent(t: &str) -> bool {
    let parts: Vec<&str> = t.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    matches!(parts.as_slice(), [v, id, parent, flags]
        if hex(v, 2) && *v != "ff" && hex(id, 32) && nonzero(id) && hex(parent, 16) && nonzero(parent) && hex(flags, 2))
}

/// Runs `f` with `ctx` as the trace context of every target call made inside it.
pub async fn scope<F: Future>(ctx: TraceContext, f: F) -> F::Output {
    CONTEXT.scope(ctx, f).await
}

/// The trace context of the running task, if any.
pub(crate) fn current() -> Option<TraceContext> {
    CONTEXT.try_with(Clone::clone).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn only_well_formed_contexts_are_kept() {
        let ok = TraceContext::from_headers(Some(TP), Some("vendor=abc"));
        assert_eq!(
            ok.headers().collect::<Vec<_>>(),
            [("traceparent", TP), ("tracestate", "vendor=abc")]
        );
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nx-evil: 1",
        ] {
            assert_eq!(
                TraceContext::from_headers(Some(bad), Some("v=1")),
                TraceContext::default(),
                "{bad}"
            );
        }
        assert_eq!(
            TraceContext::from_headers(None, Some("v=1"))
                .headers()
                .count(),
            0
        );
    }

    #[tokio::test]
    async fn the_context_is_there_inside_the_scope_only() {
        assert!(current().is_none());
        let ctx = TraceContext::from_headers(Some(TP), None);
        let inside = scope(ctx.clone(), async { current() }).await;
        assert_eq!(inside, Some(ctx));
    }
}
