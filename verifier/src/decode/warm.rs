//! The answer's prompt sent to the target's cache as the answer starts
//! ([`crate::targets::TargetClient::warm`]): the target computes it while the draft prefills
//! and writes, so the answer's first call computes only what was drafted. Without it that
//! first call computes the whole prompt while the stream waits (tests/README.md, "Warming the
//! slot": it pays where the target has cores of its own, and costs where it shares the draft's).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::FutureExt;
use tokio::task::JoinHandle;

use crate::error::TargetError;
use crate::targets::{Continuation, ContinuationRequest, TargetClient};

/// A warm in flight, on a task of its own so that it goes on while the answer's future waits
/// on the draft. Dropped unfinished (the answer ended or its client left), it is aborted,
/// which closes its connection and stops the target.
pub(super) struct WarmCall {
    handle: JoinHandle<Result<Option<Continuation>, TargetError>>,
    /// Set once the task has begun its call: one aborted before it sent nothing.
    started: Arc<AtomicBool>,
}

/// What a warm came to.
pub(super) enum Warmed {
    /// The target computed the prompt; its answer (timings, cached tokens).
    Done(Continuation),
    /// It had begun and not finished (the answer ended first): aborted. The target may have
    /// computed part of the prompt.
    Unfinished,
    /// Nothing was sent (the target had no place to warm), or it failed: the answer's first
    /// call computes the prompt, as without a warm, and meets any fault of the target itself.
    Nothing,
}

impl WarmCall {
    pub(super) fn start(target: Arc<dyn TargetClient>, req: ContinuationRequest) -> Self {
        let started = Arc::new(AtomicBool::new(false));
        let begun = started.clone();
        Self {
            handle: tokio::spawn(async move {
                begun.store(true, Ordering::SeqCst);
                target.warm(&req).await
            }),
            started,
        }
    }

    /// Waits for it to finish.
    pub(super) async fn finished(&mut self) -> Warmed {
        Self::outcome((&mut self.handle).await)
    }

    /// What it came to by now, aborting it if unfinished.
    pub(super) fn now(mut self) -> Warmed {
        match (&mut self.handle).now_or_never() {
            Some(out) => Self::outcome(out),
            None if self.started.load(Ordering::SeqCst) => Warmed::Unfinished,
            None => Warmed::Nothing,
        }
    }

    fn outcome(
        out: Result<Result<Option<Continuation>, TargetError>, tokio::task::JoinError>,
    ) -> Warmed {
        match out {
            Ok(Ok(Some(c))) => Warmed::Done(c),
            Ok(Ok(None)) => Warmed::Nothing,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "the warm of an answer's prompt failed");
                Warmed::Nothing
            }
            Err(_) => Warmed::Nothing,
        }
    }
}

impl Drop for WarmCall {
    fn drop(&mut self) {
        self.handle.abort();
    }
}
