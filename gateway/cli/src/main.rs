//! The `approxy` binary: `serve`, `check`, `setup`, `train`, `bench`. The work is done by
//! the library crates.
//!
//! Layout:
//! - `cli`: the argument definitions and the dispatch of the serving commands to
//!   `approxy-gateway` (serve, check, health).
//! - `tools` (feature `tools`, on by default): set-up, training and benchmarks
//!   (`approxy-setup`, `approxy-training`, `approxy-bench`); a server build leaves them out.
//! - `runtime`: `block_on`, the tokio runtime both run their commands on.

mod cli;
mod runtime;
#[cfg(feature = "tools")]
mod tools;

use clap::Parser;

/// mimalloc rather than glibc's allocator: glibc keeps what a burst of large requests freed in
/// its per-thread arenas, so the gateway's memory stayed near its peak after one (821 MiB from
/// 427 in the attack soak), where mimalloc gives it back.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    match cli::dispatch(cli::Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
