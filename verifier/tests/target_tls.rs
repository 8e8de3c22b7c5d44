//! Target clients over TLS with a private CA made in the test: the trusted case speaks
//! HTTP/2 when the server offers it and decodes gzip bodies; an untrusted certificate is
//! refused at once with a TLS error, not retried and not mistaken for an unreachable host.
//!
//! The server is a stub speaking llama.cpp's `/completion` and `/health` wire format
//! (llama.cpp `tools/server/README.md`): what is under test is the transport, and the real
//! llama-server behind real TLS is covered by `tests/e2e/test_tls_target.py`.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use approxy_verifier::TargetError;
use approxy_verifier::targets::{ContinuationRequest, LlamaCppTarget, TargetClient, TargetConfig};
use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use tokio_rustls::rustls;

struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        Self {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    fn write_pem(&self, dir: &std::path::Path, name: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, self.issuer.pem()).unwrap();
        p
    }
}

/// Versions of the HTTP requests the stub saw.
type Seen = Arc<Mutex<Vec<http::Version>>>;

/// Starts the stub on 127.0.0.1 with a `localhost` certificate from `ca`, offering h2 and
/// http/1.1 by ALPN. Returns its https URL and what it saw.
async fn stub(ca: &TestCa) -> (String, Seen) {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca.issuer)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let seen2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, seen) = (acceptor.clone(), seen2.clone());
            tokio::spawn(async move {
                // A client that refuses our certificate ends the handshake here.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let seen = seen.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(&req, &seen)) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (format!("https://localhost:{port}"), seen)
}

/// `/health` answers `{"status":"ok"}`; `/completion` answers two tokens, gzip-encoded.
fn answer(req: &Request<Incoming>, seen: &Seen) -> Response<http_body_util::Full<Bytes>> {
    seen.lock().unwrap().push(req.version());
    match req.uri().path() {
        "/completion" => {
            let json =
                br#"{"content":"ab","tokens":[64,65],"stop_type":"limit","tokens_cached":0}"#;
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(json).unwrap();
            Response::builder()
                .header("content-type", "application/json")
                .header("content-encoding", "gzip")
                .body(http_body_util::Full::new(Bytes::from(gz.finish().unwrap())))
                .unwrap()
        }
        _ => Response::new(http_body_util::Full::new(Bytes::from_static(
            br#"{"status":"ok"}"#,
        ))),
    }
}

fn client(url: &str, ca_file: Option<std::path::PathBuf>) -> LlamaCppTarget {
    LlamaCppTarget::new(TargetConfig {
        base_url: url.to_string(),
        api_key: None,
        model: "m".into(),
        timeout: Duration::from_secs(10),
        retries: 3,
        backoff: Duration::from_millis(5),
        ca_file,
        cache_hints: Default::default(),
        use_env_proxy: false,
    })
    .unwrap()
}

fn two_tokens() -> ContinuationRequest {
    ContinuationRequest::greedy(vec![1, 2, 3], 2)
}

#[tokio::test]
async fn trusted_private_ca_speaks_h2_and_decodes_gzip() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("approxy test CA");
    let (url, seen) = stub(&ca).await;
    let c = client(&url, Some(ca.write_pem(dir.path(), "ca.pem")));
    c.health()
        .await
        .unwrap_or_else(|e| panic!("health over TLS: {e}"));
    let got = c
        .continue_tokens(&two_tokens())
        .await
        .unwrap_or_else(|e| panic!("completion over TLS: {e}"));
    assert_eq!(got.tokens, vec![64, 65], "gzip body decoded");
    let versions = seen.lock().unwrap().clone();
    assert_eq!(
        versions,
        vec![http::Version::HTTP_2, http::Version::HTTP_2],
        "ALPN should pick h2"
    );
}

#[tokio::test]
async fn untrusted_certificate_is_a_tls_error_and_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let (url, seen) = stub(&TestCa::new("approxy test CA")).await;
    for ca_file in [
        Some(TestCa::new("some other CA").write_pem(dir.path(), "other-ca.pem")),
        None,
    ] {
        let c = client(&url, ca_file.clone());
        match c.health().await {
            Err(TargetError::Tls(m)) => assert!(m.contains("invalid peer certificate"), "{m}"),
            other => panic!("expected a TLS error with ca_file {ca_file:?}, got {other:?}"),
        }
        let started = std::time::Instant::now();
        match c.continue_tokens(&two_tokens()).await {
            Err(TargetError::Tls(m)) => assert!(m.contains("UnknownIssuer"), "{m}"),
            other => panic!("expected a TLS error, got {other:?}"),
        }
        // Three retries with backoff would take at least 5+10+20 ms and three handshakes.
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "no request may reach an untrusted server"
    );
}

#[test]
fn ca_file_without_a_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("empty.pem");
    std::fs::write(&p, "no certificate here\n").unwrap();
    let err = LlamaCppTarget::new(TargetConfig {
        base_url: "https://localhost:1".into(),
        api_key: None,
        model: "m".into(),
        timeout: Duration::from_secs(1),
        retries: 0,
        backoff: Duration::from_millis(1),
        ca_file: Some(p),
        cache_hints: Default::default(),
        use_env_proxy: false,
    })
    .expect_err("a CA file with no certificate must be refused");
    assert!(
        matches!(err, TargetError::Tls(ref m) if m.contains("holds no PEM certificate")),
        "{err}"
    );
}
