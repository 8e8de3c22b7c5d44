//! `approxy serve`: loads the draft workers and the policy, serves the router from `stack`
//! until SIGINT or SIGTERM (then drains in-flight requests), and reloads the policy on file
//! change or SIGHUP.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;

use approxy_verifier::infer::{
    DRAFT_GGUF_SHA256, DraftConfig, DraftWorkers, Home, LazyDraftPool, TargetCounters, WindowRoute,
};
use approxy_verifier::request::{ChatTemplate, Tokenizer};

use crate::connection::{Activity, Deadlines, Overdue, PerAddress, Tracked};
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
        streams_per_worker: policy.draft.streams_per_worker,
        min_stream_speed: policy.draft.min_stream_speed,
        kv_bytes_per_worker: policy.draft.kv_memory_mb.saturating_mul(1 << 20),
    };
    if !model_dir
        .join(approxy_verifier::infer::DRAFT_GRAPH)
        .is_file()
    {
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
        body_budget: crate::body_budget::BodyBudget::for_policy(&policy.gateway),
        policy_path: policy_path.to_path_buf(),
        ledgers: Default::default(),
        meters: Default::default(),
        grammars: Default::default(),
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
    tokio::spawn(watch_counters(state.clone()));
    tokio::spawn(watch_window_route(state.clone()));
    if state.runtime().policy.needs_draft() {
        // The grammar compiler (half a second for the draft's vocabulary) is built now, beside
        // the first requests, so the first structured request does not wait for it.
        let shared = Arc::clone(&state.shared);
        tokio::spawn(async move {
            if let Err(e) = shared.grammars().await {
                tracing::warn!(error = %e, "no grammar compiler: structured requests pass through");
            }
        });
    }
    let gw = state.runtime().policy.gateway.clone();
    accept_loop(listener, router(state), &gw, shutdown_signal()).await;
    tracing::info!("drained; bye");
    Ok(())
}

/// Serves connections until `shutdown`, then lets open ones finish. At most
/// `max_connections` are open at once (more wait in the kernel's accept queue), at most
/// `max_connections_per_ip` from one client address (more are closed at once), and a
/// connection without a request in flight is closed when it has been quiet too long: before
/// its first request's headers (`header_timeout`, HTTP/1 and HTTP/2 alike, also one that sent
/// nothing or only part of a protocol preface) and after a response (`idle_timeout`). These
/// are start-up settings.
///
/// Hand-written rather than `axum::serve`: that serves every connection it accepts, with no
/// cap on open connections or per client address and no deadline on a connection that sends
/// nothing, which is what a slow-loris client exploits.
pub async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    gw: &GatewayPolicy,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(gw.max_connections));
    let per_address = PerAddress::new(gw.max_connections_per_ip);
    let deadlines = Deadlines {
        first_request: gw.header_timeout,
        idle: gw.idle_timeout,
        write_idle: gw.write_idle_timeout,
    };
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let builder = connection_builder(gw);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => match s { Ok(s) => s, Err(_) => break },
            () = &mut shutdown => break,
        };
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(address_slot) = per_address.try_take(peer.ip()) else {
            metrics::counter!("approxy_connections_closed_total", "reason" => "per_ip_cap")
                .increment(1);
            tracing::debug!(peer = %peer.ip(), "connection closed: this address holds gateway.max_connections_per_ip");
            continue;
        };
        let connection = connection(&builder, &app, tcp, peer, deadlines, stopping.clone());
        tokio::spawn(async move {
            connection.await;
            drop(address_slot);
            drop(slot);
        });
    }
    drop(listener);
    tracing::info!("shutdown signal: finishing in-flight requests");
    let _ = stop.send(true);
    // Every connection holds a slot until it ends: all of them back means all are done.
    let all = u32::try_from(gw.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
}

/// The HTTP/1 and HTTP/2 server settings every connection is served with.
fn connection_builder(gw: &GatewayPolicy) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    // hyper starts its HTTP/1 header timer as soon as a kept-alive connection goes idle, so
    // the next request's head must be complete within this of the previous answer: set to the
    // longer deadline, or keep-alive would end at `header_timeout` instead of `idle_timeout`.
    // The first request's deadline (`header_timeout`) is the watcher's (`watch_connection`).
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(gw.header_timeout.max(gw.idle_timeout))
        // Past the gateway's own limit, so the refusal is its shaped 431 (`protocol_limits`).
        .max_headers(crate::middleware::HYPER_MAX_HEADERS);
    // Pings find a peer that went away while a stream was open (no idle deadline runs then).
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(H2_PING_INTERVAL))
        .keep_alive_timeout(H2_PING_INTERVAL)
        .max_concurrent_streams(H2_MAX_STREAMS);
    builder
}

