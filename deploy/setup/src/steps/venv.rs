//! The Python interpreter and the venvs steps install packages into.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use indicatif::ProgressBar;

use crate::process::run_logged;
use approxy_verifier::home::Home;

pub(crate) fn python() -> String {
    std::env::var("APPROXY_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

pub(super) fn venv(home: &Home, name: &str) -> PathBuf {
    home.root.join("venv").join(name)
}

/// Creates (or reuses, when complete) a venv with exactly `reqs` installed.
pub(super) fn ensure_venv(
    home: &Home,
    key: &str,
    name: &str,
    reqs: &[&str],
    pb: &ProgressBar,
) -> anyhow::Result<PathBuf> {
    let dir = venv(home, name);
    let marker = dir.join(".approxy-complete");
    let wanted = reqs.join("\n");
    if std::fs::read_to_string(&marker).is_ok_and(|s| s == wanted) {
        return Ok(dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
    pb.set_message(format!("creating venv {name}"));
    run_logged(
        Command::new(python()).args(["-m", "venv"]).arg(&dir),
        &home.log(key),
    )?;
    pb.set_message(format!(
        "installing {} packages into venv {name}",
        reqs.len()
    ));
    let mut cmd = Command::new(dir.join("bin").join("python"));
    // --no-cache-dir: pip's cache would double the disk use of the torch wheels.
    cmd.args([
        "-m",
        "pip",
        "install",
        "--no-cache-dir",
        "--only-binary",
        ":all:",
    ])
    .args(reqs);
    run_logged(&mut cmd, &home.log(key))?;
    std::fs::write(&marker, wanted)?;
    Ok(dir)
}

/// A venv with exactly the pins of a requirements file, installed without their declared
/// dependencies (the file pins every package needed: see
/// `tests/bench/instructions/requirements.txt`); reused while the file is unchanged. For
/// benchmark tools that set-up itself does not need.
pub fn requirements_venv(home: &Home, name: &str, requirements: &Path) -> anyhow::Result<PathBuf> {
    let wanted = std::fs::read_to_string(requirements)
        .with_context(|| format!("reading {}", requirements.display()))?;
    let dir = venv(home, name);
    let marker = dir.join(".approxy-complete");
    if std::fs::read_to_string(&marker).is_ok_and(|s| s == wanted) {
        return Ok(dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let log = home.log(&format!("{name}-venv"));
    run_logged(Command::new(python()).args(["-m", "venv"]).arg(&dir), &log)?;
    run_logged(
        Command::new(dir.join("bin").join("python"))
            .args(["-m", "pip", "install", "--no-cache-dir", "--no-deps", "-r"])
            .arg(requirements),
        &log,
    )?;
    std::fs::write(&marker, wanted)?;
    Ok(dir)
}
