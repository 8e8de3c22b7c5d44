//! Prompt lookup for the draft (after Saxena's prompt lookup decoding): where the sequence's
//! last few tokens also occur earlier in it, in the prompt or in the answer so far, the tokens
//! that followed there are proposed. The draft runs the token it is about to commit and the
//! proposals in one forward pass ([`super::cursor::Cursor::feed`]); each proposal that then is
//! the draft's own pick is committed at no further cost, and the first that is not rolls the
//! rest back. So every token is still the draft's, judged by the verifier as any other: the
//! lookup only decides what the draft computes ahead. Copied text (a function rewritten, a
//! passage quoted) costs one pass for several tokens.

use std::collections::HashMap;

/// The sequence so far and, for each run of 3 and of 2 tokens in it, where the tokens after
/// its most recent earlier occurrence start. A longer run is tried first, as it predicts
/// better; a single token predicts too poorly to be worth a pass. Fixed-size keys: indexing a
/// prompt of thousands of tokens allocates nothing per token.
pub(super) struct Lookup {
    seq: Vec<u32>,
    prompt_len: usize,
    after3: HashMap<[u32; 3], usize>,
    after2: HashMap<[u32; 2], usize>,
    /// Most tokens proposed at once.
    most: usize,
}

impl Lookup {
    /// A lookup over `prompt`, proposing at most `most` tokens at once.
    pub(super) fn new(prompt: &[u32], most: usize) -> Self {
        let mut l = Self {
            seq: Vec::with_capacity(prompt.len() + 256),
            prompt_len: prompt.len(),
            after3: HashMap::with_capacity(prompt.len()),
            after2: HashMap::with_capacity(prompt.len()),
            most,
        };
        for &t in prompt {
            l.push(t);
        }
        l
    }

    /// Appends the answer's tokens not appended yet: `answer` is everything emitted so far (it
    /// only ever grows).
    pub(super) fn catch_up(&mut self, answer: &[u32]) {
        let have = self.seq.len() - self.prompt_len;
        for &t in answer.get(have..).unwrap_or_default() {
            self.push(t);
        }
    }

    /// Appends one token. The runs that ended just before it are now followed by it: they are
    /// indexed, so that the runs ending at the sequence's end find their earlier occurrences,
    /// never themselves.
    fn push(&mut self, token: u32) {
        let end = self.seq.len();
        self.seq.push(token);
        let s = &self.seq;
        if end >= 3 {
            self.after3
                .insert([s[end - 3], s[end - 2], s[end - 1]], end);
        }
        if end >= 2 {
            self.after2.insert([s[end - 2], s[end - 1]], end);
        }
    }

    /// The tokens that followed the most recent earlier occurrence of the sequence's last run,
    /// the longest run that occurred before first; empty when none did.
    pub(super) fn propose(&self) -> &[u32] {
        let (s, len) = (&self.seq, self.seq.len());
        let from = (len >= 3)
            .then(|| self.after3.get(&[s[len - 3], s[len - 2], s[len - 1]]))
            .flatten()
            .or_else(|| {
                (len >= 2)
                    .then(|| self.after2.get(&[s[len - 2], s[len - 1]]))
                    .flatten()
            });
        from.map_or(&[], |&from| &s[from..(from + self.most).min(len)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tokens_after_the_last_runs_earlier_occurrence_are_proposed() {
        // "def f(x): return x" and the answer starts copying it.
        let prompt = [1, 2, 3, 4, 5, 6, 7, 8];
        let mut l = Lookup::new(&prompt, 4);
        l.catch_up(&[9, 2, 3]);
        assert_eq!(l.propose(), &[4, 5, 6, 7]);
        l.catch_up(&[9, 2, 3, 4, 5, 6, 7, 8]);
        // The run [6, 7, 8] last occurred at the prompt's end: nothing after it but itself.
        assert_eq!(l.propose(), &[9, 2, 3, 4]);
        // A run never seen before proposes nothing.
        l.catch_up(&[9, 2, 3, 4, 5, 6, 7, 8, 42, 43]);
        assert!(l.propose().is_empty());
    }

    #[test]
    fn the_longest_run_wins_and_the_most_recent_occurrence() {
        let prompt = [1, 2, 10, 5, 2, 11, 7, 1, 2, 12];
        let mut l = Lookup::new(&prompt, 1);
        l.catch_up(&[5, 2]);
        // [5, 2] occurred once (then 11); [2] alone is too short to count.
        assert_eq!(l.propose(), &[11]);
        l.catch_up(&[5, 2, 0, 1, 2]);
        // [0, 1, 2] never occurred; [1, 2] last did before 12.
        assert_eq!(l.propose(), &[12]);
    }
}
