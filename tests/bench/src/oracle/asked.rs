//! What the target said at each answer prefix, kept on disk per prompt and reused.

use std::collections::HashMap;

use approxy_verifier::verify::TargetProbs;
use serde::{Deserialize, Serialize};

/// What the target said at each answer prefix already asked about, for one prompt: its greedy
/// token and top-k there. Greedy and deterministic, so configurations that share a prefix (all
/// of them share the first position; `identical` follows target-only's path throughout) need
/// not ask again, nor does a later run on this machine: the answers are kept on disk, one file
/// per prompt, whose first line is the prompt's token ids (another prompt under the same name
/// starts the file over).
pub(super) struct Asked {
    known: HashMap<Vec<u32>, (u32, TargetProbs)>,
    file: std::fs::File,
}

#[derive(Serialize, Deserialize)]
struct AskedLine {
    answer: Vec<u32>,
    token: u32,
    top: Vec<(u32, f32)>,
}

impl Asked {
    /// The store of prompt `ids` at `path`, with what an earlier run kept there.
    pub(super) fn open(path: &std::path::Path, ids: &[u32], fresh: bool) -> anyhow::Result<Self> {
        use std::io::{BufRead, Write};
        let mut known = HashMap::new();
        let header = serde_json::to_string(ids)?;
        let reusable = !fresh
            && std::fs::File::open(path).is_ok_and(|f| {
                let mut lines = std::io::BufReader::new(f).lines();
                if lines.next().and_then(Result::ok).as_deref() != Some(header.as_str()) {
                    return false;
                }
                // A line cut short by a killed run ends what is read.
                for l in lines.map_while(Result::ok) {
                    let Ok(a) = serde_json::from_str::<AskedLine>(&l) else {
                        break;
                    };
                    known.insert(a.answer, (a.token, TargetProbs { top: a.top }));
                }
                true
            });
        let file = if reusable {
            // Rewritten whole, so a cut line is not followed by good ones.
            let mut f = std::fs::File::create(path)?;
            writeln!(f, "{header}")?;
            for (answer, (token, probs)) in &known {
                let line = AskedLine {
                    answer: answer.clone(),
                    token: *token,
                    top: probs.top.clone(),
                };
                writeln!(f, "{}", serde_json::to_string(&line)?)?;
            }
            f
        } else {
            known.clear();
            let mut f = std::fs::File::create(path)?;
            writeln!(f, "{header}")?;
            f
        };
        Ok(Self { known, file })
    }

    pub(super) fn get(&self, answer: &[u32]) -> Option<&(u32, TargetProbs)> {
        self.known.get(answer)
    }

    pub(super) fn insert(
        &mut self,
        answer: Vec<u32>,
        token: u32,
        probs: TargetProbs,
    ) -> anyhow::Result<()> {
        use std::io::Write;
        let line = AskedLine {
            answer,
            token,
            top: probs.top,
        };
        writeln!(self.file, "{}", serde_json::to_string(&line)?)?;
        self.known
            .insert(line.answer, (line.token, TargetProbs { top: line.top }));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the target said is kept per prompt and read back by the next run; a line cut by a
    /// killed run ends the reading, and a file of another prompt (or `--fresh`) starts over.
    #[test]
    fn target_answers_are_kept_per_prompt_and_reused() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("chat-1.jsonl");
        let probs = |t: u32| TargetProbs {
            top: vec![(t, -0.1), (t + 1, -2.5)],
        };
        let mut a = Asked::open(&path, &[1, 2, 3], false)?;
        a.insert(vec![], 7, probs(7))?;
        a.insert(vec![7], 8, probs(8))?;
        drop(a);
        let mut text = std::fs::read_to_string(&path)?;
        text.push_str("{\"answer\":[7,8],\"tok");
        std::fs::write(&path, text)?;
        let b = Asked::open(&path, &[1, 2, 3], false)?;
        assert_eq!(b.get(&[]), Some(&(7, probs(7))));
        assert_eq!(b.get(&[7]), Some(&(8, probs(8))));
        assert_eq!(b.get(&[7, 8]), None);
        drop(b);
        // Rewritten without the cut line: still both answers.
        assert_eq!(Asked::open(&path, &[1, 2, 3], false)?.known.len(), 2);
        assert!(Asked::open(&path, &[1, 2, 4], false)?.known.is_empty());
        assert!(Asked::open(&path, &[1, 2, 4], false)?.known.is_empty());
        let mut c = Asked::open(&path, &[1, 2, 3], false)?;
        c.insert(vec![], 7, probs(7))?;
        drop(c);
        assert!(Asked::open(&path, &[1, 2, 3], true)?.known.is_empty());
        Ok(())
    }
}
