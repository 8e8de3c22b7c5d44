//! The draft as the decode loop drives it: the committed sequence (the prompt and everything
//! emitted) plus the tokens fed beyond it, each with the draft's output after it. Tokens go
//! ahead in two ways: a window's tokens while the target scores them, and, with overlap on,
//! the draft's own best guesses while a target call is in flight (CARD-style: drafting does
//! not stop while the target works). Committing a token that was already fed ahead reuses its
//! output at no cost; a different token rolls back everything ahead of it.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::Either;

use crate::draft::{Draft, PositionOutput};
use crate::error::EngineError;

/// Why a position was fed beyond the committed sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// To be committed (a window's token, target tokens that arrived together).
    Fed,
    /// The draft's own guess while a target call was in flight (overlap).
    Guess,
    /// A prompt lookup's proposal (see `lookup`).
    Lookup,
}

/// One position fed beyond the committed sequence.
struct Ahead {
    token: u32,
    /// The draft's output after `token`.
    out: PositionOutput,
    origin: Origin,
}

/// See the module documentation.
pub(super) struct Cursor<'d> {
    draft: &'d dyn Draft,
    ahead: VecDeque<Ahead>,
    /// Time spent in draft inference, overlapped or not.
    pub(super) time: Duration,
    /// Guesses drafted while a target call was in flight.
    pub(super) guessed: u64,
    /// Of those, guesses that the answer then took (their draft work was not wasted).
    pub(super) guesses_used: u64,
    /// Tokens proposed by prompt lookup and fed ahead.
    pub(super) looked_up: u64,
    /// Of those, proposals the answer then took.
    pub(super) looked_up_used: u64,
}

/// Most guesses ahead while a window call is in flight: the largest window, which the guesses
/// become when the target accepts the window.
pub const OVERLAP_MAX_AHEAD: usize = 16;

fn output(mut outs: Vec<PositionOutput>) -> Result<PositionOutput, EngineError> {
    outs.pop()
        .ok_or_else(|| EngineError::Draft("no output after extend".into()))
}

impl<'d> Cursor<'d> {
    pub(super) fn new(draft: &'d dyn Draft) -> Self {
        Self {
            draft,
            ahead: VecDeque::new(),
            time: Duration::ZERO,
            guessed: 0,
            guesses_used: 0,
            looked_up: 0,
            looked_up_used: 0,
        }
    }

    /// A position ahead of this origin is taken (committed, or made a window's token): a guess
    /// or a proposal used.
    fn took(&mut self, origin: Origin) {
        match origin {
            Origin::Guess => self.guesses_used += 1,
            Origin::Lookup => self.looked_up_used += 1,
            Origin::Fed => {}
        }
    }

    /// Makes the committed sequence `prompt`; the output at its last position.
    pub(super) async fn prefill(
        &mut self,
        prompt: Vec<u32>,
    ) -> Result<PositionOutput, EngineError> {
        let t = Instant::now();
        let out = self.draft.prefill(prompt).await;
        self.time += t.elapsed();
        self.ahead.clear();
        out
    }

    /// Appends `tokens` to the committed sequence; the output after the last. Tokens already
    /// fed ahead in the same order cost nothing; at the first that differs, everything still
    /// ahead is rolled back and the rest is fed in one draft call.
    pub(super) async fn commit(&mut self, tokens: &[u32]) -> Result<PositionOutput, EngineError> {
        let mut last = None;
        let mut rest = tokens;
        while let Some((&t, tail)) = rest.split_first() {
            match self.ahead.front() {
                Some(a) if a.token == t => {}
                _ => break,
            }
            if let Some(a) = self.ahead.pop_front() {
                self.took(a.origin);
                last = Some(a.out);
            }
            rest = tail;
        }
        if rest.is_empty() {
            return last.ok_or_else(|| EngineError::Draft("nothing to commit".into()));
        }
        self.discard().await?;
        let t = Instant::now();
        let out = self.draft.extend(rest.to_vec(), false).await;
        self.time += t.elapsed();
        output(out?)
    }

