//! `$APPROXY_HOME/manifest.json`: every asset's source package, version, size and sha256.
//! It is also what lets a second `approxy setup` skip work: an asset counts as present only
//! when its manifest entry exists and the file on disk still has the recorded size.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::cpu::{BuiltFor, CpuFeatures};

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
    /// For native code: the instruction sets it was built for and the CPU it was verified on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub built_for: Option<BuiltFor>,
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

    /// Writes atomically (temp file, sync, rename) so an interrupted setup never leaves half a
    /// file.
    pub fn save(&self, home: &Path) -> anyhow::Result<()> {
        let dest = Self::path(home);
        let tmp = super::files::temp_beside(&dest)?;
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        super::files::publish(tmp, &dest)
    }

    /// True when `key` is recorded and all its files exist with their recorded sizes.
    pub fn is_present(&self, home: &Path, key: &str) -> bool {
        self.is_present_but(home, key, |_| false)
    }

    /// Whether `key`'s recorded files are present, leaving out those `derived` names (a file a
    /// step makes from the others, which it can make again alone).
    pub fn is_present_but(&self, home: &Path, key: &str, derived: impl Fn(&Path) -> bool) -> bool {
        self.assets.get(key).is_some_and(|a| {
            let mut files = a
                .files
                .iter()
                .filter(|f| !derived(Path::new(&f.path)))
                .peekable();
            files.peek().is_some()
                && files
                    .all(|f| std::fs::metadata(home.join(&f.path)).is_ok_and(|m| m.len() == f.size))
        })
    }

    /// Why a recorded asset cannot run on `cpu`, if it cannot: it needs a feature this CPU
    /// lacks, or it is CPU-specific and carries no record of what it was built for (a cache
    /// from before the record existed).
    pub fn cpu_mismatch(&self, key: &str, cpu: &CpuFeatures, cpu_specific: bool) -> Option<String> {
        let asset = self.assets.get(key)?;
        match &asset.built_for {
            Some(b) => {
                let missing = cpu.missing(&b.requires);
                (!missing.is_empty()).then(|| {
                    format!(
                        "it was built on {} for {}; this CPU ({}) lacks {}",
                        b.verified_on,
                        b.isa,
                        cpu.model,
                        missing.join(" ")
                    )
                })
            }
            None if cpu_specific => {
                Some("the cache does not record which CPU features it was built for".to_string())
            }
            None => None,
        }
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
                files: vec![AssetFile {
                    path: "a.bin".into(),
                    size: 5,
                    sha256: "00".into(),
                }],
                built_for: None,
            },
        );
        m.save(dir.path())?;
        let loaded = Manifest::load(dir.path());
        assert!(loaded.is_present(dir.path(), "a"));
        assert!(!loaded.is_present(dir.path(), "b"));
        std::fs::write(dir.path().join("a.bin"), b"hell")?;
        assert!(
            !loaded.is_present(dir.path(), "a"),
            "truncated file must not count"
        );
        Ok(())
    }

    #[test]
    fn a_derived_file_can_be_left_out_of_presence() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("a.bin"), b"hello")?;
        let file = |path: &str| AssetFile {
            path: path.into(),
            size: 5,
            sha256: "00".into(),
        };
        let mut m = Manifest::default();
        m.assets.insert(
            "a".into(),
            Asset {
                source_packages: vec![],
                registry: "pypi".into(),
                method: "test".into(),
                files: vec![file("a.bin"), file("derived.bin")],
                built_for: None,
            },
        );
        let derived = |p: &Path| p.ends_with("derived.bin");
        assert!(!m.is_present(dir.path(), "a"));
        assert!(m.is_present_but(dir.path(), "a", derived));
        std::fs::remove_file(dir.path().join("a.bin"))?;
        assert!(!m.is_present_but(dir.path(), "a", derived));
        // Nothing left to be present is not present.
        assert!(!m.is_present_but(dir.path(), "a", |_| true));
        Ok(())
    }

    #[test]
    fn a_native_asset_built_for_avx512_does_not_fit_an_avx2_cpu() -> anyhow::Result<()> {
        let avx2 = CpuFeatures::parse(include_str!("cpuinfo/amd-epyc-avx2.txt"));
        let xeon = CpuFeatures::parse(include_str!("cpuinfo/intel-xeon-avx512-amx.txt"));
        let built = super::super::cpu::llama_cpp_isa(&xeon);
        let asset = |built_for| Asset {
            source_packages: vec![],
            registry: "pypi".into(),
            method: "built".into(),
            files: vec![],
            built_for,
        };
        let mut m = Manifest::default();
        m.assets.insert(
            "llama-server".into(),
            asset(Some(BuiltFor {
                isa: "x".into(),
                requires: built.requires.clone(),
                verified_on: xeon.model.clone(),
            })),
        );
        m.assets.insert("legacy".into(), asset(None));
        let why = m
            .cpu_mismatch("llama-server", &avx2, true)
            .unwrap_or_default();
        assert!(
            why.contains("avx512f") && why.contains("AMD EPYC 7B13"),
            "{why}"
        );
        assert_eq!(m.cpu_mismatch("llama-server", &xeon, true), None);
        assert!(
            m.cpu_mismatch("legacy", &xeon, true).is_some(),
            "no record means rebuild"
        );
        assert_eq!(m.cpu_mismatch("legacy", &xeon, false), None);
        assert_eq!(m.cpu_mismatch("absent", &xeon, true), None);
        // Round trip: old manifests without the field still load.
        let json = serde_json::to_string(&m)?;
        let back: Manifest = serde_json::from_str(&json)?;
        assert_eq!(
            back.assets["llama-server"].built_for,
            m.assets["llama-server"].built_for
        );
        let old =
            r#"{"assets":{"a":{"source_packages":[],"registry":"pypi","method":"m","files":[]}}}"#;
        assert!(
            serde_json::from_str::<Manifest>(old)?.assets["a"]
                .built_for
                .is_none()
        );
        Ok(())
    }
}
