//! One answer decoded under one configuration, the target asked at every position.

use anyhow::Context;
use approxy_verifier::decode::WindowSize;
use approxy_verifier::targets::{ContinuationRequest, TargetClient};
use approxy_verifier::verify::{Features, TargetProbs};
use approxy_verifier::{Draft, Tokenizer};

use super::asked::Asked;
use super::decide::Decide;
use super::options::TOP_K;
use super::summary::OracleAnswer;

/// A prompt to answer.
pub(super) struct Prompt {
    pub(super) id: String,
    pub(super) ids: Vec<u32>,
}

/// The target's greedy token and top-k after `answer`: from `asked` when a configuration
/// already asked there, else from one single-token call, which `asked` then keeps.
async fn ask_target(
    target: &dyn TargetClient,
    prompt: &Prompt,
    answer: &[u32],
    asked: &mut Asked,
) -> anyhow::Result<(u32, TargetProbs)> {
    if let Some(known) = asked.get(answer).cloned() {
        return Ok(known);
    }
    let req = ContinuationRequest {
        top_logprobs: TOP_K,
        prompt_len: prompt.ids.len(),
        ..ContinuationRequest::greedy([prompt.ids.as_slice(), answer].concat(), 1)
    };
    let c = target.continue_tokens(&req).await?;
    let probs = TargetProbs {
        top: c.top_logprobs.into_iter().next().unwrap_or_default(),
    };
    let Some(&y) = c.tokens.first() else {
        anyhow::bail!("the target generated nothing after {} tokens", answer.len());
    };
    asked.insert(answer.to_vec(), y, probs.clone())?;
    Ok((y, probs))
}

/// The target's log-probability of the emitted token; a token outside its top-k counts as
/// the top-k's last, and is counted in `outside`.
fn emitted_logprob(probs: &TargetProbs, emitted: u32, outside: &mut usize) -> f32 {
    match probs.logprob(emitted) {
        Some(lp) => lp,
        None => {
            *outside += 1;
            probs.top.last().map_or(0.0, |t| t.1)
        }
    }
}

/// The open judged window while an answer decodes: its length, the draft tokens it kept, and
/// the calls made so far.
#[derive(Default)]
struct OpenWindow {
    k: usize,
    kept: usize,
    calls: usize,
}

impl OpenWindow {
    /// Whether the window keeps the draft's token here (`keep`: the target would pick it or the
    /// rule accepts it), `left` tokens before the answer's limit. A token it does not keep ends
    /// the window and its call.
    fn keeps(&mut self, pacing: &mut WindowSize, left: usize, keep: impl FnOnce() -> bool) -> bool {
        if self.kept == 0 {
            // A window opens: its length is fixed before its call, as in decoding.
            self.k = (pacing.k() as usize).min(left);
        }
        if self.kept < self.k && keep() {
            self.kept += 1;
            true
        } else {
            // The first token the window does not keep, or the call's own next token after a
            // window kept whole: the target's, and the call is over.
            pacing.update(self.kept, self.k);
            self.kept = 0;
            self.calls += 1;
            false
        }
    }
}

/// Decodes one answer, asking the target at every position it has not been asked about.
#[allow(clippy::too_many_arguments)]
pub(super) async fn decode(
    draft: &dyn Draft,
    target: &dyn TargetClient,
    tok: &Tokenizer,
    prompt: &Prompt,
    max_tokens: u32,
    stops: &[&str],
    kind: &str,
    decide: &Decide,
    asked: &mut Asked,
) -> anyhow::Result<OracleAnswer> {
    let eos = tok.end_of_sequence_ids();
    let mut out = draft.prefill(prompt.ids.clone()).await?;
    let mut answer: Vec<u32> = Vec::new();
    let (mut nll_sum, mut outside) = (0f64, 0usize);
    // The positions the target wrote (their count is its share).
    let mut target_at = Vec::new();
    // Judged windows: their pacing, the open window's length and the draft tokens it kept, and
    // the calls made.
    let mut pacing = decide.window_max().map(WindowSize::new);
    let mut window = OpenWindow::default();
    let mut text = String::new();
    while answer.len() < max_tokens as usize {
        // The draft's token and its probability exactly as the verifier and the rows see them.
        let f = Features::from_output(&out);
        let (x, q) = (f.top1, f.top1_prob);
        let (y, probs) = ask_target(target, prompt, &answer, asked).await?;
        let emitted = match &mut pacing {
            None if decide.accepts(kind, x, q, &probs) => x,
            None => {
                target_at.push(answer.len());
                y
            }
            Some(p) => {
                let left = max_tokens as usize - answer.len();
                if window.keeps(p, left, || x == y || decide.accepts(kind, x, q, &probs)) {
                    x
                } else {
                    target_at.push(answer.len());
                    y
                }
            }
        };
        nll_sum -= f64::from(emitted_logprob(&probs, emitted, &mut outside));
        answer.push(emitted);
        if eos.contains(&emitted) {
            break;
        }
        text = tok.decode(&answer)?;
        if let Some(cut) = stops.iter().filter_map(|s| text.find(s)).min() {
            text.truncate(cut);
            break;
        }
        out = draft
            .extend(vec![emitted], false)
            .await?
            .pop()
            .context("the draft gave no output")?;
    }
    if eos.iter().any(|e| answer.last() == Some(e)) {
        text = tok.decode(&answer[..answer.len() - 1])?;
    }
    // The answer ended inside a window: its call scored what it kept.
    if window.kept > 0 {
        window.calls += 1;
    }
    Ok(OracleAnswer {
        id: prompt.id.clone(),
        text,
        tokens: answer.len(),
        target_tokens: target_at.len(),
        nll_sum,
        outside_top_k: outside,
        verdict: None,
        prompt_tokens: prompt.ids.len(),
        target_at,
        window_calls: pacing.map(|_| window.calls),
    })
}

