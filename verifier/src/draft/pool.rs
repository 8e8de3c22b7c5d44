//! Draft workers. Each worker is an OS thread that owns one [`DraftSession`]; the async side
//! talks to it over a bounded channel and gets answers on oneshot channels, so inference
//! never blocks the async runtime. A request leases one worker for its whole generation
//! (the worker holds that sequence's KV cache); when no worker is free, `try_lease` says so
//! at once and the gateway degrades to passthrough instead of queueing.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use async_trait::async_trait;

use super::session::DraftSession;
use super::{Draft, DraftConfig, DraftMeta, DraftWorkers, PositionOutput};
use crate::error::EngineError;

enum Op {
    Prefill(Vec<u32>),
    Extend(Vec<u32>, bool),
    Rollback(usize),
    /// Sent when a lease ends: bound what the idle worker keeps.
    Trim(usize),
    /// Panics inside the worker (tests of the recovery).
    #[cfg(feature = "testing")]
    Panic,
}

struct Job {
    op: Op,
    reply: oneshot::Sender<Result<Vec<PositionOutput>, EngineError>>,
}

/// The set of draft workers.
pub struct DraftPool {
    workers: Arc<Workers>,
    meta: DraftMeta,
}

/// What a lease needs to reach its worker and give it back.
struct Workers {
    senders: Vec<mpsc::Sender<Job>>,
    free: Mutex<Vec<usize>>,
}

impl std::fmt::Debug for DraftPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftPool")
            .field("workers", &self.workers.senders.len())
            .finish()
    }
}

impl DraftPool {
    /// Starts the workers and waits until every one has loaded its session.
    pub fn start(cfg: &DraftConfig) -> Result<Arc<Self>, EngineError> {
        let meta = DraftMeta::load(&cfg.model_dir)?;
        let mut senders = Vec::new();
        let mut ready = Vec::new();
        for i in 0..cfg.workers.max(1) {
            let (tx, rx) = mpsc::channel::<Job>(4);
            let (rtx, rrx) = std::sync::mpsc::channel();
            let (lib, dir, m, threads, spin) = (
                cfg.onnxruntime_lib.clone(),
                cfg.model_dir.clone(),
                meta.clone(),
                cfg.threads_per_worker.max(1),
                cfg.spin_wait,
            );
            std::thread::Builder::new()
                .name(format!("draft-worker-{i}"))
                .spawn(
                    move || match DraftSession::load(&lib, &dir, m, threads, spin) {
                        Ok(session) => {
                            let _ = rtx.send(Ok(()));
                            worker_loop(session, rx);
                        }
                        Err(e) => {
                            let _ = rtx.send(Err(e));
                        }
                    },
                )
                .map_err(|e| EngineError::Draft(format!("cannot start worker thread: {e}")))?;
            senders.push(tx);
            ready.push(rrx);
        }
        for r in ready {
            r.recv().map_err(|_| EngineError::WorkerGone)??;
        }
        let free = Mutex::new((0..senders.len()).rev().collect());
        Ok(Arc::new(Self {
            workers: Arc::new(Workers { senders, free }),
            meta,
        }))
    }
}

impl DraftWorkers for DraftPool {
    fn try_lease(&self) -> Option<Box<dyn Draft>> {
        let mut free = self.workers.free.lock().ok()?;
        // A worker whose thread has ended is dropped from the free list for good.
        free.retain(|&i| !self.workers.senders[i].is_closed());
        let idx = free.pop()?;
        Some(Box::new(DraftLease {
            workers: Arc::clone(&self.workers),
            idx,
        }))
    }

    fn meta(&self) -> &DraftMeta {
        &self.meta
    }

    fn workers(&self) -> usize {
        self.workers.senders.len()
    }

    fn idle(&self) -> usize {
        self.workers.free.lock().map(|f| f.len()).unwrap_or(0)
    }

    fn alive(&self) -> usize {
        self.workers
            .senders
            .iter()
            .filter(|s| !s.is_closed())
            .count()
    }
}

impl DraftPool {
    /// Makes an idle worker panic in the middle of a job, as a bug in inference would (tests
    /// of the recovery); the call's error.
    #[cfg(feature = "testing")]
    pub async fn inject_panic(&self) -> Result<(), EngineError> {
        let idx = self
            .workers
            .free
            .lock()
            .ok()
            .and_then(|mut f| f.pop())
            .ok_or(EngineError::Saturated)?;
        let lease = DraftLease {
            workers: Arc::clone(&self.workers),
            idx,
        };
        lease.call(Op::Panic).await.map(|_| ())
    }
}

/// Exclusive use of one worker; returned to the pool on drop.
pub struct DraftLease {
    workers: Arc<Workers>,
    idx: usize,
}

impl DraftLease {
    async fn call(&self, op: Op) -> Result<Vec<PositionOutput>, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.workers.senders[self.idx]
            .send(Job { op, reply })
            .await
            .map_err(|_| EngineError::WorkerGone)?;
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
/// 0.5B draft's 24.6 KB per position); the rest is freed when a lease ends.
pub const IDLE_KV_POSITIONS: usize = 2048;

impl Drop for DraftLease {
    fn drop(&mut self) {
        // Queued before the worker is free again, so the next lease's work comes after it.
        let (reply, _) = oneshot::channel();
        let _ = self.workers.senders[self.idx].try_send(Job {
            op: Op::Trim(IDLE_KV_POSITIONS),
            reply,
        });
        if let Ok(mut f) = self.workers.free.lock() {
            f.push(self.idx);
        }
    }
}

fn worker_loop(mut session: DraftSession, mut rx: mpsc::Receiver<Job>) {
    while let Some(job) = rx.blocking_recv() {
        // Whoever asked has gone (client disconnected): skip the inference entirely.
        if job.reply.is_closed() && !matches!(job.op, Op::Trim(_)) {
            continue;
        }
        // A panic in one job must not take the worker down with it (the pool would go on
        // handing out a dead worker): the job fails, the session starts over, the worker stays.
        let reply = job.reply;
        let gone = || reply.is_closed();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match job.op {
            Op::Prefill(p) => session.prefill(&p, &gone).map(|o| vec![o]),
            Op::Extend(t, all) => session.extend(&t, all, &gone),
            Op::Rollback(n) => {
                session.rollback(n);
                Ok(Vec::new())
            }
            Op::Trim(n) => {
                session.trim(n);
                Ok(Vec::new())
            }
            #[cfg(feature = "testing")]
            #[allow(clippy::panic)]
            Op::Panic => panic!("injected draft worker panic"),
        }));
        let result = run.unwrap_or_else(|_| {
            session.reset();
            metrics::counter!("approxy_draft_worker_panics_total").increment(1);
            tracing::error!("a draft worker panicked; its session was reset and it carries on");
            Err(EngineError::Draft(
                "the draft worker failed on this request".into(),
            ))
        });
        let _ = reply.send(result);
    }
}
