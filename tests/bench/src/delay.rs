//! A forwarding proxy that holds every request for a fixed time before passing it on: the
//! round trip a remote API adds to each call, put in front of a local target. Everything
//! the benchmark sends to the target goes through it, so target-only runs pay the same delay
//! per call as approxy's.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures::TryStreamExt;

#[derive(Clone)]
struct Forward {
    upstream: String,
    delay: Duration,
    http: reqwest::Client,
}

/// A running delay proxy; stopped when dropped.
pub struct DelayProxy {
    /// Its root URL.
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Headers that belong to one hop (RFC 9110, section 7.6.1) or that the client recomputes.
const HOP: [&str; 5] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "host",
    "content-length",
];

fn copy_headers(from: &HeaderMap) -> HeaderMap {
    let mut h = from.clone();
    for name in HOP {
        h.remove(name);
    }
    h
}

async fn forward(State(f): State<Forward>, req: Request) -> Result<Response, StatusCode> {
    tokio::time::sleep(f.delay).await;
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let body = axum::body::to_bytes(body, 64 << 20)
        .await
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    let resp = f
        .http
        .request(parts.method, format!("{}{path}", f.upstream))
        .headers(copy_headers(&parts.headers))
        .body(body)
        .send()
        .await
        .map_err(|_| StatusCode::BAD_GATEWAY)?;
    let mut out = Response::builder().status(resp.status());
    if let Some(h) = out.headers_mut() {
        *h = copy_headers(resp.headers());
    }
    // Streamed through as it arrives: a dropped client drops the upstream call too.
    out.body(Body::from_stream(
        resp.bytes_stream().map_err(std::io::Error::other),
    ))
    .map_err(|_| StatusCode::BAD_GATEWAY)
}

/// Starts a proxy to `upstream` (a root URL) that waits `delay` before forwarding each request.
pub async fn start(upstream: &str, delay: Duration) -> anyhow::Result<DelayProxy> {
    let state = Forward {
        upstream: upstream.trim_end_matches('/').to_string(),
        delay,
        http: reqwest::Client::builder()
            .pool_idle_timeout(approxy_verifier::targets::POOL_IDLE_TIMEOUT)
            .build()?,
    };
    let app = Router::new().fallback(forward).with_state(state);
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let url = format!("http://{}", listener.local_addr()?);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "delay proxy stopped");
        }
    });
    Ok(DelayProxy { url, task })
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use axum::routing::post;

    use super::*;

    #[tokio::test]
    async fn each_call_is_held_for_the_delay_and_forwarded_whole() -> anyhow::Result<()> {
        let upstream = Router::new().route(
            "/v1/completions",
            post(|body: String| async move { format!("echo:{body}") }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let up = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, upstream).await });
        let proxy = start(&up, Duration::from_millis(150)).await?;
        let http = reqwest::Client::new();
        for _ in 0..2 {
            let t = Instant::now();
            let r = http
                .post(format!("{}/v1/completions", proxy.url))
                .body("hello")
                .send()
                .await?;
            assert_eq!(r.status(), 200);
            assert_eq!(r.text().await?, "echo:hello");
            assert!(
                t.elapsed() >= Duration::from_millis(150),
                "{:?}",
                t.elapsed()
            );
        }
        let missing = http.get(format!("{}/nowhere", proxy.url)).send().await?;
        assert_eq!(
            missing.status(),
            404,
            "the upstream's status passes through"
        );
        Ok(())
    }
}
