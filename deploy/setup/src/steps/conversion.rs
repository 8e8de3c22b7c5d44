//! What the draft's conversions share: the conversion venv, the scripts written into a step's
//! work directory, and the regrouping of the builder's graph.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use indicatif::ProgressBar;

use super::venv::ensure_venv;
use crate::assets;
use crate::manifest::Manifest;
use crate::process::run_logged;
use approxy_verifier::home::Home;

/// The conversion script, shipped inside the binary so setup needs only the binary itself.
const CONVERT_SCRIPT: &str = include_str!("../../../../verifier/scripts/convert_draft_onnx.py");

const REGROUP_SCRIPT: &str = include_str!("../../../../verifier/scripts/regroup_attention.py");

/// The conversion venv (torch, transformers, the ONNX builder), created when first needed and
/// removed at the end of setup.
fn convert_venv(home: &Home, key: &str, pb: &ProgressBar) -> anyhow::Result<PathBuf> {
    ensure_venv(home, key, CONVERT_VENV, assets::CONVERT_REQUIREMENTS, pb)
}

/// Name of the conversion venv under `venv/`.
pub(crate) const CONVERT_VENV: &str = "convert";

/// Writes `contents` as `name` into the step's work directory; returns its path.
pub(super) fn write_work_file(
    home: &Home,
    key: &str,
    name: &str,
    contents: &str,
) -> anyhow::Result<PathBuf> {
    let work = home.work(key);
    std::fs::create_dir_all(&work)?;
    let path = work.join(name);
    std::fs::write(&path, contents)?;
    Ok(path)
}

/// Writes the conversion script into the step's work directory.
fn write_convert_script(home: &Home, key: &str) -> anyhow::Result<PathBuf> {
    write_work_file(home, key, "convert_draft_onnx.py", CONVERT_SCRIPT)
}

/// What a step that runs the conversion script (the shipped draft, the float32 checkpoint, the
/// variants) starts with: the conversion venv and the script, in the step's work directory.
pub(crate) struct Conversion {
    /// The conversion venv.
    pub(crate) venv: PathBuf,
    script: PathBuf,
}

impl Conversion {
    /// Starts step `key`, which converts the asset `input` (`what` names it): fails when an
    /// earlier step has not provided it, else provides the venv and writes the script.
    pub(crate) fn start(
        home: &Home,
        manifest: &Manifest,
        key: &str,
        (input, what): (&str, &str),
        pb: &ProgressBar,
    ) -> anyhow::Result<Self> {
        if !manifest.is_present(&home.root, input) {
            bail!("{what} is missing; it is provided by an earlier step");
        }
        let venv = convert_venv(home, key, pb)?;
        let script = write_convert_script(home, key)?;
        Ok(Self { venv, script })
    }

    /// The script under the venv's python, offline (all it reads is on disk already); the
    /// step adds its arguments.
    pub(crate) fn command(&self) -> Command {
        let mut cmd = Command::new(self.venv.join("bin").join("python"));
        cmd.arg(&self.script).env("HF_HUB_OFFLINE", "1");
        cmd
    }
}

/// Name of the venv `regroup` runs in, under `venv/`.
pub(crate) const GRAPH_VENV: &str = "graph";

/// Writes the draft's graph the runtime loads (`approxy_verifier::draft::DRAFT_GRAPH`) beside
/// the builder's `model.onnx` in `dir`, and checks that both compute the same logits (see
/// `verifier/scripts/regroup_attention.py`).
pub(crate) fn regroup(home: &Home, key: &str, dir: &Path, pb: &ProgressBar) -> anyhow::Result<()> {
    let venv = ensure_venv(home, key, GRAPH_VENV, assets::GRAPH_REQUIREMENTS, pb)?;
    let script = write_work_file(home, key, "regroup_attention.py", REGROUP_SCRIPT)?;
    pb.set_message(format!("regrouping the attention of {}", dir.display()));
    run_logged(
        Command::new(venv.join("bin").join("python"))
            .arg(&script)
            .arg(dir)
            .arg("--check"),
        &home.log(key),
    )
    .with_context(|| format!("regrouping the draft's attention in {}", dir.display()))
}
