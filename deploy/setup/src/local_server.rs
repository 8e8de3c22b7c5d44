//! A server process started on this machine for a check or a benchmark (llama-server, vLLM,
//! `approxy serve`): its output goes to a log file, it is awaited until a health path answers,
//! and it is killed when dropped, so an aborted run leaves nothing behind.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

/// A running server process; killed on drop.
pub struct LocalServer {
    /// Root URL, e.g. `http://127.0.0.1:40123`.
    pub url: String,
    child: Child,
    log: PathBuf,
}

impl LocalServer {
    /// Starts `cmd` with stdout and stderr in `log` (created afresh); does not wait.
    pub fn start(mut cmd: Command, url: String, log: PathBuf) -> anyhow::Result<Self> {
        let (out, err) = crate::process::log_handles(&log, false)?;
        let shown = format!("{cmd:?}");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("could not start {shown}"))?;
        Ok(Self { url, child, log })
    }

    /// Process id (for memory readings).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// How the process ended, if it has.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Stops the process and waits for it.
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// Waits until `GET {url}{path}` answers 2xx; fails with the log's tail when the process
    /// exits first or `limit` passes.
    pub async fn wait_healthy(&mut self, path: &str, limit: Duration) -> anyhow::Result<()> {
        let http = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited ({status}) before it was ready; log {}:\n{}",
                    self.url,
                    self.log.display(),
                    log_tail(&self.log)
                );
            }
            if http
                .get(format!("{}{path}", self.url))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        bail!(
            "{} was not ready after {limit:?}; log {}:\n{}",
            self.url,
            self.log.display(),
            log_tail(&self.log)
        )
    }
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// An unused loopback port.
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}
