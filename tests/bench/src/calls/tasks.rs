//! The sample's prompts, rendered for the target.

use anyhow::Context;
use approxy_setup::Home;
use approxy_training::corpus::load_human_eval;
use approxy_verifier::template::{ChatMessage, ChatTemplate};

use super::options::{CallsOptions, Sample};
use crate::chat_sample::held_out_chat;
use crate::humaneval;
use crate::instructions::InstructionPrompt;

pub(crate) struct Task {
    pub(crate) id: String,
    pub(crate) prompt: String,
    pub(crate) problem: Option<approxy_training::corpus::HumanEvalProblem>,
}

pub(crate) fn tasks(home: &Home, opts: &CallsOptions) -> anyhow::Result<Vec<Task>> {
    let (sample, n, corpus) = (opts.sample, opts.prompts, opts.corpus.as_path());
    let render = |content: &str| -> anyhow::Result<String> {
        let template = ChatTemplate::from_file(&home.draft_onnx_dir().join("chat_template.jinja"))?;
        Ok(template.render(&[ChatMessage::new("user".into(), content.to_string())])?)
    };
    Ok(match sample {
        Sample::Instructions | Sample::Copy => {
            let dir = if sample == Sample::Copy {
                &opts.copy_dir
            } else {
                &opts.instructions_dir
            };
            let path = dir.join("prompts.jsonl");
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .take(n)
                .map(|l| {
                    let p: InstructionPrompt = serde_json::from_str(l)?;
                    Ok(Task {
                        prompt: render(&p.prompt)?,
                        id: p.id,
                        problem: None,
                    })
                })
                .collect::<anyhow::Result<_>>()?
        }
        Sample::HumanEval => {
            let all =
                load_human_eval(&home.human_eval()).context("HumanEval (run `approxy setup`)")?;
            humaneval::sample(all, n)
                .into_iter()
                .map(|p| Task {
                    id: p.task_id.clone(),
                    prompt: p.prompt.clone(),
                    problem: Some(p),
                })
                .collect()
        }
        Sample::Chat => {
            let corpus = approxy_training::corpus::load(corpus)?;
            let template =
                ChatTemplate::from_file(&home.draft_onnx_dir().join("chat_template.jinja"))?;
            held_out_chat(&corpus, n)
                .into_iter()
                .map(|p| {
                    let prompt =
                        template.render(&[ChatMessage::new("user".into(), p.prompt.clone())])?;
                    Ok(Task {
                        id: format!("chat/{}", p.id),
                        prompt,
                        problem: None,
                    })
                })
                .collect::<anyhow::Result<_>>()?
        }
    })
}
