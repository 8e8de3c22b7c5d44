//! The chat sample: everyday chat prompts from the training corpus that no verifier was fitted
//! or calibrated on, and how close an answer is to the target's own (exact match, ROUGE-L).

pub use approxy_training::corpus::held_out_chat;

fn words(s: &str) -> Vec<&str> {
    s.split_whitespace().collect()
}

/// ROUGE-L F1 between two texts over whitespace-separated words: the longest common
/// subsequence against both lengths. 1 for identical texts, 0 when nothing is shared.
pub fn rouge_l(candidate: &str, reference: &str) -> f64 {
    let (c, r) = (words(candidate), words(reference));
    if c.is_empty() || r.is_empty() {
        return if c.is_empty() && r.is_empty() {
            1.0
        } else {
            0.0
        };
    }
    // One row of the LCS table at a time.
    let mut prev = vec![0usize; r.len() + 1];
    for cw in &c {
        let mut row = vec![0usize; r.len() + 1];
        for (j, rw) in r.iter().enumerate() {
            row[j + 1] = if cw == rw {
                prev[j] + 1
            } else {
                row[j].max(prev[j + 1])
            };
        }
        prev = row;
    }
    let lcs = prev[r.len()] as f64;
    if lcs == 0.0 {
        return 0.0;
    }
    let (p, rec) = (lcs / c.len() as f64, lcs / r.len() as f64);
    2.0 * p * rec / (p + rec)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn rouge_l_is_one_for_equal_texts_and_counts_the_common_subsequence() {
        assert_eq!(rouge_l("a b c", "a b c"), 1.0);
        assert_eq!(rouge_l("x y", "a b"), 0.0);
        // LCS "a c" of 3 and 4 words: p = 2/3, r = 1/2.
        let f = rouge_l("a b c", "a x c y");
        assert!((f - 2.0 * (2.0 / 3.0) * 0.5 / (2.0 / 3.0 + 0.5)).abs() < 1e-12);
        assert_eq!(rouge_l("", ""), 1.0);
        assert_eq!(rouge_l("a", ""), 0.0);
    }

    #[test]
    fn the_chat_sample_is_held_out_from_the_shipped_calibration_and_from_humaneval()
    -> anyhow::Result<()> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let corpus = approxy_training::corpus::load(&root.join("training/data/prompts.jsonl"))?;
        let sample = held_out_chat(&corpus, 40);
        assert_eq!(sample.len(), 40);
        assert!(sample.iter().all(|p| p.kind == "chat"));
        // The prompts `approxy train collect --prompts 300` (training/scripts/train-default.sh, the
        // shipped calibration) reads: 150 chat prompts, its sources in turn.
        let script = std::fs::read_to_string(root.join("training/scripts/train-default.sh"))?;
        assert!(
            script.contains("PROMPTS=\"${1:-300}\""),
            "the default changed"
        );
        let used: std::collections::HashSet<u32> =
            approxy_training::corpus::select(&corpus, "chat", 150)
                .iter()
                .map(|p| p.id)
                .collect();
        assert_eq!(used.len(), 150);
        assert!(sample.iter().all(|p| !used.contains(&p.id)));
        let texts: std::collections::HashSet<&str> = corpus
            .iter()
            .filter(|p| used.contains(&p.id))
            .map(|p| p.prompt.as_str())
            .collect();
        assert!(
            sample.iter().all(|p| !texts.contains(p.prompt.as_str())),
            "no duplicate text"
        );
        Ok(())
    }
}
