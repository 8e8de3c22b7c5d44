//! Files set-up writes: hashed as they stream, and written whole beside their place, then
//! published by a rename.

use std::path::Path;

use indicatif::ProgressBar;

/// sha256 of a file, streaming, with progress.
pub fn sha256_file(path: &Path, pb: Option<&ProgressBar>) -> anyhow::Result<String> {
    use sha2::Digest;
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        if let Some(pb) = pb {
            pb.inc(n as u64);
        }
    }
    Ok(format!("{:x}", h.finalize()))
}

/// A unique temporary path beside `dest`, for a file written whole and checked before
/// [`publish`] renames it into place; dropped unpublished, it is deleted, so an interrupted or
/// refused step leaves nothing behind. A path, not an open file: a binary written there must
/// run before it is published, and Linux will not run a file open for writing.
pub(crate) fn temp_beside(dest: &std::path::Path) -> anyhow::Result<tempfile::TempPath> {
    use std::os::unix::fs::PermissionsExt;
    let dir = dest
        .parent()
        .ok_or_else(|| anyhow::anyhow!("{} has no parent directory", dest.display()))?;
    std::fs::create_dir_all(dir)?;
    Ok(tempfile::Builder::new()
        .prefix(".approxy-")
        // Readable by all, as a created file is (tempfile's own default is private): the
        // container image copies the library and models, and its server runs as another user.
        .permissions(std::fs::Permissions::from_mode(0o644))
        .tempfile_in(dir)?
        .into_temp_path())
}

/// Syncs the file at `tmp` to disk, then renames it to `dest`: after a crash `dest` is the old
/// file or the whole new one.
pub(crate) fn publish(tmp: tempfile::TempPath, dest: &std::path::Path) -> anyhow::Result<()> {
    std::fs::File::open(&tmp)?.sync_all()?;
    tmp.persist(dest)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_published_file_is_whole_readable_by_all_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        let dest = dir.path().join("sub/lib.so");
        let tmp = super::temp_beside(&dest).unwrap_or_else(|e| unreachable!("{e}"));
        std::fs::write(&tmp, b"bytes").unwrap_or_else(|e| unreachable!("{e}"));
        assert!(super::publish(tmp, &dest).is_ok());
        assert_eq!(std::fs::read(&dest).ok().as_deref(), Some(&b"bytes"[..]));
        let mode = std::fs::metadata(&dest)
            .map(|m| m.permissions().mode())
            .unwrap_or(0);
        assert_eq!(mode & 0o044, 0o044, "mode {mode:o}");
        // Dropped unpublished: nothing is left beside the destination.
        drop(super::temp_beside(&dest));
        let names: Vec<_> = std::fs::read_dir(dest.parent().unwrap_or(dir.path()))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, ["lib.so"]);
    }
}
