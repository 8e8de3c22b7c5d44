//! The `approxy` binary: `serve`, `check`, `setup`, `train`, `bench`. The work is done by
//! the library crates.
//!
//! Layout:
//! - `cli`: the argument definitions and the dispatch of the serving commands to
//!   `approxy-gateway` (serve, check, health).
//! - `tools` (feature `tools`, on by default): set-up, training and benchmarks
//!   (`approxy-setup`, `approxy-training`, `approxy-bench`); a server build leaves them out.
//! - `allocator`: mimalloc for the whole process, ONNX Runtime included.
//! - `runtime`: `block_on`, the tokio runtime both run their commands on.

mod allocator;
mod cli;
mod runtime;
#[cfg(feature = "tools")]
mod tools;

use clap::Parser;

fn main() -> std::process::ExitCode {
    allocator::purge_freed_memory_at_once();
    match cli::dispatch(cli::Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
