//! A configuration's finished run, as saved under `raw/` and reused by a rerun.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::config::{ALL, CallConfig};
use super::options::Sample;
use super::tasks::Task;
use crate::client::Generation;
use crate::humaneval::Verdict;
use crate::instructions::InstructionScores;
use crate::servers::Layout;
use crate::target_account::TargetAccount;

/// One prompt's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PromptRun {
    /// HumanEval task id or `chat/<corpus id>`.
    pub id: String,
    /// HumanEval only.
    pub verdict: Option<Verdict>,
    /// The timed generation.
    pub generation: Generation,
}

/// One configuration's run at one layout and delay.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallsRun {
    /// Which prompts.
    pub sample: Sample,
    /// Layout name.
    pub layout: String,
    /// Injected per-call delay.
    pub delay_ms: u64,
    /// Output limit per prompt.
    pub max_tokens: u32,
    /// Configuration.
    pub config: CallConfig,
    /// When it finished (UTC).
    pub finished_at: String,
    /// Per prompt.
    pub prompts: Vec<PromptRun>,
    /// What the target counted while the prompts ran (its `/metrics`; none for runs saved
    /// before the bench read it).
    #[serde(default)]
    pub target_account: Option<TargetAccount>,
    /// The machine it ran on (runs saved before the bench recorded it have none).
    #[serde(default)]
    pub machine: Option<String>,
    /// The instruction-following sample: IFEval's scores of the answers.
    #[serde(default)]
    pub instructions: Option<InstructionScores>,
}

pub(super) fn raw_path(
    out: &Path,
    sample: Sample,
    layout: Layout,
    delay: u64,
    c: CallConfig,
) -> PathBuf {
    out.join("raw").join(format!(
        "{}-{}-d{delay}-{}.json",
        sample.name(),
        layout.name(),
        c.id()
    ))
}

pub(super) fn load_saved(path: &Path, tasks: &[Task], max_tokens: u32) -> Option<CallsRun> {
    let run: CallsRun = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let same = run.prompts.len() == tasks.len()
        && run.max_tokens == max_tokens
        && run.prompts.iter().zip(tasks).all(|(r, t)| r.id == t.id);
    same.then_some(run)
}

/// Every saved run under `out/raw`, in report order.
pub fn load_all(out: &Path) -> anyhow::Result<Vec<CallsRun>> {
    let mut runs = Vec::new();
    let dir = out.join("raw");
    if dir.is_dir() {
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "json") {
                let run: CallsRun = serde_json::from_slice(&std::fs::read(&p)?)
                    .with_context(|| format!("{}", p.display()))?;
                runs.push(run);
            }
        }
    }
    runs.sort_by_key(|r| {
        (
            r.sample.name(),
            r.config.vllm(),
            r.layout.clone(),
            r.delay_ms,
            ALL.iter().position(|c| *c == r.config),
        )
    });
    Ok(runs)
}
