//! Draft workers. Each worker is an OS thread that owns one [`DraftSession`] and drafts for
//! several requests at once ([`Batch`]): every sequence it holds moves one step per ONNX
//! call, and sequences join and leave between steps. The async side talks to it over a
//! bounded channel and gets answers on oneshot channels, so inference never blocks the async
//! runtime. A request leases one stream of one worker for its whole generation; when no
//! worker can take another stream (its limit, its measured speed against the policy's floor,
//! or its cache's memory), `try_lease` says so at once and the gateway passes through instead
//! of queueing.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

use async_trait::async_trait;

use super::batch::{Batch, Extend, Rows, SeqId};
use super::capacity::StepTimes;
use super::gather::Gather;
use super::session::DraftSession;
use super::{Draft, DraftConfig, DraftMeta, DraftWorkers, PositionOutput};
use crate::error::EngineError;

enum Op {
    Prefill(Vec<u32>),
    Extend(Vec<u32>, bool),
    Rollback(usize),
    /// Sent when a lease ends: the sequence leaves the batch.
    Close,
    /// Panics inside the worker (tests of the recovery).
    #[cfg(feature = "testing")]
    Panic,
}

type Reply = oneshot::Sender<Result<Vec<PositionOutput>, EngineError>>;

struct Job {
    seq: SeqId,
    op: Op,
    reply: Reply,
    /// When the call was made: how soon a stream asks again after its answer, whenever the
    /// worker sees the ask.
    asked: Instant,
}

/// What a worker shares with the leases: its load and its measured speed.
#[derive(Debug, Default)]
struct Load {
    /// Streams leased.
    live: AtomicUsize,
    /// Whether the thread is running.
    alive: AtomicBool,
    /// Step times per batch width.
    times: Mutex<StepTimes>,
    /// Positions each leased stream may reach (prompt and answer), for the memory bound.
    reserved: Mutex<HashMap<SeqId, usize>>,
    /// Rows the decode steps ran, and how many of them a stream had asked for: the rest
    /// carried filler for a stream of the batch that was not back in time.
    rows_stepped: AtomicU64,
    rows_asked: AtomicU64,
}

struct Worker {
    tx: SyncSender<Job>,
    load: Arc<Load>,
}

/// What every worker admits.
#[derive(Debug, Clone, Copy)]
struct Limits {
    streams: usize,
    floor: f64,
    kv_bytes: usize,
    bytes_per_position: usize,
    /// Whether each worker measures its batch widths before its first stream (see
    /// [`probe`]); only a floor reads them.
    probe: bool,
}

/// The set of draft workers.
pub struct DraftPool {
    workers: Arc<Vec<Worker>>,
    limits: Limits,
    next_seq: AtomicU64,
    meta: DraftMeta,
}

impl std::fmt::Debug for DraftPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftPool")
            .field("workers", &self.workers.len())
            .field("limits", &self.limits)
            .finish()
    }
}

impl DraftPool {
    /// Starts the workers and waits until every one has loaded its session.
    pub fn start(cfg: &DraftConfig) -> Result<Arc<Self>, EngineError> {
        let meta = DraftMeta::load(&cfg.model_dir)?;
        let streams = cfg.streams_per_worker.max(1);
        let make = |_: usize| {
            let (lib, dir, m, threads, spin) = (
                cfg.onnxruntime_lib.clone(),
                cfg.model_dir.clone(),
                meta.clone(),
                cfg.threads_per_worker.max(1),
                cfg.spin_wait,
            );
            move || DraftSession::load(&lib, &dir, m, threads, spin)
        };
        let bytes_per_position = 2
            * meta.num_hidden_layers
            * meta.num_key_value_heads
            * meta.head_dim
            * std::mem::size_of::<f32>();
        let limits = Limits {
            streams,
            floor: cfg.min_stream_speed,
            kv_bytes: cfg.kv_bytes_per_worker,
            bytes_per_position,
            probe: cfg.min_stream_speed > 0.0 && streams > 1,
        };
        let shape = meta.clone();
        Self::start_with(cfg.workers.max(1), make, limits, shape)
    }

