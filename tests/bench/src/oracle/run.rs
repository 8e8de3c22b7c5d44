//! The study: every configuration over the sample, the answers checked and scored, and the
//! report written.

use std::time::{Duration, Instant};

use anyhow::Context;
use approxy_setup::Home;
use approxy_training::corpus::{CorpusPrompt, HumanEvalProblem, load_human_eval};
use approxy_verifier::template::{ChatMessage, ChatTemplate};
use approxy_verifier::{DraftConfig, DraftPool, DraftWorkers, Tokenizer};

use super::asked::Asked;
use super::decide::Decide;
use super::decode::{Prompt, decode};
use super::markdown::markdown;
use super::options::{OracleOptions, TOP_K};
use super::summary::{
    OracleAnswer, OracleReport, OracleSummary, cost_classes, fill_cheapest, gap_closed, summarize,
};
use crate::chat_sample::held_out_chat;
use crate::humaneval::{self, Sandbox};
use crate::instructions::{InstructionPrompt, score_instructions};
use crate::machine::{Machine, utc_now};
use crate::servers::{self, Layout};

/// Runs the study: its own llama-server target, the shipped draft.
pub async fn run(opts: &OracleOptions) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    std::fs::create_dir_all(&opts.out)?;
    let dir = home.draft_onnx_dir();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    let template = ChatTemplate::from_file(&dir.join("chat_template.jinja"))?;
    let pool = DraftPool::start(&DraftConfig::one_stream_per_worker(
        dir,
        home.onnxruntime_lib(),
        1,
        1,
    ))?;
    let logs = home.log("bench-oracle").with_extension("d");
    let server = servers::start_llama(&home, Layout::Shared, false, &logs).await?;
    let target = servers::llama_client(&server.url, "target")?;
    let prompts = StudyPrompts::read(opts, &home, &tok, &template)?;
    let mut configs = vec![Decide::TargetOnly, Decide::DraftOnly];
    configs.extend(opts.rules.iter().map(|r| Decide::Rule(*r)));
    configs.extend(opts.verifiers.iter().cloned().map(Decide::Verifier));
    configs.extend(opts.judged.iter().cloned().map(Decide::Judged));
    // Keyed by the target model: answers from another target are not this one's.
    let store = home.work("bench-oracle-asked").join(format!(
        "{}-top{TOP_K}",
        approxy_verifier::home::TARGET_GGUF_NAME
    ));
    std::fs::create_dir_all(&store)?;
    let sandbox = Sandbox::detect().await;
    // Absolute (the check runs python in this directory on a path inside it), and outside
    // the results.
    let scratch = std::path::absolute(home.work("bench-oracle-exec"))?;
    let study = Study {
        opts,
        pool: &pool,
        target: &target,
        tok: &tok,
        sandbox,
        scratch: &scratch,
        store: &store,
        configs: &configs,
        problems: &prompts.problems,
    };
    let mut results = StudyResults::default();
    for (kind, prompts, max_tokens, stops) in [
        ("code", &prompts.code, opts.max_tokens, &humaneval::STOP[..]),
        ("chat", &prompts.chat, opts.chat_max_tokens, &[][..]),
        (
            "instructions",
            &prompts.instructions,
            opts.instructions_max_tokens,
            &[][..],
        ),
    ] {
        if prompts.is_empty() {
            continue;
        }
        study
            .run_kind(kind, prompts, max_tokens, stops, &mut results)
            .await?;
        if kind == "instructions" {
            let runs: Vec<(String, Vec<(String, String)>)> = results
                .all
                .iter()
                .filter(|r| r.0 == kind)
                .map(|r| {
                    let answers = r.2.iter().map(|a| (a.id.clone(), a.text.clone()));
                    (r.1.clone(), answers.collect())
                })
                .collect();
            let scores = score_instructions(&home, &opts.instructions_dir, &scratch, &runs).await?;
            for s in results.summaries.iter_mut().filter(|s| s.kind == kind) {
                s.instructions = scores.get(&s.config).copied();
            }
        }
        write_report(opts, &results.summaries, &results.all)?;
    }
    server.stop().await;
    let md = write_report(opts, &results.summaries, &results.all)?;
    println!("{md}");
    Ok(())
}

