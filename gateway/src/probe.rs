//! `approxy health`: asks a running gateway whether it is up, for container health checks.
//! The runtime image carries no curl or shell tools, so the binary probes itself.

use std::net::SocketAddr;
use std::time::Duration;

/// The health URL of a gateway listening on `listen` (`APPROXY_LISTEN`), as seen from the same
/// host: an unspecified address (`0.0.0.0`, `::`) is reached on loopback. So the image's health
/// check follows the port when an operator moves it.
pub fn health_url(listen: Option<&str>) -> String {
    let addr = listen
        .and_then(|l| l.parse::<SocketAddr>().ok())
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
    let ip = match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
        ip if ip.is_unspecified() => "[::1]".to_string(),
        ip if ip.is_ipv6() => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    format!("http://{ip}:{}/health", addr.port())
}

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

    #[test]
    fn the_url_follows_the_listen_address() {
        assert_eq!(health_url(None), "http://127.0.0.1:8080/health");
        assert_eq!(
            health_url(Some("0.0.0.0:9000")),
            "http://127.0.0.1:9000/health"
        );
        assert_eq!(health_url(Some("10.1.2.3:81")), "http://10.1.2.3:81/health");
        assert_eq!(health_url(Some("[::]:8080")), "http://[::1]:8080/health");
        assert_eq!(
            health_url(Some("not an address")),
            "http://127.0.0.1:8080/health"
        );
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
