//! Other conversions of the draft (`approxy setup --draft-variants`), for
//! `approxy bench draft-fidelity`: float32, int4 with another block size or accuracy level,
//! int8. Each is built from the float32 checkpoint (`draft-hf`, the GGUF dequantised) by the
//! same ONNX builder as the shipped draft, so only the precision and the builder options differ.

use std::path::PathBuf;

use indicatif::ProgressBar;

use super::assets::{self, DRAFT_VARIANTS};
use super::cpu::CpuFeatures;
use super::manifest::{Asset, Manifest};
use super::options::SetupOptions;
use super::process::run_logged;
use super::steps::{
    Conversion, DRAFT_ONNX_FILES, check_converted_draft, converted_draft_built_for, record, regroup,
};
use approxy_verifier::DraftMeta;
use approxy_verifier::draft::DRAFT_GRAPH;
use approxy_verifier::home::Home;

/// Why the recorded variants are not the ones this build wants, if they are not: one is missing,
/// or was converted otherwise than its name says (or before conversions recorded it).
pub fn stale(home: &Home) -> Option<String> {
    DRAFT_VARIANTS.iter().find_map(|v| {
        if !built_as_named(home, v) {
            Some(format!("{} is not built as {:?}", v.name, v.build()))
        } else if !home.draft_variant_dir(v.name).join(DRAFT_GRAPH).is_file() {
            // Built before the runtime loaded the regrouped graph: only regrouped.
            Some(format!("{} has no {DRAFT_GRAPH}", v.name))
        } else {
            None
        }
    })
}

fn built_as_named(home: &Home, v: &assets::DraftVariant) -> bool {
    let out = home.draft_variant_dir(v.name);
    DRAFT_ONNX_FILES.iter().all(|f| out.join(f).is_file())
        && DraftMeta::load(&out).is_ok_and(|m| m.build() == v.build())
}

/// Builds every variant not yet built, runs each once through ONNX Runtime, and records them.
pub fn draft_variants(
    home: &Home,
    manifest: &mut Manifest,
    _: &SetupOptions,
    pb: &ProgressBar,
) -> anyhow::Result<()> {
    let key = "draft-variants";
    let input = ("draft-hf", "the float32 draft checkpoint");
    let conversion = Conversion::start(home, manifest, key, input, pb)?;
    let cpu = CpuFeatures::current()?;
    let mut files: Vec<PathBuf> = Vec::new();
    for v in DRAFT_VARIANTS {
        let out = home.draft_variant_dir(v.name);
        // A variant is published by one rename when complete, so all files or none. One built
        // before conversions recorded their build (or built otherwise) is built again, so a
        // verifier cannot be bound to the wrong conversion.
        if !built_as_named(home, v) {
            pb.set_message(format!("building {} ({})", v.name, v.about));
            let mut cmd = conversion.command();
            cmd.arg("--variant")
                .arg(home.draft_hf_dir())
                .arg(&out)
                .arg(home.work(key).join(v.name))
                .arg(v.precision)
                .args(v.options);
            run_logged(&mut cmd, &home.log(key))?;
        }
        regroup(home, key, &out, pb)?;
        files.extend(check_converted_draft(
            home,
            &out,
            &format!("the {} draft", v.name),
            &cpu,
        )?);
    }
    let files = record(home, &files, pb)?;
    let mut sources = vec!["the draft-hf asset".to_string()];
    sources.extend(assets::CONVERT_REQUIREMENTS.iter().map(|s| s.to_string()));
    manifest.assets.insert(
        key.into(),
        Asset {
            source_packages: sources,
            registry: "pypi".into(),
            method: "converted by onnxruntime-genai builder at other precisions".into(),
            files,
            built_for: Some(converted_draft_built_for(cpu)),
        },
    );
    let _ = std::fs::remove_dir_all(home.work(key));
    Ok(())
}
