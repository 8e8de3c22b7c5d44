//! The process's allocator: mimalloc, for Rust and, through its `override` feature, for ONNX
//! Runtime's `malloc` as well.
//!
//! Why mimalloc: glibc keeps what a burst of large requests freed in its per-thread arenas (the
//! gateway stayed far above its starting memory after an attack soak), and it keeps the batch
//! KV caches ONNX Runtime frees each time a stream joins or leaves the draft's batch (more than
//! twice the cache itself resident per concurrent stream).
//!
//! Why purge at once: mimalloc returns freed memory to the system only a second after the
//! free, and then only at a later allocation, so an idle gateway kept holding what a burst of
//! 4 MiB prompts freed. Purged at once, it held none, and the draft's steps measured no slower
//! (see tests/README.md, "Many streams at once", and "Soak").
//!
//! The only `unsafe` in the workspace lives here (the house test `unsafe_code_is_only_here`).

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay`: its place in `mi_option_e` (mimalloc.h), which the sys
/// crate names only for mimalloc v2. The test below checks the place by its default.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// The environment variable by which an operator sets the delay instead (mimalloc reads it at
/// load).
const PURGE_DELAY_ENV: &str = "MIMALLOC_PURGE_DELAY";

/// Makes freed memory go back to the system at once, unless the operator set the delay.
pub fn purge_freed_memory_at_once() {
    if std::env::var_os(PURGE_DELAY_ENV).is_some() {
        return;
    }
    // SAFETY: `mi_option_set` writes one entry of mimalloc's option table, which every
    // allocation reads afresh; the index is in range (checked by the test below) and the value
    // is one mimalloc documents ("use 0 for immediate purging").
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(PURGE_DELAY, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option at `PURGE_DELAY` is the purge delay: it holds mimalloc v3's default of
    /// 1,000 ms (no other option does), and the setting takes.
    #[test]
    fn the_option_set_is_the_purge_delay() {
        if std::env::var_os(PURGE_DELAY_ENV).is_some() {
            return;
        }
        #[allow(unsafe_code)]
        // SAFETY: reads one entry of the option table; the index is below `_mi_option_last`.
        let get = || unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) };
        assert_eq!(get(), 1000);
        purge_freed_memory_at_once();
        assert_eq!(get(), 0);
    }
}