    fn start_with<M, F>(
        workers: usize,
        make: impl Fn(usize) -> F,
        limits: Limits,
        meta: DraftMeta,
    ) -> Result<Arc<Self>, EngineError>
    where
        M: Rows + 'static,
        F: FnOnce() -> Result<M, EngineError> + Send + 'static,
    {
        let mut started = Vec::new();
        let mut ready = Vec::new();
        for i in 0..workers {
            // Each stream has at most one call and its close in flight: never full.
            let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(2 * limits.streams + 2);
            let (rtx, rrx) = std::sync::mpsc::channel();
            let load = Arc::new(Load::default());
            let (l, build) = (Arc::clone(&load), make(i));
            let (streams, measure) = (limits.streams, limits.probe);
            std::thread::Builder::new()
                .name(format!("draft-worker-{i}"))
                .spawn(move || match build() {
                    Ok(model) => {
                        let mut batch = Batch::new(model, streams);
                        if measure {
                            probe(&mut batch, &l, streams);
                        }
                        l.alive.store(true, Ordering::SeqCst);
                        let _ = rtx.send(Ok(()));
                        worker_loop(batch, &rx, &l);
                        l.alive.store(false, Ordering::SeqCst);
                    }
                    Err(e) => {
                        let _ = rtx.send(Err(e));
                    }
                })
                .map_err(|e| EngineError::Draft(format!("cannot start worker thread: {e}")))?;
            started.push(Worker { tx, load });
            ready.push(rrx);
        }
        for r in ready {
            r.recv().map_err(|_| EngineError::WorkerGone)??;
        }
        Ok(Arc::new(Self {
            workers: Arc::new(started),
            limits,
            next_seq: AtomicU64::new(1),
            meta,
        }))
    }

    /// Each stream's draft speed, tokens a second, that worker `i` has measured with `live`
    /// streams stepping together (see [`StepTimes::speed`]).
    pub fn speed(&self, i: usize, live: usize) -> Option<f64> {
        self.workers.get(i)?.load.times.lock().ok()?.speed(live)
    }

    /// Rows the workers' decode steps ran, and how many of them streams had asked for.
    pub fn rows(&self) -> (u64, u64) {
        self.workers.iter().fold((0, 0), |(s, a), w| {
            (
                s + w.load.rows_stepped.load(Ordering::Relaxed),
                a + w.load.rows_asked.load(Ordering::Relaxed),
            )
        })
    }

    /// Whether worker `w` can take one more stream reaching `positions` positions.
    fn admits(&self, w: &Worker, live: usize, positions: usize) -> bool {
        let l = &self.limits;
        if !w.load.alive.load(Ordering::SeqCst) || live >= l.streams {
            return false;
        }
        let fast_enough = w.load.times.lock().is_ok_and(|t| t.admits(live, l.floor));
        // The batch's cache holds a row per stream, each as long as the longest stream's.
        let longest = w
            .load
            .reserved
            .lock()
            .map(|r| r.values().copied().max().unwrap_or(0))
            .unwrap_or(usize::MAX);
        let bytes = (live + 1)
            .saturating_mul(longest.max(positions))
            .saturating_mul(l.bytes_per_position);
        // One stream alone is always let in: the cache would hold it without the batch.
        fast_enough && (live == 0 || bytes <= l.kv_bytes)
    }
}

impl DraftWorkers for DraftPool {
    fn try_lease(&self) -> Option<Box<dyn Draft>> {
        self.try_lease_for(0)
    }