    /// Feeds `tokens` ahead of the committed sequence, after those of them already ahead in the
    /// same order, in one draft call with an output at every position: committing them one by
    /// one afterwards costs nothing. One extend of k tokens reads the weights once where k
    /// single extends read them k times (target tokens that arrived together, a span's backlog).
    /// The last `proposed` of them are a prompt lookup's proposals.
    pub(super) async fn feed(
        &mut self,
        tokens: &[u32],
        proposed: usize,
    ) -> Result<(), EngineError> {
        let have = self
            .ahead
            .iter()
            .zip(tokens)
            .take_while(|(a, t)| a.token == **t)
            .count();
        self.truncate(have).await?;
        let rest = &tokens[have..];
        if rest.is_empty() {
            return Ok(());
        }
        let t = Instant::now();
        let outs = self.draft.extend(rest.to_vec(), true).await;
        self.time += t.elapsed();
        let outs = outs?;
        if outs.len() != rest.len() {
            return Err(EngineError::Draft(format!(
                "{} outputs after extending by {} tokens",
                outs.len(),
                rest.len()
            )));
        }
        let from_lookup = tokens.len() - proposed.min(tokens.len());
        self.ahead
            .extend(rest.iter().zip(outs).enumerate().map(|(i, (&token, out))| {
                let lookup = have + i >= from_lookup;
                self.looked_up += u64::from(lookup);
                Ahead {
                    token,
                    out,
                    origin: if lookup { Origin::Lookup } else { Origin::Fed },
                }
            }));
        Ok(())
    }

    /// Makes `token` the `i`-th position ahead of the committed sequence (a window's token);
    /// the draft's output after it. Reused when it is there already (a guess the window
    /// follows); otherwise what is ahead from `i` on is rolled back and `token` is fed.
    pub(super) async fn ahead_at(
        &mut self,
        i: usize,
        token: u32,
    ) -> Result<&PositionOutput, EngineError> {
        if self.ahead.get(i).is_some_and(|a| a.token == token) {
            // Counted once: as a window token it is no longer a guess or a proposal.
            if let Some(origin) = self
                .ahead
                .get_mut(i)
                .map(|a| std::mem::replace(&mut a.origin, Origin::Fed))
            {
                self.took(origin);
            }
        } else {
            self.truncate(i).await?;
            let t = Instant::now();
            let out = self.draft.extend(vec![token], false).await;
            self.time += t.elapsed();
            self.ahead.push_back(Ahead {
                token,
                out: output(out?)?,
                origin: Origin::Fed,
            });
        }
        self.ahead
            .get(i)
            .map(|a| &a.out)
            .ok_or_else(|| EngineError::Draft("nothing ahead".into()))
    }

    /// The output after the token at position `i` ahead, when that token is `token`.
    pub(super) fn ahead_output(&self, i: usize, token: u32) -> Option<&PositionOutput> {
        self.ahead
            .get(i)
            .filter(|a| a.token == token)
            .map(|a| &a.out)
    }

    /// Rolls back what is ahead from position `i` on.
    async fn truncate(&mut self, i: usize) -> Result<(), EngineError> {
        let n = self.ahead.len().saturating_sub(i);
        if n == 0 {
            return Ok(());
        }
        self.ahead.truncate(i);
        self.draft.rollback(n).await
    }

    /// Positions fed beyond the committed sequence.
    #[cfg(test)]
    pub(super) fn ahead(&self) -> usize {
        self.ahead.len()
    }

    /// Whether nothing is fed beyond the committed sequence.
    pub(super) fn is_clear(&self) -> bool {
        self.ahead.is_empty()
    }

    /// Rolls back everything fed ahead.
    pub(super) async fn discard(&mut self) -> Result<(), EngineError> {
        self.truncate(0).await
    }

