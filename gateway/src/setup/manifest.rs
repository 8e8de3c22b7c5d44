//! `$APPROXY_HOME/manifest.json`: every asset's source package, version, size and sha256.
//! It is also what lets a second `approxy setup` skip work: an asset counts as present only
//! when its manifest entry exists and the file on disk still has the recorded size.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One provided file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AssetFile {
    /// Path relative to `$APPROXY_HOME`.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Lower-case hex sha256.
    pub sha256: String,
}

/// One asset: where it came from and the files it consists of.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Asset {
    /// Registry packages it was built from, as `name==version` specs.
    pub source_packages: Vec<String>,
    /// Registry (`pypi`).
    pub registry: String,
    /// How it was obtained (assembled, built, extracted, converted).
    pub method: String,
    /// The files.
    pub files: Vec<AssetFile>,
}

/// The whole manifest.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Manifest {
    /// Assets by key.
    pub assets: BTreeMap<String, Asset>,
}

impl Manifest {
    /// Path of the manifest inside a home directory.
    pub fn path(home: &Path) -> PathBuf {
        home.join("manifest.json")
    }

    /// Loads the manifest; a missing or unreadable one is treated as empty (everything is
    /// then re-verified, never trusted).
    pub fn load(home: &Path) -> Self {
        std::fs::read(Self::path(home))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Writes atomically (temp file + rename) so an interrupted setup never leaves half a file.
    pub fn save(&self, home: &Path) -> anyhow::Result<()> {
        let tmp = home.join("manifest.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&tmp, Self::path(home))?;
        Ok(())
    }

    /// True when `key` is recorded and all its files exist with their recorded sizes.
    pub fn is_present(&self, home: &Path, key: &str) -> bool {
        self.assets.get(key).is_some_and(|a| {
            !a.files.is_empty()
                && a.files.iter().all(|f| {
                    std::fs::metadata(home.join(&f.path)).is_ok_and(|m| m.len() == f.size)
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_requires_matching_size() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("a.bin"), b"hello")?;
        let mut m = Manifest::default();
        m.assets.insert(
            "a".into(),
            Asset {
                source_packages: vec!["x==1".into()],
                registry: "pypi".into(),
                method: "test".into(),
                files: vec![AssetFile { path: "a.bin".into(), size: 5, sha256: "00".into() }],
            },
        );
        m.save(dir.path())?;
        let loaded = Manifest::load(dir.path());
        assert!(loaded.is_present(dir.path(), "a"));
        assert!(!loaded.is_present(dir.path(), "b"));
        std::fs::write(dir.path().join("a.bin"), b"hell")?;
        assert!(!loaded.is_present(dir.path(), "a"), "truncated file must not count");
        Ok(())
    }
}