    fn try_lease_for(&self, positions: usize) -> Option<Box<dyn Draft>> {
        // The least loaded worker that admits one more; a race with another lease is retried.
        for _ in 0..8 {
            let (idx, live) = self
                .workers
                .iter()
                .enumerate()
                .map(|(i, w)| (i, w.load.live.load(Ordering::SeqCst)))
                .filter(|&(i, live)| self.admits(&self.workers[i], live, positions))
                .min_by_key(|&(_, live)| live)?;
            let load = &self.workers[idx].load;
            if load
                .live
                .compare_exchange(live, live + 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut r) = load.reserved.lock() {
                    r.insert(seq, positions);
                }
                return Some(Box::new(DraftLease {
                    workers: Arc::clone(&self.workers),
                    idx,
                    seq,
                }));
            }
        }
        None
    }

    fn meta(&self) -> &DraftMeta {
        &self.meta
    }

    fn workers(&self) -> usize {
        self.workers.len()
    }

    fn idle(&self) -> usize {
        self.workers
            .iter()
            .filter(|w| w.load.live.load(Ordering::SeqCst) == 0)
            .count()
    }

    fn alive(&self) -> usize {
        self.workers
            .iter()
            .filter(|w| w.load.alive.load(Ordering::SeqCst))
            .count()
    }

    fn streams(&self) -> usize {
        self.workers
            .iter()
            .map(|w| w.load.live.load(Ordering::SeqCst))
            .sum()
    }

    fn stream_limit(&self) -> usize {
        self.workers.len() * self.limits.streams
    }
}

impl DraftPool {
    /// Makes a worker panic in the middle of a job, as a bug in inference would (tests of the
    /// recovery); the call's error.
    #[cfg(feature = "testing")]
    pub async fn inject_panic(&self) -> Result<(), EngineError> {
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        let lease = DraftLease {
            workers: Arc::clone(&self.workers),
            idx: 0,
            seq,
        };
        self.workers[0].load.live.fetch_add(1, Ordering::SeqCst);
        lease.call(Op::Panic).await.map(|_| ())
    }
}

/// One stream of one worker; it leaves the batch when dropped.
pub struct DraftLease {
    workers: Arc<Vec<Worker>>,
    idx: usize,
    seq: SeqId,
}

impl DraftLease {
    async fn call(&self, op: Op) -> Result<Vec<PositionOutput>, EngineError> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            seq: self.seq,
            op,
            reply,
            asked: Instant::now(),
        };
        match self.workers[self.idx].tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(EngineError::Saturated),
            Err(TrySendError::Disconnected(_)) => return Err(EngineError::WorkerGone),
        }
        rx.await.map_err(|_| EngineError::WorkerGone)?
    }
}

#[async_trait]
impl Draft for DraftLease {
    async fn prefill(&self, prompt: Vec<u32>) -> Result<PositionOutput, EngineError> {
        self.call(Op::Prefill(prompt))
            .await?
            .pop()
            .ok_or(EngineError::WorkerGone)
    }

    async fn extend(
        &self,
        tokens: Vec<u32>,
        all: bool,
    ) -> Result<Vec<PositionOutput>, EngineError> {
        self.call(Op::Extend(tokens, all)).await
    }

    async fn rollback(&self, n: usize) -> Result<(), EngineError> {
        self.call(Op::Rollback(n)).await.map(|_| ())
    }
}

/// Cache positions an idle worker keeps for the next prompt to reuse (about 50 MB for the
/// 0.5B draft's 24.6 KB per position); the rest is freed when its last stream leaves.
pub const IDLE_KV_POSITIONS: usize = 2048;