    /// Awaits `call`. With `max_guesses` > 0, the draft meanwhile keeps going along its own
    /// best guess: first `first = (i, token)` when given (a window's last token, at position
    /// `i` ahead, unless it is there already), then its top token after the last position
    /// ahead (`from` when nothing is ahead), until the call
    /// returns, `max_guesses` guesses are ahead, or a guess is in `stop_at`. A draft step
    /// that started before the call returned is finished first: dropping it would leave the
    /// draft's cache holding a token the cursor does not know of.
    pub(super) async fn overlap<T>(
        &mut self,
        call: impl Future<Output = T>,
        from: &PositionOutput,
        first: Option<(usize, u32)>,
        max_guesses: usize,
        stop_at: &[u32],
    ) -> Result<T, EngineError> {
        if max_guesses == 0 {
            return Ok(call.await);
        }
        let mut call = pin!(call);
        let draft = self.draft;
        let mut first = match first {
            Some((i, token)) => {
                if self.ahead.get(i).is_some_and(|a| a.token == token) {
                    None
                } else {
                    self.truncate(i).await?;
                    Some(token)
                }
            }
            _ => None,
        };
        loop {
            // An answer that is already in is taken without starting another guess.
            if let Some(v) = call.as_mut().now_or_never() {
                return Ok(v);
            }
            let guess = match first.take() {
                Some(g) => g,
                None => self.ahead.back().map_or(from, |a| &a.out).top1(),
            };
            let guesses = self
                .ahead
                .iter()
                .filter(|a| a.origin == Origin::Guess)
                .count();
            if guesses >= max_guesses || stop_at.contains(&guess) {
                return Ok(call.await);
            }
            let t = Instant::now();
            let started = AtomicBool::new(false);
            let mut step = pin!(async {
                started.store(true, Ordering::Relaxed);
                draft.extend(vec![guess], false).await
            });
            let first_done = tokio::select! {
                biased;
                v = &mut call => Either::Left(v),
                s = &mut step => Either::Right(s),
            };
            let (answer, stepped) = match first_done {
                Either::Left(v) if !started.load(Ordering::Relaxed) => return Ok(v),
                Either::Left(v) => (Some(v), step.await),
                Either::Right(s) => (None, s),
            };
            self.time += t.elapsed();
            self.guessed += 1;
            self.ahead.push_back(Ahead {
                token: guess,
                out: output(stepped?)?,
                origin: Origin::Guess,
            });
            if let Some(v) = answer {
                return Ok(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draft::DraftWorkers;
    use crate::testing::{DraftScript, IM_START, ScriptedWorkers};

    fn bytes(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    #[tokio::test]
    async fn committing_what_was_fed_ahead_costs_no_draft_step() -> Result<(), EngineError> {
        let workers = ScriptedWorkers::new(DraftScript::says("abcdef", 0.9), 1);
        let lease = workers.try_lease().ok_or(EngineError::WorkerGone)?;
        let mut c = Cursor::new(lease.as_ref());
        let start = c.prefill(vec![IM_START]).await?;
        assert_eq!(start.top1(), u32::from(b'a'));
        for (i, t) in bytes("abc").into_iter().enumerate() {
            c.ahead_at(i, t).await?;
        }
        let steps = workers.steps();
        let out = c.commit(&bytes("ab")).await?;
        assert_eq!(workers.steps(), steps, "reused, not recomputed");
        assert_eq!(out.top1(), u32::from(b'c'));
        assert_eq!(c.ahead(), 1);
        // A different token rolls back what is ahead and is fed in one step.
        let out = c.commit(&bytes("xy")).await?;
        assert_eq!(workers.steps(), steps + 1);
        assert_eq!(c.ahead(), 0);
        // The scripted draft's answer position counts from the prompt: "abxy" then 'e'.
        assert_eq!(out.top1(), u32::from(b'e'));
        Ok(())
    }

    #[tokio::test]
    async fn overlap_drafts_guesses_until_the_call_returns_and_finishes_its_step()
    -> Result<(), EngineError> {
        let workers = ScriptedWorkers::new(DraftScript::says("abcdefghij", 0.9), 1);
        let lease = workers.try_lease().ok_or(EngineError::WorkerGone)?;
        let mut c = Cursor::new(lease.as_ref());
        let start = c.prefill(vec![IM_START]).await?;
        // A call that never returns: the guesses stop at the cap.
        let never = std::future::pending::<()>();
        let capped = tokio::time::timeout(
            Duration::from_millis(200),
            c.overlap(never, &start, None, 4, &[]),
        )
        .await;
        assert!(capped.is_err(), "the call never returns");
        // The timeout dropped the overlap between steps or inside one; what the cursor knows
        // is ahead is at most the cap.
        assert!(c.ahead() <= 4);
        c.discard().await?;
        let start = c.prefill(vec![IM_START]).await?;
        let v = c.overlap(async { 7 }, &start, None, 4, &[]).await?;
        assert_eq!(v, 7);
        // An answer that is in at once starts no guess.
        assert_eq!(c.ahead(), 0);
        let slow = async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            8
        };
        assert_eq!(c.overlap(slow, &start, None, 2, &[]).await?, 8);
        assert_eq!(c.ahead(), 2, "guesses stop at the cap");
        let out = c.commit(&bytes("ab")).await?;
        assert_eq!(out.top1(), u32::from(b'c'));
        // Four guesses drafted before the timeout, rolled back; then two, both used.
        assert_eq!((c.guessed, c.guesses_used), (6, 2));
        Ok(())
    }

    #[tokio::test]
    async fn a_guess_that_ends_the_answer_is_not_drafted_past() -> Result<(), EngineError> {
        let workers = ScriptedWorkers::new(DraftScript::says("ab", 0.9), 1);
        let lease = workers.try_lease().ok_or(EngineError::WorkerGone)?;
        let mut c = Cursor::new(lease.as_ref());
        let start = c.prefill(vec![IM_START]).await?;
        let eos = crate::testing::IM_END;
        let slow = tokio::time::sleep(Duration::from_millis(50));
        c.overlap(slow, &start, None, 8, &[eos]).await?;
        assert_eq!(c.ahead(), 2, "a and b, not the end marker");
        Ok(())
    }
}
