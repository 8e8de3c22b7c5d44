//! Running the external tools setup needs (python, pip, cmake) with their output captured
//! in a log file, so a failure reports the tail of what went wrong instead of a bare status.

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// A log file for a process's stdout and stderr (one handle each), its folder created;
/// appended to, or created afresh.
pub fn log_handles(log: &Path, append: bool) -> anyhow::Result<(File, File)> {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let out = if append {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?
    } else {
        File::create(log)?
    };
    let err = out.try_clone()?;
    Ok((out, err))
}

/// Runs `cmd`, appending stdout and stderr to `log`. On failure the error carries the last
/// lines of the log.
pub fn run_logged(cmd: &mut Command, log: &Path) -> anyhow::Result<()> {
    let (out, err) = log_handles(log, true)?;
    let shown = format!("{cmd:?}");
    let status = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .with_context(|| format!("could not start {shown}"))?;
    if !status.success() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(25).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "{shown} failed ({status}); log {}:\n{}",
            log.display(),
            tail.join("\n")
        );
    }
    Ok(())
}
