//! The `approxy` binary: `serve`, `setup`, `check`.

mod setup;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "approxy", version, about = "Approximate-verification gateway for OpenAI-compatible LLM APIs")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Provide every model, binary and library approxy needs, under $APPROXY_HOME.
    Setup {
        /// Keep the (large) conversion venv after converting the draft model.
        #[arg(long)]
        keep_convert_env: bool,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Setup { keep_convert_env } => setup::Home::from_env()
            .and_then(|home| setup::run(&home, &setup::SetupOptions { keep_convert_env })),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
