//! llama-server, built from llama.cpp's source distribution for this CPU.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use indicatif::ProgressBar;

use super::record::record;
use super::venv::venv;
use crate::assets;
use crate::cpu::{self, BuiltFor, CpuFeatures};
use crate::files::sha256_file;
use crate::manifest::{Asset, Manifest};
use crate::options::SetupOptions;
use crate::process::run_logged;
use crate::smoke;
use approxy_verifier::home::Home;

fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_path_buf()];
    if let Some(p) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(paths).unwrap_or_default()
}

/// Builds `llama-server` from the llama.cpp tree vendored in the llama-cpp-python sdist.
pub fn llama_server(
    home: &Home,
    manifest: &mut Manifest,
    _: &SetupOptions,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    let key = "llama-server";
    let log = home.log(key);
    let tools_bin = venv(home, "tools").join("bin");
    let (name, version) = assets::LLAMA_CPP_SDIST;
    let spec = format!("{name}=={version}");
    let stem = format!("{}-{version}", name.replace('-', "_"));
    let work = home.work(key);
    std::fs::create_dir_all(&work)?;
    let sdist = work.join(format!("{stem}.tar.gz"));
    fetch_llama_cpp_sdist(&tools_bin, &work, &sdist, &spec, &log, pb)?;
    let src = unpack_llama_cpp(&work, &sdist, &stem, pb)?;
    let cpu = CpuFeatures::current()?;
    let isa = cpu::llama_cpp_isa(&cpu);
    let isa_words = if isa.enabled.is_empty() {
        "x86-64 baseline".to_string()
    } else {
        isa.enabled.join(" ")
    };
    pb.set_message(format!("configuring (cmake) for {isa_words}"));
    eprintln!(
        "approxy setup: llama-server: building for {} with {isa_words} (never AMX)",
        cpu.model
    );
    let built = cmake_llama_server(
        &tools_bin,
        &src,
        &work.join("build"),
        &isa.cmake_flags,
        &log,
        pb,
    )?;
    let dest = install_llama_server(home, &built, &cpu, &isa_words, pb)?;
    let files = record(home, &[dest], pb)?;
    let built_for = Some(BuiltFor {
        isa: isa_words,
        requires: isa.requires,
        verified_on: cpu.model,
    });
    manifest.assets.insert(
        key.into(),
        Asset {
            source_packages: vec![spec],
            registry: "pypi".into(),
            method: "built from vendor/llama.cpp".into(),
            files,
            built_for,
        },
    );
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

/// The llama-cpp-python sdist `spec` at `sdist`, downloaded into `work` unless already there,
/// and checked against its pinned sha256 (deleted when it differs).
fn fetch_llama_cpp_sdist(
    tools_bin: &Path,
    work: &Path,
    sdist: &Path,
    spec: &str,
    log: &Path,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    if !sdist.exists() {
        pb.set_message("downloading llama.cpp sources".to_string());
        // Preparing the sdist's metadata needs cmake and scikit-build-core: the tools venv.
        let mut cmd = Command::new(tools_bin.join("python"));
        cmd.env("PATH", path_with(tools_bin))
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-build-isolation",
                "--no-binary",
                ":all:",
                "-d",
            ])
            .arg(work)
            .arg(spec);
        run_logged(&mut cmd, log)?;
    }
    let sha = sha256_file(sdist, None)?;
    if sha != assets::LLAMA_CPP_SDIST_SHA256 {
        let _ = std::fs::remove_file(sdist);
        bail!(
            "{} has sha256 {sha}, expected {}; deleted",
            sdist.display(),
            assets::LLAMA_CPP_SDIST_SHA256
        );
    }
    Ok(())
}

/// Unpacks the sdist afresh under `work/src`; returns the llama.cpp tree vendored in it
/// (`stem` is the sdist's top directory).
fn unpack_llama_cpp(
    work: &Path,
    sdist: &Path,
    stem: &str,
    pb: &ProgressBar,
) -> anyhow::Result<PathBuf> {
    pb.set_message("unpacking".to_string());
    let src_root = work.join("src");
    let _ = std::fs::remove_dir_all(&src_root);
    tar::Archive::new(flate2::read::GzDecoder::new(std::fs::File::open(sdist)?))
        .unpack(&src_root)?;
    let src = src_root.join(stem).join("vendor").join("llama.cpp");
    if !src.join("tools").join("server").exists() {
        bail!("{} has no tools/server", src.display());
    }
    Ok(src)
}

/// Configures llama.cpp in `build` with the pinned flags and this CPU's `isa_flags`, then
/// compiles llama-server on every core; returns the binary built.
fn cmake_llama_server(
    tools_bin: &Path,
    src: &Path,
    build: &Path,
    isa_flags: &[String],
    log: &Path,
    pb: &ProgressBar,
) -> anyhow::Result<PathBuf> {
    // A build directory configured for another CPU keeps its cached options: start afresh.
    let _ = std::fs::remove_dir_all(build);
    run_logged(
        Command::new(tools_bin.join("cmake"))
            .arg("-S")
            .arg(src)
            .arg("-B")
            .arg(build)
            .args(assets::LLAMA_CMAKE_FLAGS)
            .args(isa_flags),
        log,
    )?;
    let jobs = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .to_string();
    pb.set_message(format!("compiling with {jobs} jobs (several minutes)"));
    run_logged(
        Command::new(tools_bin.join("cmake"))
            .arg("--build")
            .arg(build)
            .args(["--target", "llama-server", "-j", &jobs]),
        log,
    )?;
    Ok(build.join("bin").join("llama-server"))
}

/// Copies the `built` llama-server into the cache's bin directory once it has generated a
/// token from the target model on this CPU; returns where it now is.
fn install_llama_server(
    home: &Home,
    built: &Path,
    cpu: &CpuFeatures,
    isa_words: &str,
    pb: &ProgressBar,
) -> anyhow::Result<PathBuf> {
    let dest = home.llama_server();
    std::fs::create_dir_all(dest.parent().context("bin path has no parent")?)?;
    let partial = crate::files::temp_beside(&dest)?;
    std::fs::copy(built, &partial)?;
    pb.set_message("verifying: one token from the target model".to_string());
    match smoke::llama_server_generates(
        &partial,
        &home.target_gguf(),
        &home.log("llama-server-check"),
        cpu,
    ) {
        Ok(text) => eprintln!("approxy setup: llama-server: verified, generated {text:?}"),
        Err(e) => {
            drop(partial);
            return Err(e.context(format!(
                "the llama-server built for {isa_words} does not run on this CPU ({}, {}); it was deleted",
                cpu.model,
                cpu.simd_summary()
            )));
        }
    }
    crate::files::publish(partial, &dest)?;
    Ok(dest)
}
