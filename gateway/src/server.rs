//! `approxy serve`: loads the draft workers and the policy, serves the router from `stack`
//! until SIGINT or SIGTERM (then drains in-flight requests), and reloads the policy on file
//! change or SIGHUP.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Semaphore;

use approxy_verifier::home::{DRAFT_GGUF_SHA256, Home};
use approxy_verifier::template::ChatTemplate;
use approxy_verifier::{DraftConfig, DraftWorkers, LazyDraftPool, Tokenizer};

use crate::policy::{Auth, GatewayPolicy, Policy};
use crate::stack::router;
use crate::state::{AppState, Runtime, Shared};

/// `approxy serve` options.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Policy file.
    pub policy: PathBuf,
    /// Listen address.
    pub listen: SocketAddr,
    /// Override of the draft workers from the policy.
    pub workers: Option<usize>,
}

/// Loads everything and builds the state (used by `serve` and by tests).
pub fn build_state(
    policy_path: &Path,
    workers: Option<usize>,
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
) -> anyhow::Result<AppState> {
    let policy = Policy::load(policy_path)?;
    let home = Home::from_env()?;
    let model_dir = policy
        .draft
        .model_dir
        .clone()
        .unwrap_or_else(|| home.draft_onnx_dir());
    let cfg = DraftConfig {
        model_dir: model_dir.clone(),
        onnxruntime_lib: std::env::var_os("APPROXY_ONNXRUNTIME_LIB")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.onnxruntime_lib()),
        workers: workers.unwrap_or(policy.draft.workers),
        threads_per_worker: policy.draft.threads_per_worker,
        spin_wait: policy.draft.spin_wait,
    };
    if !model_dir.join("model.onnx").is_file() {
        anyhow::bail!(
            "no draft model at {}; run `approxy setup` first",
            model_dir.display()
        );
    }
    let tokenizer = Tokenizer::from_file(&model_dir.join("tokenizer.json"))?;
    let template = ChatTemplate::from_file(&model_dir.join("chat_template.jinja"))?;
    let eos = tokenizer.end_of_sequence_ids();
    let draft = LazyDraftPool::new(cfg)?;
    if policy.needs_draft() {
        draft.ensure_started()?;
    } else {
        tracing::info!(
            "no model in this policy runs the draft: it is loaded when a reload adds one"
        );
    }
    let draft = Arc::new(draft);
    let shared = Arc::new(Shared {
        draft,
        tokenizer,
        template,
        eos,
        draft_sha256: policy
            .draft
            .model_sha256
            .clone()
            .unwrap_or_else(|| DRAFT_GGUF_SHA256.to_string()),
        prometheus,
        inflight: Arc::new(Semaphore::new(policy.gateway.max_concurrent_requests)),
        policy_path: policy_path.to_path_buf(),
        ledgers: Default::default(),
    });
    let runtime = Runtime::build(policy, &shared)?;
    Ok(AppState::new(shared, runtime))
}

/// Runs the server until a shutdown signal, then drains.
pub async fn serve(opts: ServeOptions) -> anyhow::Result<()> {
    let prometheus = crate::telemetry::install_metrics()?;
    let policy_path = opts.policy.clone();
    let workers = opts.workers;
    let state = tokio::task::spawn_blocking(move || build_state(&policy_path, workers, prometheus))
        .await??;
    let listener = tokio::net::TcpListener::bind(opts.listen).await?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, policy = %opts.policy.display(), "approxy listening");
    // A line on stdout that scripts and tests wait for.
    println!("approxy listening on http://{addr}");
    tokio::spawn(watch_policy(state.clone()));
    let gw = state.runtime().policy.gateway.clone();
    accept_loop(listener, router(state), &gw, shutdown_signal()).await;
    tracing::info!("drained; bye");
    Ok(())
}

/// Serves connections until `shutdown`, then lets open ones finish. At most
/// `max_connections` are open at once (more wait in the kernel's accept queue), and a
/// connection that does not complete a request's headers within `header_timeout` (a slow
/// or idle client) is closed. Both are start-up settings.
pub async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    gw: &GatewayPolicy,
    shutdown: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;
    let slots = Arc::new(Semaphore::new(gw.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(gw.header_timeout);
    builder.http2().timer(TokioTimer::new());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => match s { Ok(s) => s, Err(_) => break },
            () = &mut shutdown => break,
        };
        let tcp = tokio::select! {
            r = listener.accept() => match r {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Without TCP_NODELAY a response written in pieces (headers, then streamed chunks)
        // waits on the client's delayed ACK: milliseconds per request, and per SSE token.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let conn = builder
            .serve_connection_with_upgrades(
                TokioIo::new(tcp),
                TowerToHyperService::new(app.clone()),
            )
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    tracing::info!("shutdown signal: finishing in-flight requests");
    graceful.shutdown().await;
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

fn fingerprint(p: &Path) -> Option<(SystemTime, u64, Vec<u8>)> {
    let m = std::fs::metadata(p).ok()?;
    Some((m.modified().ok()?, m.len(), std::fs::read(p).ok()?))
}

/// Reloads the policy when its file changes (polled each second) or on SIGHUP. A file that
/// fails validation is reported and ignored: the running policy stays.
async fn watch_policy(state: AppState) {
    let path = state.shared.policy_path.clone();
    let mut seen = fingerprint(&path);
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        let forced = tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => false,
            Some(_) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
        };
        let now = fingerprint(&path);
        if !forced && now.as_ref().map(|f| &f.2) == seen.as_ref().map(|f| &f.2) {
            continue;
        }
        seen = now;
        // Blocking: a reload may have to load the draft.
        let (state, path) = (state.clone(), path.clone());
        let _ = tokio::task::spawn_blocking(move || reload(&state, &path)).await;
    }
}

/// Validates the file and swaps the runtime in; returns whether it was applied.
pub fn reload(state: &AppState, path: &Path) -> bool {
    let result = Policy::load(path).map_err(anyhow::Error::from).and_then(|p| {
        let old = state.runtime();
        if p.draft != old.policy.draft {
            tracing::warn!("[draft] changes take effect at the next restart");
        }
        // A file edit must not open a gateway that was closed.
        if old.policy.gateway.auth == Auth::Keys && p.gateway.auth == Auth::None {
            anyhow::bail!("the new policy turns client auth off (gateway.auth = \"none\"); restart to do that");
        }
        // Before the new policy serves anything: its first approximate request finds the
        // drafts loaded.
        if p.needs_draft() {
            state.shared.draft.ensure_started()?;
        }
        Runtime::build(p, &state.shared)
    });
    match result {
        Ok(rt) => {
            state.replace(rt);
            metrics::counter!("approxy_policy_reloads_total", "outcome" => "applied").increment(1);
            tracing::info!(policy = %path.display(), "policy reloaded");
            true
        }
        Err(e) => {
            metrics::counter!("approxy_policy_reloads_total", "outcome" => "rejected").increment(1);
            tracing::error!(error = %e, "new policy rejected; keeping the running one");
            false
        }
    }
}