impl Drop for DraftLease {
    fn drop(&mut self) {
        let w = &self.workers[self.idx];
        // Queued behind this stream's own calls, so the worker sees them first.
        let (reply, _) = oneshot::channel();
        let _ = w.tx.try_send(Job {
            seq: self.seq,
            op: Op::Close,
            reply,
            asked: Instant::now(),
        });
        if let Ok(mut r) = w.load.reserved.lock() {
            r.remove(&self.seq);
        }
        w.load.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The worker: takes what is queued, waits briefly for the streams of the last step that keep
/// pace (see [`Gather`]), runs the cheap calls at once, one prefill, then one batched step for
/// every extend.
fn worker_loop<M: Rows>(mut batch: Batch<M>, rx: &Receiver<Job>, load: &Load) {
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut stepped: Vec<SeqId> = Vec::new();
    let mut stepped_at = Instant::now();
    let mut gather = Gather::default();
    loop {
        if queue.is_empty() {
            match rx.recv() {
                Ok(j) => take(&mut queue, &mut gather, j),
                Err(_) => return,
            }
        }
        let deadline = stepped_at + gather.wait();
        loop {
            for j in rx.try_iter() {
                take(&mut queue, &mut gather, j);
            }
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_cheap(&mut batch, &mut queue);
            }));
            if run.is_err() {
                recover(&mut batch, &mut queue);
            }
            let waiting = stepped.iter().any(|s| {
                batch.holds(*s) && gather.waits_for(*s) && !queue.iter().any(|j| j.seq == *s)
            });
            let now = Instant::now();
            if !waiting || now >= deadline {
                break;
            }
            match rx.recv_timeout(deadline - now) {
                Ok(j) => take(&mut queue, &mut gather, j),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_prefill(&mut batch, &mut queue);
            run_step(&mut batch, &mut queue, load)
        }));
        match run {
            Ok(Some(s)) => {
                stepped_at = Instant::now();
                let step_ms = load
                    .times
                    .lock()
                    .ok()
                    .and_then(|t| t.predict(batch.width()));
                gather.keep(|q| batch.holds(q));
                gather.answered(&s, stepped_at, Gather::wait_after(step_ms, batch.width()));
                stepped = s;
            }
            Ok(None) => {}
            Err(_) => recover(&mut batch, &mut queue),
        }
        if batch.live() == 0 && queue.is_empty() {
            batch.trim(IDLE_KV_POSITIONS);
        }
    }
}

/// Queues `job`, noting how soon its stream asked again (see [`Gather::asked`]).
fn take(queue: &mut VecDeque<Job>, gather: &mut Gather, job: Job) {
    if matches!(job.op, Op::Extend(..) | Op::Rollback(_)) {
        gather.asked(job.seq, job.asked);
    }
    queue.push_back(job);
}

/// Rollbacks and closes, which compute nothing, and calls whose caller has gone.
fn run_cheap<M: Rows>(batch: &mut Batch<M>, queue: &mut VecDeque<Job>) {
    let mut keep = VecDeque::with_capacity(queue.len());
    while let Some(job) = queue.pop_front() {
        match job.op {
            Op::Rollback(n) => {
                let _ = job
                    .reply
                    .send(batch.rollback(job.seq, n).map(|()| Vec::new()));
            }
            Op::Close => {
                if let Err(e) = batch.close(job.seq) {
                    tracing::error!(error = %e, "a draft worker lost its batch's rows");
                }
            }
            #[cfg(feature = "testing")]
            #[allow(clippy::panic)]
            Op::Panic => panic!("injected draft worker panic"),
            // Whoever asked has gone (client disconnected): skip the inference entirely.
            _ if job.reply.is_closed() => {}
            _ => keep.push_back(job),
        }
    }
    *queue = keep;
}

/// The oldest prefill in the queue, alone (one a round, so the streams already drafting
/// wait for one prompt at most between their steps).
fn run_prefill<M: Rows>(batch: &mut Batch<M>, queue: &mut VecDeque<Job>) {
    let Some(i) = queue.iter().position(|j| matches!(j.op, Op::Prefill(_))) else {
        return;
    };
    let Some(job) = queue.remove(i) else {
        return;
    };
    if let Op::Prefill(prompt) = job.op {
        let reply = job.reply;
        let gone = || reply.is_closed();
        let out = batch.prefill(job.seq, &prompt, &gone).map(|o| vec![o]);
        let _ = reply.send(out);
    }
}

