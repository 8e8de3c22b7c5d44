//! The `approxy` binary: `serve`, `check`, `setup`, `train`, `bench`. The work is done by
//! the library crates.
//!
//! Layout:
//! - `cli`: the argument definitions and the dispatch to `approxy-gateway` (serve, check),
//!   `approxy-setup`, `approxy-training` and `approxy-bench`.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    match cli::dispatch(cli::Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
