//! The command line: the serving commands (`serve`, `check`, `health`, all from
//! `approxy-gateway`), and with the `tools` feature the tools beside them (`tools.rs`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use approxy_gateway::{policy, server, telemetry};

use crate::runtime::block_on;

#[derive(Parser)]
#[command(
    name = "approxy",
    version,
    about = "Approximate-verification gateway for OpenAI-compatible LLM APIs"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the OpenAI-compatible API.
    Serve {
        /// Policy file.
        #[arg(long, default_value = "policies/default.toml", env = "APPROXY_POLICY")]
        policy: PathBuf,
        /// Address to listen on (port 0 picks a free port).
        #[arg(long, default_value = "127.0.0.1:8080", env = "APPROXY_LISTEN")]
        listen: SocketAddr,
        /// Draft workers (overrides the policy).
        #[arg(long)]
        workers: Option<usize>,
    },
    /// Exit 0 when a running gateway answers 2xx (the container image's health check).
    Health {
        /// URL to ask (default: /health on the address APPROXY_LISTEN names, loopback for
        /// 0.0.0.0, else 127.0.0.1:8080).
        #[arg(long, env = "APPROXY_HEALTH_URL")]
        url: Option<String>,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 3)]
        timeout_secs: u64,
    },
    /// Print the JSON Schema of policy files (committed as policies/policy.schema.json).
    Schema,
    /// Validate a policy file; exits non-zero listing every problem.
    Check {
        /// Policy file.
        #[arg(long)]
        policy: PathBuf,
    },
    #[cfg(feature = "tools")]
    #[command(flatten)]
    Tools(crate::tools::ToolCmd),
}

/// Runs the command.
pub fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Cmd::Check { policy } => policy::check(&policy),
        Cmd::Schema => policy::print_schema(),
        Cmd::Health { url, timeout_secs } => block_on(approxy_gateway::probe::probe(
            &url.unwrap_or_else(|| {
                approxy_gateway::probe::health_url(std::env::var("APPROXY_LISTEN").ok().as_deref())
            }),
            Duration::from_secs(timeout_secs),
        )),
        Cmd::Serve {
            policy,
            listen,
            workers,
        } => {
            telemetry::install_logging();
            block_on(server::serve(server::ServeOptions {
                policy,
                listen,
                workers,
            }))
        }
        #[cfg(feature = "tools")]
        Cmd::Tools(cmd) => crate::tools::dispatch(cmd),
    }
}
