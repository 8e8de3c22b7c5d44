//! The shipped draft as int4 ONNX: converted, accepted by its graph and fingerprint,
//! regrouped, and run once before it is recorded.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use indicatif::ProgressBar;

use super::conversion::{Conversion, regroup, write_work_file};
use super::record::record;
use crate::assets;
use crate::cpu::{BuiltFor, CpuFeatures};
use crate::files::sha256_file;
use crate::fingerprint::{self, Comparison, Fingerprint, Tolerance};
use crate::manifest::{Asset, AssetFile, Manifest};
use crate::options::SetupOptions;
use crate::process::run_logged;
use crate::smoke;
use approxy_verifier::draft::DRAFT_GRAPH;
use approxy_verifier::home::Home;

const FINGERPRINT_SCRIPT: &str = include_str!("../../../../verifier/scripts/fingerprint_draft.py");

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
pub(crate) const DRAFT_ONNX_FILES: [&str; 6] = [
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
pub(crate) fn accept_conversion(
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
pub(crate) fn check_converted_draft(
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
pub(crate) fn converted_draft_built_for(cpu: CpuFeatures) -> BuiltFor {
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
