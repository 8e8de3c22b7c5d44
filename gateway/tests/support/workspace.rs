//! The workspace as the tests that read its source see it: its root, its crates' source
//! folders, and their `.rs` files. Shared by the house test (`tests/house.rs`) and the docs
//! test of the source layout (`src/docs_tests.rs`), so both read the same crates: those the
//! workspace manifest names, and a crate added there is read by both without a list to keep.

use std::path::{Path, PathBuf};

/// The workspace root (the gateway crate's parent).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The source folder of each crate the workspace manifest names as a member
/// (`verifier/src`), from the root; none when the manifest cannot be read, which the tests'
/// own counts of files read then fail on.
pub fn source_folders() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).unwrap_or_default();
    let parsed: toml::Table = toml::from_str(&text).unwrap_or_default();
    let members = parsed
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(toml::Value::as_array);
    members
        .into_iter()
        .flatten()
        .filter_map(toml::Value::as_str)
        .map(|m| format!("{m}/src"))
        .collect()
}

/// Every `.rs` file below `dir`.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}