#[cfg(test)]
mod tests {
    use approxy_verifier::verify::AcceptanceRule;

    use super::super::decide::{JudgedConfig, VerifierConfig};
    use super::super::summary::summarize;
    use super::super::summary::tests::answer;
    use super::*;

    /// A target that gives, at each answer position, a fixed top list (by position after the
    /// prompt), and counts its calls.
    #[derive(Debug)]
    struct TableTarget {
        table: Vec<Vec<(u32, f32)>>,
        calls: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl TargetClient for TableTarget {
        async fn continue_tokens(
            &self,
            req: &ContinuationRequest,
        ) -> Result<approxy_verifier::targets::Continuation, approxy_verifier::TargetError>
        {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let top = self.table[req.prefix.len() - req.prompt_len].clone();
            Ok(approxy_verifier::targets::Continuation {
                tokens: vec![top[0].0],
                top_logprobs: vec![top],
                ..Default::default()
            })
        }
        async fn tokenize(
            &self,
            _: &str,
        ) -> Result<Option<Vec<u32>>, approxy_verifier::TargetError> {
            Ok(None)
        }
        async fn health(&self) -> Result<(), approxy_verifier::TargetError> {
            Ok(())
        }
    }

    /// The scripted pairs' one-token prompt, and a fresh store of what the target said.
    fn scripted_prompt() -> anyhow::Result<(Prompt, tempfile::TempDir, Asked)> {
        let prompt = Prompt {
            id: "p".into(),
            ids: vec![approxy_verifier::testing::IM_START],
        };
        let dir = tempfile::tempdir()?;
        let asked = Asked::open(&dir.path().join("p.jsonl"), &prompt.ids, false)?;
        Ok((prompt, dir, asked))
    }

    /// Each rule and a verifier decided by hand on a scripted pair: the draft says "abc" (then
    /// end of turn) at confidence 0.9; the target prefers `a` (0.95), then `x` over `b` (0.6
    /// against 0.35), then `c` (0.5), then end of turn. A rule accepting `b` (ratio:0.5) gives
    /// the draft's answer with no target token; identity and ratio:0.8 take the target's `x`.
    /// The target is asked once per distinct prefix over all configurations.
    #[tokio::test]
    async fn each_rule_decides_as_worked_out_by_hand_on_a_scripted_pair() -> anyhow::Result<()> {
        use approxy_verifier::DraftWorkers;
        use approxy_verifier::testing::{DraftScript, IM_END, ScriptedWorkers, tiny_tokenizer};
        let ln = |p: f64| p.ln() as f32;
        let (a, b, c, x) = (97u32, 98u32, 99u32, 120u32);
        let target = TableTarget {
            table: vec![
                vec![(a, ln(0.95)), (b, ln(0.03))],
                vec![(x, ln(0.6)), (b, ln(0.35))],
                vec![(c, ln(0.5)), (b, ln(0.4))],
                vec![(IM_END, ln(0.99))],
            ],
            calls: Default::default(),
        };
        let workers = ScriptedWorkers::new(DraftScript::says("abc", 0.9), 1);
        let tok = tiny_tokenizer();
        let (prompt, _dir, mut asked) = scripted_prompt()?;
        let verifier = |t: f32| {
            Decide::Verifier(VerifierConfig {
                name: format!("confidence {t}"),
                code: 0.0,
                chat: t,
            })
        };
        let cases = [
            (Decide::TargetOnly, "axc", 4),
            (Decide::DraftOnly, "abc", 0),
            (Decide::Rule(AcceptanceRule::Identical), "axc", 1),
            (Decide::Rule(AcceptanceRule::Ratio(0.8)), "axc", 1),
            (Decide::Rule(AcceptanceRule::Ratio(0.5)), "abc", 0),
            (Decide::Rule(AcceptanceRule::MEDUSA_TYPICAL), "abc", 0),
            (verifier(0.95), "axc", 4),
            (verifier(0.5), "abc", 0),
        ];
        for (decide, text, target_tokens) in cases {
            let lease = workers.try_lease().context("no draft")?;
            let got = decode(
                lease.as_ref(),
                &target,
                &tok,
                &prompt,
                16,
                &[],
                "chat",
                &decide,
                &mut asked,
            )
            .await?;
            assert_eq!(
                (got.text.as_str(), got.target_tokens, got.tokens),
                (text, target_tokens, 4),
                "{}",
                decide.name()
            );
            // Where the target wrote: all four, none, or the second (`x`).
            let at: Vec<usize> = match target_tokens {
                4 => vec![0, 1, 2, 3],
                1 => vec![1],
                _ => vec![],
            };
            assert_eq!(
                (got.target_at, got.prompt_tokens),
                (at, 1),
                "{}",
                decide.name()
            );
            let nll = if text == "abc" {
                -(ln(0.95) + ln(0.35) + ln(0.5) + ln(0.99))
            } else {
                -(ln(0.95) + ln(0.6) + ln(0.5) + ln(0.99))
            };
            assert!(
                (got.nll_sum - f64::from(nll)).abs() < 1e-5,
                "{}",
                decide.name()
            );
        }
        // Prefixes asked: "", "a", "ax", "ab", "axc", "abc".
        assert_eq!(target.calls.load(std::sync::atomic::Ordering::SeqCst), 6);
        Ok(())
    }

