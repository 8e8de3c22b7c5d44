//! A step's files as the manifest records them: relative path, size and sha256.

use std::path::{Path, PathBuf};

use indicatif::ProgressBar;

use crate::files::sha256_file;
use crate::manifest::AssetFile;
use approxy_verifier::home::Home;

pub(super) fn rel(home: &Home, p: &Path) -> String {
    p.strip_prefix(&home.root)
        .unwrap_or(p)
        .to_string_lossy()
        .into_owned()
}

pub(crate) fn record(
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
