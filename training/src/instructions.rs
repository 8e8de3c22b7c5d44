//! The instruction-following set (`tests/bench/instructions/`): its prompts, and IFEval's
//! checkers run over answers by the set's `score.py` (in a venv of its pinned requirements).
//! Shared by the oracle study, the calls benchmark and the chat importance labels.

use std::collections::HashMap;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use approxy_setup::Home;

/// IFEval's accuracies on the instruction-following set (`tests/bench/instructions/`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct InstructionScores {
    /// Share of prompts whose every instruction was followed, the answer as given.
    pub prompt_level_strict: f64,
    /// Share of all instructions followed, the answer as given.
    pub instruction_level_strict: f64,
    /// The same with IFEval's loose reading (first or last line dropped, `*` removed).
    pub prompt_level_loose: f64,
    /// The same, instruction level.
    pub instruction_level_loose: f64,
}

/// An instruction-following prompt (`tests/bench/instructions/prompts.jsonl`; the
/// instructions themselves are read by `score.py`).
#[derive(Deserialize)]
pub struct InstructionPrompt {
    /// `if-NN`.
    pub id: String,
    /// The user message.
    pub prompt: String,
}

/// Scores every configuration's answers with the set's `score.py` (IFEval's checkers, in a
/// venv of the set's pinned requirements), by configuration name.
pub async fn score_instructions(
    home: &Home,
    dir: &std::path::Path,
    scratch: &std::path::Path,
    runs: &[(String, Vec<(String, String)>)],
) -> anyhow::Result<HashMap<String, InstructionScores>> {
    Ok(scored(home, dir, scratch, runs)
        .await?
        .into_iter()
        .map(|(config, s)| (config, s.scores))
        .collect())
}

/// Scores one configuration's answers, `(prompt id, text)`, as [`score_instructions`] scores
/// several: `None` when none of them was scored.
pub async fn score_run(
    home: &Home,
    dir: &std::path::Path,
    scratch: &std::path::Path,
    config: &str,
    answers: Vec<(String, String)>,
) -> anyhow::Result<Option<InstructionScores>> {
    let runs = [(config.to_string(), answers)];
    Ok(score_instructions(home, dir, scratch, &runs)
        .await?
        .get(config)
        .copied())
}

/// Each instruction's strict verdict on every answer of every configuration, by configuration
/// name and then by prompt id, in the prompt's instruction order.
pub async fn verdicts(
    home: &Home,
    dir: &std::path::Path,
    scratch: &std::path::Path,
    runs: &[(String, Vec<(String, String)>)],
) -> anyhow::Result<HashMap<String, HashMap<String, Vec<bool>>>> {
    Ok(scored(home, dir, scratch, runs)
        .await?
        .into_iter()
        .map(|(config, s)| {
            let by_id = s
                .answers
                .into_iter()
                .map(|a| (a.id, a.instructions.iter().map(|i| i.strict).collect()))
                .collect();
            (config, by_id)
        })
        .collect())
}

/// One configuration as `score.py` writes it: the accuracies and each answer's verdicts.
#[derive(Deserialize)]
struct Scored {
    #[serde(flatten)]
    scores: InstructionScores,
    #[serde(default)]
    answers: Vec<ScoredAnswer>,
}

#[derive(Deserialize)]
struct ScoredAnswer {
    id: String,
    instructions: Vec<ScoredInstruction>,
}

#[derive(Deserialize)]
struct ScoredInstruction {
    strict: bool,
}

async fn scored(
    home: &Home,
    dir: &std::path::Path,
    scratch: &std::path::Path,
    runs: &[(String, Vec<(String, String)>)],
) -> anyhow::Result<HashMap<String, Scored>> {
    let venv =
        approxy_setup::requirements_venv(home, "instructions", &dir.join("requirements.txt"))?;
    std::fs::create_dir_all(scratch)?;
    let answers = scratch.join("instruction-answers.jsonl");
    let result = scratch.join("instruction-scores.json");
    let mut lines = String::new();
    for (config, list) in runs {
        for (id, text) in list {
            lines.push_str(&serde_json::to_string(&serde_json::json!({
                "config": config, "id": id, "response": text,
            }))?);
            lines.push('\n');
        }
    }
    std::fs::write(&answers, lines)?;
    // Only the prompts answered: the scorer counts a prompt without an answer as failed.
    let asked: std::collections::HashSet<&str> = runs
        .iter()
        .flat_map(|r| r.1.iter().map(|a| a.0.as_str()))
        .collect();
    let prompts = scratch.join("instruction-prompts.jsonl");
    let mut kept = String::new();
    for line in std::fs::read_to_string(dir.join("prompts.jsonl"))?.lines() {
        let p: InstructionPrompt = match serde_json::from_str(line) {
            Ok(p) => p,
            Err(_) => continue,
        };
        if asked.contains(p.id.as_str()) {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    std::fs::write(&prompts, kept)?;
    let out = tokio::process::Command::new(venv.join("bin").join("python"))
        .arg(dir.join("score.py"))
        .arg("--prompts")
        .arg(&prompts)
        .arg("--answers")
        .arg(&answers)
        .arg("--out")
        .arg(&result)
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "score.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    #[derive(Deserialize)]
    struct All {
        configs: HashMap<String, Scored>,
    }
    let all: All =
        serde_json::from_slice(&std::fs::read(&result)?).context("reading score.py's result")?;
    Ok(all.configs)
}