/// Serving one accepted connection from `peer`, to its end (see [`watch_connection`]).
fn connection(
    builder: &Builder<TokioExecutor>,
    app: &axum::Router,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    deadlines: Deadlines,
    stopping: tokio::sync::watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    // Without TCP_NODELAY a response written in pieces (headers, then streamed chunks)
    // waits on the client's delayed ACK: milliseconds per request, and per SSE token.
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY not set");
    }
    let activity = Activity::new();
    let conn = builder
        .serve_connection_with_upgrades(
            TokioIo::new(tcp),
            TowerToHyperService::new(Tracked::new(app.clone(), activity.clone(), Some(peer.ip()))),
        )
        .into_owned();
    async move { watch_connection(conn, &activity, deadlines, stopping).await }
}

/// How often an HTTP/2 connection pings its client, and how long it waits for the answer.
const H2_PING_INTERVAL: Duration = Duration::from_secs(20);

/// Streams one HTTP/2 connection may have open at once (hyper's default is 200): enough for a
/// client's parallel requests against a gateway of 64 request slots, and a bound on how many
/// bodies and answers one connection can hold.
const H2_MAX_STREAMS: u32 = 32;

/// How long a connection told to close for being idle has to do so before it is dropped (an
/// HTTP/2 client that never answers the GOAWAY, say). A request that starts meanwhile is
/// served: the limit applies only while none is in flight.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Drives one connection to its end: closes it when it has been quiet past its deadline (see
/// [`accept_loop`]), drops it when its client stopped taking a response for
/// `write_idle_timeout`, and closes it gracefully at shutdown, letting the requests in flight
/// finish.
async fn watch_connection<C>(
    conn: C,
    activity: &Activity,
    deadlines: Deadlines,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) where
    C: hyper_util::server::graceful::GracefulConnection,
    C::Error: std::fmt::Display,
{
    let mut conn = std::pin::pin!(conn);
    // Set once the connection was told to close for being idle: when it must be gone by.
    let mut closing_idle: Option<tokio::time::Instant> = None;
    let mut shutting_down = *stopping.borrow();
    if shutting_down {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        let due = match (activity.deadline(deadlines), closing_idle) {
            // Told to close: dropped at the grace's end unless a request is in flight.
            (Some((_, Overdue::Idle)), Some(end)) => Some((end, Overdue::Idle)),
            (due, _) => due,
        };
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = activity.changed() => {
                // A request that began after the close was asked for is served to its end.
                if activity.deadline(deadlines).is_none_or(|d| d.1 != Overdue::Idle) {
                    closing_idle = None;
                }
            }
            () = sleep_until(due.map(|d| d.0)) => {
                // Still overdue (a request beginning, or a frame taken, would have moved it).
                let Some((at, why)) = activity.deadline(deadlines) else { continue };
                if closing_idle.is_some() && why == Overdue::Idle {
                    return;
                }
                if at > tokio::time::Instant::now() {
                    continue;
                }
                match why {
                    Overdue::Idle => {
                        metrics::counter!("approxy_connections_closed_total", "reason" => "idle")
                            .increment(1);
                        conn.as_mut().graceful_shutdown();
                        closing_idle = Some(tokio::time::Instant::now() + IDLE_CLOSE_GRACE);
                    }
                    Overdue::Unread => {
                        metrics::counter!("approxy_connections_closed_total", "reason" => "unread")
                            .increment(1);
                        tracing::warn!(
                            write_idle = ?deadlines.write_idle,
                            "the client stopped reading its response; dropping the connection"
                        );
                        return;
                    }
                }
            }
            _ = stopping.changed(), if !shutting_down => {
                shutting_down = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Sleeps until `t`, or for ever when there is none.
async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
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

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// The new policy serves every request from now.
    Applied,
    /// It serves, but these keys are read only at start-up: they keep their old values until
    /// the next start.
    AppliedUntilRestart(Vec<&'static str>),
    /// It was invalid, or would open a closed gateway: the running policy stays.
    Rejected,
}

impl Reloaded {
    /// Its `outcome` on `approxy_policy_reloads_total`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Reloaded::Applied => "applied",
            Reloaded::AppliedUntilRestart(_) => "restart_needed",
            Reloaded::Rejected => "rejected",
        }
    }
}

/// Validates the file and swaps the runtime in. Keys read only at start-up are not applied:
/// the log names them, so an operator who raised a limit knows it is not raised yet.
pub fn reload(state: &AppState, path: &Path) -> Reloaded {
    let mut at_next_start = Vec::new();
    let result = Policy::load(path).map_err(anyhow::Error::from).and_then(|mut p| {
        let old = state.runtime();
        if p.draft != old.policy.draft {
            at_next_start.push("[draft]");
            p.draft = old.policy.draft.clone();
        }
        at_next_start.extend(p.gateway.keep_start_up_keys(&old.policy.gateway));
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
    let reloaded = match result {
        Ok(rt) => {
            state.replace(rt);
            if at_next_start.is_empty() {
                tracing::info!(policy = %path.display(), "policy reloaded");
                Reloaded::Applied
            } else {
                let keys = at_next_start.join(", ");
                tracing::warn!(policy = %path.display(), %keys, "policy reloaded; these keys take effect at the next start");
                Reloaded::AppliedUntilRestart(at_next_start)
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "new policy rejected; keeping the running one");
            Reloaded::Rejected
        }
    };
    metrics::counter!("approxy_policy_reloads_total", "outcome" => reloaded.outcome()).increment(1);
    reloaded
}

/// Asks the current target how it scores windows: until it has said (it may still be
/// starting), again after a reload brings another target, and whenever its client moves to the
/// fallback (see the engine's `targets::token_in`); the answer goes on `/metrics`
/// as `approxy_target_window_route` and in one log line (the client's). Asked at start-up,
/// the first window of the first request is then priced at the route in use.
async fn watch_window_route(state: AppState) {
    // The target client asked last, and the route it gave (`None`: it scores no windows).
    let mut said: Option<(usize, Option<WindowRoute>)> = None;
    let mut every = tokio::time::interval(COUNTERS_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let rt = state.runtime();
        let target = rt.engine.target();
        // The client's address names it: a reload builds a new one. Once a client has said, it
        // answers from what it keeps, so asking again each tick costs nothing and sees a client
        // that moved to the fallback.
        let id = Arc::as_ptr(target).cast::<()>() as usize;
        let Ok(Ok(route)) =
            tokio::time::timeout(Duration::from_secs(30), target.window_route()).await
        else {
            continue;
        };
        if said == Some((id, route)) {
            continue;
        }
        if let Some((_, Some(old))) = said {
            route_gauge(old).set(0.0);
        }
        if let Some(r) = route {
            route_gauge(r).set(1.0);
        }
        said = Some((id, route));
    }
}

/// The gauge that says a window route is in use.
fn route_gauge(r: WindowRoute) -> metrics::Gauge {
    metrics::gauge!(
        "approxy_target_window_route",
        "endpoint" => r.endpoint,
        "reads_cache" => if r.reads_cache { "true" } else { "false" }
    )
}

/// How often a target's counters are read (the first time at once, so that a fresh gateway's
/// first requests are priced at what the target has counted, not at the prior, as soon as it
/// can be).
const COUNTERS_EVERY: Duration = Duration::from_secs(5);

/// Reads the current target's counters every [`COUNTERS_EVERY`] and teaches its meter what
/// they counted in between. A target whose kind has no counters, or whose counters cannot be
/// read (llama-server without `--metrics` answers 501), teaches it by its calls' timings.
async fn watch_counters(state: AppState) {
    let mut last: Option<(String, TargetCounters)> = None;
    let mut warned = false;
    let mut every = tokio::time::interval(COUNTERS_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let rt = state.runtime();
        let t = &rt.policy.target;
        let Some(url) = (t.kind.abilities().counters)(&t.base_url) else {
            last = None;
            continue;
        };
        let mut req = rt.http.get(&url).timeout(Duration::from_secs(5));
        if let Some(key) = &rt.target_key {
            req = req.bearer_auth(key);
        }
        let read = async {
            let text = req.send().await?.error_for_status()?.text().await?;
            Ok::<_, anyhow::Error>(TargetCounters::parse(&text)?)
        };
        match read.await {
            Ok(now) => {
                rt.meter.set_counted(true);
                if let Some((u, before)) = &last
                    && *u == url
                {
                    rt.meter.counted_since(&now.since(before));
                } else {
                    // A first reading, or another target's: the calls so far are not in it.
                    rt.meter.forget_pending();
                }
                last = Some((url, now));
                warned = false;
            }
            Err(e) => {
                rt.meter.set_counted(false);
                last = None;
                if !warned {
                    tracing::info!(url, error = %e, "the target's counters cannot be read: its time is learned from the calls that report it");
                    warned = true;
                }
            }
        }
    }
}
