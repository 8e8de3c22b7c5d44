//! What `approxy setup` is asked to do.

/// What `approxy setup` should do.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SetupOptions {
    /// Keep the (large) conversion venv after converting the draft model.
    #[arg(long)]
    pub keep_convert_env: bool,
    /// Also provide the vLLM test target (about 8.5 GB more; the test command uses it).
    #[arg(long)]
    pub vllm: bool,
    /// Also build the draft at other precisions, for `approxy bench draft-fidelity`.
    #[arg(long)]
    pub draft_variants: bool,
}
