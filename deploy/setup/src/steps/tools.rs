//! Tools the tests and benchmarks run: oha, Prometheus and promtool, and the build tools venv.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use indicatif::ProgressBar;

use super::record::record;
use super::venv::ensure_venv;
use crate::assets;
use crate::cpu::{BuiltFor, CpuFeatures};
use crate::manifest::{Asset, Manifest};
use crate::options::SetupOptions;
use crate::process::run_logged;
use crate::smoke;
use approxy_verifier::home::Home;

/// Builds `oha` from crates.io into `bin/` (for the overhead benchmark) with the cargo that
/// builds approxy, from its own lock file.
pub fn oha(
    home: &Home,
    manifest: &mut Manifest,
    _: &SetupOptions,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    let key = "oha";
    let (name, version) = assets::OHA_CRATE;
    let work = home.work(key);
    std::fs::create_dir_all(&work)?;
    pb.set_message(format!("cargo install {name} {version} (a few minutes)"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run_logged(
        Command::new(cargo)
            .args([
                "install",
                name,
                "--version",
                version,
                "--locked",
                "--force",
                "--root",
            ])
            .arg(work.join("root"))
            // Kept in the work directory: a rerun after an interruption reuses what was built.
            .env("CARGO_TARGET_DIR", work.join("target")),
        &home.log(key),
    )?;
    let dest = home.oha();
    std::fs::create_dir_all(dest.parent().context("no bin dir")?)?;
    let partial = crate::files::temp_beside(&dest)?;
    std::fs::copy(work.join("root/bin").join(name), &partial)?;
    let cpu = CpuFeatures::current()?;
    smoke::runs(Command::new(&partial).arg("--version"), &cpu)
        .context("the oha just built does not run")?;
    crate::files::publish(partial, &dest)?;
    let files = record(home, std::slice::from_ref(&dest), pb)?;
    manifest.assets.insert(
        key.into(),
        Asset {
            source_packages: vec![format!("{name}=={version}")],
            registry: "crates.io".into(),
            method: "cargo install --locked".into(),
            files,
            built_for: Some(BuiltFor {
                isa: "x86-64 baseline (rustc's default target)".into(),
                requires: vec![],
                verified_on: cpu.model,
            }),
        },
    );
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

/// Extracts `prometheus` and `promtool` from Debian's package into `bin/` (the test set-up: the
/// alert rules are checked with promtool, and a real Prometheus scrapes approxy in a test).
pub fn prometheus(
    home: &Home,
    manifest: &mut Manifest,
    _: &SetupOptions,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    let bin = home.root.join("bin");
    extract_debian_tools(
        home,
        manifest,
        "prometheus",
        assets::PROMETHEUS_DEB,
        &[
            (
                "usr/bin/prometheus",
                bin.join("prometheus"),
                assets::PROMETHEUS_SHA256,
                "--version",
            ),
            (
                "usr/bin/promtool",
                bin.join("promtool"),
                assets::PROMTOOL_SHA256,
                "--version",
            ),
        ],
        pb,
    )
}

/// Downloads one Debian package (no install, no root needed once the package lists exist; a
/// machine without them gets `apt-get update` first) and copies `tools` out of it: (path in the
/// package, destination, sha256, an argument it answers to when run).
fn extract_debian_tools(
    home: &Home,
    manifest: &mut Manifest,
    key: &str,
    (name, version): (&str, &str),
    tools: &[(&str, PathBuf, &str, &str)],
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    let work = home.work(key);
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let spec = format!("{name}={version}");
    pb.set_message("apt-get download".to_string());
    let download = |log: &Path| {
        run_logged(
            Command::new("apt-get")
                .args(["download", &spec])
                .current_dir(&work),
            log,
        )
    };
    if download(&home.log(key)).is_err() {
        run_logged(
            Command::new("apt-get").args(["update", "-qq"]),
            &home.log(key),
        )?;
        download(&home.log(key))?;
    }
    let deb = std::fs::read_dir(&work)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")?;
    let root = work.join("root");
    run_logged(
        Command::new("dpkg").arg("-x").arg(&deb).arg(&root),
        &home.log(key),
    )?;
    let cpu = CpuFeatures::current()?;
    let mut dests = Vec::new();
    for (member, dest, sha, probe) in tools {
        std::fs::create_dir_all(dest.parent().context("no bin dir")?)?;
        std::fs::copy(root.join(member), dest)?;
        let got = crate::files::sha256_file(dest, None)?;
        if got != *sha {
            let _ = std::fs::remove_file(dest);
            anyhow::bail!("{member} from {spec} has sha256 {got}, expected {sha}");
        }
        smoke::runs(Command::new(dest).arg(probe), &cpu)
            .with_context(|| format!("the extracted {member} does not run"))?;
        dests.push(dest.clone());
    }
    let files = record(home, &dests, pb)?;
    let built_for = Some(BuiltFor {
        isa: "x86-64 baseline (Debian's Go build, GOAMD64=v1)".into(),
        requires: vec![],
        verified_on: cpu.model,
    });
    manifest.assets.insert(
        key.into(),
        Asset {
            source_packages: vec![spec],
            registry: "debian".into(),
            method: "extracted from .deb".into(),
            files,
            built_for,
        },
    );
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

/// A small venv with cmake and scikit-build-core, needed to fetch and build llama.cpp.
pub fn tools_venv(
    home: &Home,
    manifest: &mut Manifest,
    _: &SetupOptions,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    let dir = ensure_venv(home, "tools-venv", "tools", assets::TOOLS_REQUIREMENTS, pb)?;
    let files = record(home, &[dir.join(".approxy-complete")], pb)?;
    manifest.assets.insert(
        "tools-venv".into(),
        Asset {
            source_packages: assets::TOOLS_REQUIREMENTS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            registry: "pypi".into(),
            method: "python venv".into(),
            files,
            built_for: None,
        },
    );
    Ok(())
}
