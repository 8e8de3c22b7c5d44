//! `approxy health`: asks a running gateway whether it is up, for container health checks.
//! The runtime image carries no curl or shell tools, so the binary probes itself.

use std::time::Duration;

/// Succeeds when `url` answers 2xx within `timeout`.
pub async fn probe(url: &str, timeout: Duration) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(timeout)
        // A health check must reach this process, never a proxy named in the environment.
        .no_proxy()
        .build()?;
    let status = client.get(url).send().await?.status();
    anyhow::ensure!(status.is_success(), "{url} answered {status}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::{Router, http::StatusCode, routing::get};

    async fn serve(router: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        format!("http://{addr}/health")
    }

    #[tokio::test]
    async fn a_2xx_is_healthy_and_anything_else_is_not() {
        let up = serve(Router::new().route("/health", get(|| async { "ok" }))).await;
        probe(&up, Duration::from_secs(2)).await.unwrap();
        let down = serve(
            Router::new().route("/health", get(|| async { StatusCode::SERVICE_UNAVAILABLE })),
        )
        .await;
        let err = probe(&down, Duration::from_secs(2)).await.unwrap_err();
        assert!(err.to_string().contains("503"), "{err}");
    }

    #[tokio::test]
    async fn nothing_listening_is_unhealthy() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/health", listener.local_addr().unwrap());
        drop(listener);
        assert!(probe(&url, Duration::from_secs(2)).await.is_err());
    }
}
