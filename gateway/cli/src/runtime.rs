//! `block_on`: the tokio runtime the serving commands and the tools each run their work on.
//! A module of its own so that `cli` and `tools` both use it without importing each other.

/// Runs `f` on a fresh multi-threaded runtime.
pub(crate) fn block_on<F: std::future::Future<Output = anyhow::Result<()>>>(
    f: F,
) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(f)
}
