//! Draft workers started on first need. A policy that passes every model through never runs
//! the draft, so it should not pay for it: each worker holds its own copy of the weights
//! (about 550 MiB for the int4 0.5B draft). The gateway starts the workers when a policy with
//! an approximate model is loaded, at start-up or on a reload, before that policy serves a
//! request; a request never waits for a load.

use std::sync::{Arc, Mutex, OnceLock};

use super::pool::DraftPool;
use super::{Draft, DraftConfig, DraftMeta, DraftWorkers};
use crate::error::EngineError;

/// A [`DraftPool`] that is started by [`DraftWorkers::ensure_started`], not by construction.
pub struct LazyDraftPool {
    cfg: DraftConfig,
    meta: DraftMeta,
    pool: OnceLock<Arc<DraftPool>>,
    /// Serialises starts, so two reloads at once do not load the model twice.
    starting: Mutex<()>,
}

impl LazyDraftPool {
    /// Reads the model's shape facts (a small file); loads nothing else.
    pub fn new(cfg: DraftConfig) -> Result<Self, EngineError> {
        let meta = DraftMeta::load(&cfg.model_dir)?;
        Ok(Self {
            cfg,
            meta,
            pool: OnceLock::new(),
            starting: Mutex::new(()),
        })
    }
}

impl DraftWorkers for LazyDraftPool {
    fn try_lease(&self) -> Option<Box<dyn Draft>> {
        self.pool.get()?.try_lease()
    }

    fn try_lease_for(&self, positions: usize) -> Option<Box<dyn Draft>> {
        self.pool.get()?.try_lease_for(positions)
    }

    fn streams(&self) -> usize {
        self.pool.get().map_or(0, |p| p.streams())
    }

    fn stream_limit(&self) -> usize {
        self.pool.get().map_or(0, |p| p.stream_limit())
    }

    fn meta(&self) -> &DraftMeta {
        &self.meta
    }

    fn workers(&self) -> usize {
        self.pool.get().map_or(0, |p| p.workers())
    }

    fn idle(&self) -> usize {
        self.pool.get().map_or(0, |p| p.idle())
    }

    fn alive(&self) -> usize {
        self.pool.get().map_or(0, |p| p.alive())
    }

    fn started(&self) -> bool {
        self.pool.get().is_some()
    }

    fn ensure_started(&self) -> Result<(), EngineError> {
        let _one_at_a_time = self.starting.lock().map_err(|_| EngineError::WorkerGone)?;
        if self.pool.get().is_none() {
            tracing::info!(workers = self.cfg.workers, model = %self.cfg.model_dir.display(), "starting the draft workers");
            let pool = DraftPool::start(&self.cfg)?;
            let _ = self.pool.set(pool);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &std::path::Path) -> DraftConfig {
        DraftConfig {
            model_dir: dir.to_path_buf(),
            onnxruntime_lib: dir.join("no-such-libonnxruntime.so"),
            workers: 2,
            threads_per_worker: 1,
            spin_wait: false,
            streams_per_worker: 4,
            min_stream_speed: 0.0,
            kv_bytes_per_worker: 1 << 30,
        }
    }

    #[test]
    fn nothing_is_loaded_until_asked() -> Result<(), EngineError> {
        let dir = tempfile::tempdir().map_err(|e| EngineError::Draft(e.to_string()))?;
        std::fs::write(
            dir.path().join("approxy_draft.json"),
            r#"{"num_hidden_layers":2,"num_key_value_heads":1,"head_dim":4,"hidden_size":8,"vocab_size":16,"eos_token":null}"#,
        )
        .map_err(|e| EngineError::Draft(e.to_string()))?;
        // No model and no runtime library: constructing must not touch either.
        let lazy = LazyDraftPool::new(config(dir.path()))?;
        assert!(!lazy.started());
        assert_eq!((lazy.workers(), lazy.idle(), lazy.alive()), (0, 0, 0));
        assert!(lazy.try_lease().is_none());
        assert_eq!(lazy.meta().vocab_size, 16);
        // Starting is where a missing model shows, and it leaves the pool unstarted.
        assert!(lazy.ensure_started().is_err());
        assert!(!lazy.started());
        Ok(())
    }
}