/// The study's prompts, tokenized, per kind; and the HumanEval problems behind the code ones.
struct StudyPrompts {
    problems: Vec<HumanEvalProblem>,
    code: Vec<Prompt>,
    chat: Vec<Prompt>,
    instructions: Vec<Prompt>,
}

impl StudyPrompts {
    /// Reads as many of each kind as `opts` asks for (chat and instruction prompts rendered
    /// through the draft's chat template).
    fn read(
        opts: &OracleOptions,
        home: &Home,
        tok: &Tokenizer,
        template: &ChatTemplate,
    ) -> anyhow::Result<Self> {
        let problems = humaneval::sample(
            load_human_eval(&home.human_eval()).context("HumanEval (run `approxy setup`)")?,
            opts.problems,
        );
        let problems = if opts.problems == 0 {
            Vec::new()
        } else {
            problems
        };
        let corpus: Vec<CorpusPrompt> = approxy_training::corpus::load(&opts.corpus)?;
        let chat = if opts.chat == 0 {
            Vec::new()
        } else {
            held_out_chat(&corpus, opts.chat)
        };
        let code_prompts: Vec<Prompt> = problems
            .iter()
            .map(|p| {
                Ok(Prompt {
                    id: p.task_id.clone(),
                    ids: tok.encode(&p.prompt)?,
                })
            })
            .collect::<anyhow::Result<_>>()?;
        let chat_prompts: Vec<Prompt> = chat
            .iter()
            .map(|p| {
                let messages = [ChatMessage::new("user".into(), p.prompt.clone())];
                Ok(Prompt {
                    id: p.id.to_string(),
                    ids: tok.encode(&template.render(&messages)?)?,
                })
            })
            .collect::<anyhow::Result<_>>()?;
        let instruction_prompts: Vec<Prompt> = if opts.instructions == 0 {
            Vec::new()
        } else {
            let path = opts.instructions_dir.join("prompts.jsonl");
            std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?
                .lines()
                .filter(|l| !l.trim().is_empty())
                .take(opts.instructions)
                .map(|l| {
                    let p: InstructionPrompt = serde_json::from_str(l)?;
                    let messages = [ChatMessage::new("user".into(), p.prompt)];
                    Ok(Prompt {
                        id: p.id,
                        ids: tok.encode(&template.render(&messages)?)?,
                    })
                })
                .collect::<anyhow::Result<_>>()?
        };
        Ok(Self {
            problems,
            code: code_prompts,
            chat: chat_prompts,
            instructions: instruction_prompts,
        })
    }
}

/// What the study runs with: the draft, the target, and where checks and asked calls live.
struct Study<'a> {
    opts: &'a OracleOptions,
    pool: &'a DraftPool,
    target: &'a approxy_verifier::targets::LlamaCppTarget,
    tok: &'a Tokenizer,
    sandbox: Sandbox,
    scratch: &'a std::path::Path,
    store: &'a std::path::Path,
    configs: &'a [Decide],
    problems: &'a [HumanEvalProblem],
}

/// The study's results so far: one summary per (kind, configuration), and the answers
/// behind each as (kind, configuration, answers).
#[derive(Default)]
struct StudyResults {
    summaries: Vec<OracleSummary>,
    all: Vec<(String, String, Vec<OracleAnswer>)>,
}