/// One batched run of every queued extend (the oldest of each stream); the streams in it.
fn run_step<M: Rows>(
    batch: &mut Batch<M>,
    queue: &mut VecDeque<Job>,
    load: &Load,
) -> Option<Vec<SeqId>> {
    let mut jobs = Vec::new();
    let mut rest = VecDeque::with_capacity(queue.len());
    while let Some(job) = queue.pop_front() {
        let first =
            matches!(job.op, Op::Extend(..)) && !jobs.iter().any(|j: &Job| j.seq == job.seq);
        if first {
            jobs.push(job);
        } else {
            rest.push_back(job);
        }
    }
    *queue = rest;
    if jobs.is_empty() {
        return None;
    }
    let asks: Vec<Extend<'_>> = jobs
        .iter()
        .filter_map(|j| match &j.op {
            Op::Extend(tokens, all) => Some(Extend {
                seq: j.seq,
                tokens,
                all: *all,
            }),
            _ => None,
        })
        .collect();
    let single = asks.iter().all(|a| a.tokens.len() == 1);
    let results = timed_extend(batch, &asks, load, single);
    metrics::histogram!("approxy_draft_step_streams").record(asks.len() as f64);
    if single {
        let idle = batch.width().saturating_sub(asks.len());
        load.rows_stepped
            .fetch_add(batch.width() as u64, Ordering::Relaxed);
        load.rows_asked
            .fetch_add(asks.len() as u64, Ordering::Relaxed);
        metrics::counter!("approxy_draft_idle_rows_total").increment(idle as u64);
    }
    let seqs = jobs.iter().map(|j| j.seq).collect();
    for (job, r) in jobs.into_iter().zip(results) {
        let _ = job.reply.send(r);
    }
    Some(seqs)
}

/// One batched run of `asks`; when `record`, its time goes into the worker's step times at the
/// batch's width (the decode steps of one token a row, which set a stream's speed).
fn timed_extend<M: Rows>(
    batch: &mut Batch<M>,
    asks: &[Extend<'_>],
    load: &Load,
    record: bool,
) -> Vec<Result<Vec<PositionOutput>, EngineError>> {
    let started = Instant::now();
    let results = batch.extend(asks);
    if record && let Ok(mut t) = load.times.lock() {
        let took = started.elapsed();
        t.record(batch.width(), took);
        t.record_share(batch.width(), batch.live(), took);
    }
    results
}

/// Tokens of the probe's prompt: short, so that it measures what the widths cost apart from
/// the context (the running means then follow the real contexts).
const PROBE_PROMPT: u32 = 32;
/// Timed steps at each width, after one that lays the batch out.
const PROBE_STEPS: usize = 2;

/// Before its first stream, a worker steps a batch of each width of
/// [`StepTimes::probe_widths`] and records the times: without them admission prices a width
/// it has not stepped as a whole step a row, the most a row can cost, and so refuses streams
/// that would run well above the floor (on this draft a row adds a quarter to a third of one alone).
/// Prompts are the same filler for every row: the first prefill is the only one computed.
fn probe<M: Rows>(batch: &mut Batch<M>, load: &Load, streams: usize) {
    let widths = StepTimes::probe_widths(streams);
    let widest = widths.last().copied().unwrap_or(1);
    let prompt: Vec<u32> = (0..PROBE_PROMPT).collect();
    let seqs: Vec<SeqId> = (0..widest as u64).map(|i| u64::MAX - i).collect();
    let started = Instant::now();
    let ok = seqs
        .iter()
        .all(|&s| batch.prefill(s, &prompt, &|| false).is_ok());
    let token = [PROBE_PROMPT];
    for &w in widths.iter().filter(|_| ok) {
        let asks: Vec<Extend<'_>> = seqs[..w]
            .iter()
            .map(|&seq| Extend {
                seq,
                tokens: &token,
                all: false,
            })
            .collect();
        for i in 0..=PROBE_STEPS {
            if timed_extend(batch, &asks, load, i > 0)
                .iter()
                .any(Result::is_err)
            {
                break;
            }
        }
    }
    for s in seqs {
        let _ = batch.close(s);
    }
    // The probe's prompt is no one's prefix.
    batch.trim(0);
    tracing::info!(
        widths = ?widths,
        ms = started.elapsed().as_millis() as u64,
        "draft worker measured its batch widths"
    );
}

/// After a panic: every queued call fails, the batch starts over, the worker stays.
fn recover<M: Rows>(batch: &mut Batch<M>, queue: &mut VecDeque<Job>) {
    batch.reset();
    for job in queue.drain(..) {
        let _ = job.reply.send(Err(EngineError::Draft(
            "the draft worker failed on this request".into(),
        )));
    }
    metrics::counter!("approxy_draft_worker_panics_total").increment(1);
    tracing::error!("a draft worker panicked; its batch was reset and it carries on");
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
