//! Where collected rows live unless `--data` says otherwise.

use std::path::PathBuf;

use approxy_verifier::home::Home;

/// `--data`, else the default shard directory.
pub(super) fn data_dir(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    default_data_dir().map(|d| flag.unwrap_or(d))
}

/// Default data directory for collected rows.
pub fn default_data_dir() -> anyhow::Result<PathBuf> {
    Ok(Home::from_env()?.root.join("training").join("rows"))
}
