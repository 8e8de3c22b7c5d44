//! A server process started on this machine for a check or a benchmark (llama-server, vLLM,
//! `approxy serve`): its output goes to a log file, it is awaited until a health path answers,
//! and it is killed when dropped, so an aborted run leaves nothing behind. It runs in a process
//! group of its own and the whole group is signalled: vLLM's API server starts an engine process
//! that starts a worker, and killing the server alone left both running (5.6 GB) after the
//! set-up's check.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use rustix::process::{Pid, Signal, kill_process_group};
use tokio::process::{Child, Command};

/// A running server process; killed on drop.
pub struct LocalServer {
    /// Root URL, e.g. `http://127.0.0.1:40123`.
    pub url: String,
    child: Child,
    pgid: Option<Pid>,
    log: PathBuf,
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.signal_group(Signal::KILL);
    }
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
            .process_group(0)
            .spawn()
            .with_context(|| format!("could not start {shown}"))?;
        let pgid = child.id().and_then(|id| Pid::from_raw(id as i32));
        Ok(Self {
            url,
            child,
            pgid,
            log,
        })
    }

    /// Process id (for memory readings).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// How the process ended, if it has.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Asks the process group to stop (SIGTERM), waits up to 15 s for the server, then kills
    /// whatever of the group is left.
    pub async fn stop(mut self) {
        self.signal_group(Signal::TERM);
        let _ = tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await;
        self.signal_group(Signal::KILL);
        let _ = self.child.wait().await;
        // Reaped: the id may be reused, so the drop must not signal it again.
        self.pgid = None;
    }

    fn signal_group(&self, signal: Signal) {
        // The group's id is the server's pid (process_group(0)); it outlives the server while
        // any of its children runs, so this reaches them after the server has exited too.
        if let Some(pgid) = self.pgid {
            let _ = kill_process_group(pgid, signal);
        }
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
            // Each probe is bounded too: a server that accepts and never answers must not hold
            // the wait past its limit.
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if http
                .get(format!("{}{path}", self.url))
                .timeout(left.min(Duration::from_secs(5)))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts a "server" that starts a child of its own, as vLLM does; returns it and the
    /// child's pid.
    async fn server_with_a_child(dir: &Path) -> (LocalServer, i32) {
        let pidfile = dir.join("child.pid");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("sleep 300 & echo $! > {}; wait", pidfile.display()));
        let server =
            LocalServer::start(cmd, "http://127.0.0.1:1".into(), dir.join("server.log")).unwrap();
        for _ in 0..200 {
            if let Some(pid) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                return (server, pid);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the server's child never started");
    }

    /// Whether `pid` runs (a zombie waiting for its reaper does not).
    fn runs(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
            .unwrap_or(false)
    }

    async fn gone(pid: i32) -> bool {
        for _ in 0..200 {
            if !runs(pid) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        false
    }

    #[tokio::test]
    async fn stopping_a_server_stops_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let (server, child) = server_with_a_child(dir.path()).await;
        assert!(runs(child));
        server.stop().await;
        assert!(gone(child).await, "the server's child {child} outlived it");
    }

    #[tokio::test]
    async fn a_server_that_accepts_and_never_answers_fails_the_wait_at_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        // Accepts connections (the kernel's backlog does) but never reads or answers.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", silent.local_addr().unwrap());
        let mut cmd = Command::new("sleep");
        cmd.arg("300");
        let mut server = LocalServer::start(cmd, url, dir.path().join("server.log")).unwrap();
        let waited = tokio::time::timeout(
            Duration::from_secs(3),
            server.wait_healthy("/health", Duration::from_secs(1)),
        )
        .await;
        server.stop().await;
        let waited = waited.expect("the wait outlasted its 1 s limit by more than 2 s");
        assert!(waited.is_err(), "a silent server counted as healthy");
    }

    #[tokio::test]
    async fn dropping_a_server_kills_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let (server, child) = server_with_a_child(dir.path()).await;
        drop(server);
        assert!(gone(child).await, "the server's child {child} outlived it");
    }
}