    /// Judged windows worked out by hand. The draft says "abcdefghij" (then end of turn) at
    /// confidence 0.9; the target agrees everywhere but at the third position (`x`). Windows
    /// start at 8 draft tokens and follow the kept lengths as decoding's pacing does.
    /// - Judged at 0.5 (the difference kept): the first window keeps 8 tokens and its call's own
    ///   next token is the target's (`i`); the second keeps `j` and the end of turn: 2 calls.
    /// - Judged at 0.95: the first window ends at `x`, the target's (1 call; the next window is
    ///   6 long: the mean of 6 and 2, plus 2); the second keeps `d` to `i` whole and ends with
    ///   the target's `j`; the third scores the end of turn: 3 calls.
    /// - A token limit of 5 cuts the first window to 5 tokens, all kept: 1 call.
    #[tokio::test]
    async fn judged_windows_are_paced_and_counted_as_worked_out_by_hand() -> anyhow::Result<()> {
        use approxy_verifier::DraftWorkers;
        use approxy_verifier::testing::{DraftScript, IM_END, ScriptedWorkers, tiny_tokenizer};
        let mut table: Vec<Vec<(u32, f32)>> = "abxdefghij"
            .bytes()
            .map(|b| vec![(u32::from(b), -0.1)])
            .collect();
        table.push(vec![(IM_END, -0.01)]);
        let target = TableTarget {
            table,
            calls: Default::default(),
        };
        let workers = ScriptedWorkers::new(DraftScript::says("abcdefghij", 0.9), 1);
        let tok = tiny_tokenizer();
        let (prompt, _dir, mut asked) = scripted_prompt()?;
        let judged = |t: &str| JudgedConfig::parse(t).map(Decide::Judged);
        let cases = [
            (judged("0.5")?, 16, "abcdefghij", vec![8], 11, 2),
            // Exact windows keep no difference: as at 0.95, whatever the confidence.
            (judged("exact")?, 16, "abxdefghij", vec![2, 9], 11, 3),
            (judged("0.95@16")?, 16, "abxdefghij", vec![2, 9], 11, 3),
            (judged("0.5")?, 5, "abcde", vec![], 5, 1),
        ];
        for (decide, limit, text, at, tokens, calls) in cases {
            let lease = workers.try_lease().context("no draft")?;
            let got = decode(
                lease.as_ref(),
                &target,
                &tok,
                &prompt,
                limit,
                &[],
                "code",
                &decide,
                &mut asked,
            )
            .await?;
            assert_eq!(
                (
                    got.text.as_str(),
                    got.target_at,
                    got.tokens,
                    got.window_calls
                ),
                (text, at, tokens, Some(calls)),
                "{} at {limit}",
                decide.name()
            );
        }
        let s = summarize(
            "j",
            "code",
            &[answer(11, 1, 0.0, ""), answer(11, 2, 0.0, "")].map(|a| OracleAnswer {
                window_calls: Some(2),
                ..a
            }),
            None,
            0.0,
        );
        assert_eq!(s.tokens_per_call, Some(5.5));
        assert!((s.calls_per_100_tokens - 100.0 * 4.0 / 22.0).abs() < 1e-9);
        assert!(JudgedConfig::parse("0.5@65").is_err() && JudgedConfig::parse("2").is_err());
        assert!(JudgedConfig::parse("0.5@3").is_err());
        assert_eq!(JudgedConfig::parse("0.85@32")?.window_max, 32);
        assert_eq!(JudgedConfig::parse("exact@32")?.threshold, None);
        Ok(())
    }
}