impl Study<'_> {
    /// Answers every prompt of `kind` under every configuration, target-only first.
    async fn run_kind(
        &self,
        kind: &str,
        prompts: &[Prompt],
        max_tokens: u32,
        stops: &[&str],
        results: &mut StudyResults,
    ) -> anyhow::Result<()> {
        let mut reference: Option<Vec<OracleAnswer>> = None;
        let mut asked: Vec<Asked> = prompts
            .iter()
            .map(|p| {
                let name: String = format!("{kind}-{}", p.id)
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '-' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                Asked::open(
                    &self.store.join(format!("{name}.jsonl")),
                    &p.ids,
                    self.opts.fresh,
                )
            })
            .collect::<anyhow::Result<_>>()?;
        for decide in self.configs {
            let started = Instant::now();
            let mut answers = Vec::new();
            for (p, asked) in prompts.iter().zip(&mut asked) {
                let lease = self.pool.try_lease().context("no idle draft worker")?;
                let a = decode(
                    lease.as_ref(),
                    self.target,
                    self.tok,
                    p,
                    max_tokens,
                    stops,
                    kind,
                    decide,
                    asked,
                )
                .await?;
                tracing::info!(kind, config = %decide.name(), id = %a.id, tokens = a.tokens, target = a.target_tokens, "answer");
                answers.push(a);
            }
            let seconds = started.elapsed().as_secs_f64();
            if kind == "code" {
                for (a, p) in answers.iter_mut().zip(self.problems) {
                    let v = humaneval::check(
                        self.sandbox,
                        p,
                        &a.text,
                        self.scratch,
                        Duration::from_secs(20),
                    )
                    .await?;
                    a.verdict = Some(v);
                }
            }
            // Target-only runs first: every configuration, itself included, is compared with it.
            if *decide == Decide::TargetOnly {
                reference = Some(answers.clone());
            }
            results.summaries.push(summarize(
                &decide.name(),
                kind,
                &answers,
                reference.as_deref(),
                seconds,
            ));
            results.all.push((kind.to_string(), decide.name(), answers));
        }
        Ok(())
    }
}

/// Writes `oracle.json` and `oracle.md` for the kinds finished so far (after each kind, so an
/// interrupted study keeps what it measured), and returns the Markdown.
fn write_report(
    opts: &OracleOptions,
    summaries: &[OracleSummary],
    all: &[(String, String, Vec<OracleAnswer>)],
) -> anyhow::Result<String> {
    let mut summaries = summaries.to_vec();
    gap_closed(&mut summaries);
    let classes = cost_classes(opts.busy_from.as_deref());
    fill_cheapest(&mut summaries, all, &classes);
    let done: Vec<&str> = summaries.iter().map(|s| s.kind.as_str()).collect();
    let report = OracleReport {
        date: utc_now(),
        machine: Machine::read(),
        max_tokens: [
            ("code", opts.max_tokens),
            ("chat", opts.chat_max_tokens),
            ("instructions", opts.instructions_max_tokens),
        ]
        .into_iter()
        .filter(|k| done.contains(&k.0))
        .map(|(k, n)| (k.to_string(), n))
        .collect(),
        summaries,
        answers: all.to_vec(),
        classes,
    };
    std::fs::write(
        opts.out.join("oracle.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    let md = markdown(&report);
    std::fs::write(opts.out.join("oracle.md"), &md)?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The instruction-following scorer installs from its pinned requirements into a venv of
    /// its own and passes its self-test there (crafted answers that must pass and must fail
    /// each instruction type of the set, and a small answer file scored to known figures).
    #[test]
    fn the_instruction_scorer_installs_and_passes_its_self_test() -> anyhow::Result<()> {
        let home = Home::from_env()?;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("instructions");
        let venv =
            approxy_setup::requirements_venv(&home, "instructions", &dir.join("requirements.txt"))?;
        let out = std::process::Command::new(venv.join("bin").join("python"))
            .arg(dir.join("score.py"))
            .arg("--self-test")
            .output()?;
        let said = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{said}");
        assert!(
            said.contains("40 prompts") && said.contains(" 0 failed"),
            "{said}"
        );
        Ok(())
    }
}
