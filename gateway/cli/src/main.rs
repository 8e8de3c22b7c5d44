//! The `approxy` binary: `serve`, `check`, `setup`, `train`, `bench`. Arguments and
//! dispatch are in `cli`; the work is done by the library crates.

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
