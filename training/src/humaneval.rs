//! HumanEval's pass@1 check. Generated code is untrusted: each problem's prompt, completion
//! and tests run in a fresh `python3 -I` subprocess with a timeout, inside a network
//! namespace of its own (`unshare -rn`) when this machine allows one, so it can neither reach
//! the network nor hang the benchmark.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::corpus::HumanEvalProblem;
use serde::{Deserialize, Serialize};
use tokio::process::Command;

/// Where completions stop: the next top-level statement ends the function (the usual
/// HumanEval stops; OpenAI's API takes at most four).
pub const STOP: [&str; 4] = ["\ndef ", "\nclass ", "\nif ", "\nprint("];

/// How generated code is isolated.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sandbox {
    /// Own user and network namespace: no network at all.
    NetworkNamespace,
    /// Plain subprocess (this machine refused `unshare -rn`): timeout only.
    SubprocessOnly,
}

impl Sandbox {
    /// Uses a network namespace when `unshare -rn` works here.
    pub async fn detect() -> Self {
        let ok = Command::new("unshare")
            .args(["-rn", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success());
        if ok {
            Self::NetworkNamespace
        } else {
            Self::SubprocessOnly
        }
    }

    fn command(self) -> Command {
        match self {
            Self::NetworkNamespace => {
                let mut c = Command::new("unshare");
                c.args(["-rn", "python3"]);
                c
            }
            Self::SubprocessOnly => Command::new("python3"),
        }
    }
}

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every assertion held.
    Passed,
    /// An assertion failed or the code raised.
    Failed,
    /// Still running at the timeout (killed).
    TimedOut,
}

/// The program HumanEval's harness runs: prompt + completion, then the tests, then the check.
pub fn program(p: &HumanEvalProblem, completion: &str) -> String {
    format!(
        "{}{}\n\n{}\n\ncheck({})\n",
        p.prompt, completion, p.test, p.entry_point
    )
}

/// Runs `completion` against the problem's tests in `dir` (a scratch directory).
pub async fn check(
    sandbox: Sandbox,
    p: &HumanEvalProblem,
    completion: &str,
    dir: &Path,
    timeout: Duration,
) -> anyhow::Result<Verdict> {
    std::fs::create_dir_all(dir)?;
    let file = dir.join(format!("{}.py", p.task_id.replace('/', "_")));
    std::fs::write(&file, program(p, completion))?;
    let mut child = sandbox
        .command()
        .arg("-I")
        .arg("-B")
        .arg(&file)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let verdict = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => {
            if status?.success() {
                Verdict::Passed
            } else {
                Verdict::Failed
            }
        }
        Err(_) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            Verdict::TimedOut
        }
    };
    let _ = std::fs::remove_file(&file);
    Ok(verdict)
}

/// Evenly spread problems: all of them when `n` is 0 or at least their number, else every
/// k-th so that easy early and hard late problems are both represented.
pub fn sample(problems: Vec<HumanEvalProblem>, n: usize) -> Vec<HumanEvalProblem> {
    let total = problems.len();
    if n == 0 || n >= total {
        return problems;
    }
    let picks: Vec<usize> = (0..n).map(|i| i * total / n).collect();
    problems
        .into_iter()
        .enumerate()
        .filter(|(i, _)| picks.contains(i))
        .map(|(_, p)| p)
        .collect()
}

/// The problems training never sees: every fourth (41 of the 164, spread from the first to
/// the last, as the set grows harder). Importance labels on them are kept apart, to measure
/// a router on, and the held-out benchmark runs them.
pub fn is_held_out(index: usize) -> bool {
    index.is_multiple_of(4)
}

/// The problems split into those training may use and the held-out ones, each in set order.
pub fn split_held_out(
    problems: Vec<HumanEvalProblem>,
) -> (Vec<HumanEvalProblem>, Vec<HumanEvalProblem>) {
    let (held, train): (Vec<_>, Vec<_>) = problems
        .into_iter()
        .enumerate()
        .partition(|(i, _)| is_held_out(*i));
    (
        train.into_iter().map(|(_, p)| p).collect(),
        held.into_iter().map(|(_, p)| p).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems() -> Vec<HumanEvalProblem> {
        let home = approxy_verifier::home::Home::from_env().unwrap_or_else(|e| panic!("{e}"));
        crate::corpus::load_human_eval(&home.human_eval()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn at_least_forty_problems_are_held_out_and_none_is_in_both_sets() {
        let (train, held) = split_held_out(problems());
        assert_eq!((train.len(), held.len()), (123, 41));
        assert!(
            held.iter()
                .all(|h| train.iter().all(|t| t.task_id != h.task_id))
        );
        assert_eq!(held[1].task_id, "HumanEval/4");
    }

    #[test]
    fn sample_spreads_over_the_set() {
        let ps = problems();
        assert_eq!(sample(ps.clone(), 0).len(), 164);
        let s = sample(ps, 41);
        assert_eq!(s.len(), 41);
        assert_eq!(s[0].task_id, "HumanEval/0");
        assert_eq!(s[40].task_id, "HumanEval/160");
    }

    /// The harness itself: canonical solutions pass, a stub body fails, an endless loop is
    /// cut off by the timeout, and the sandbox has no network.
    #[tokio::test]
    async fn canonical_solutions_pass_and_wrong_ones_do_not() {
        let ps = problems();
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let sandbox = Sandbox::detect().await;
        let t = Duration::from_secs(10);
        for p in ps.iter().step_by(20) {
            assert_eq!(
                check(sandbox, p, &p.canonical_solution, dir.path(), t)
                    .await
                    .unwrap_or_else(|e| panic!("{e}")),
                Verdict::Passed,
                "{}",
                p.task_id
            );
            assert_eq!(
                check(sandbox, p, "    return None\n", dir.path(), t)
                    .await
                    .unwrap_or_else(|e| panic!("{e}")),
                Verdict::Failed,
                "{}",
                p.task_id
            );
        }
        let looping = check(
            sandbox,
            &ps[0],
            "    while True:\n        pass\n",
            dir.path(),
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(looping.unwrap_or_else(|e| panic!("{e}")), Verdict::TimedOut);
        if matches!(sandbox, Sandbox::NetworkNamespace) {
            // A listener the test can reach; the sandboxed code must not (exiting 0 after
            // connecting would count as a pass).
            let listener =
                std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
            let port = listener
                .local_addr()
                .unwrap_or_else(|e| panic!("{e}"))
                .port();
            let reach_out = format!(
                "    import socket\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    raise SystemExit(0)\n"
            );
            let v = check(sandbox, &ps[0], &reach_out, dir.path(), t)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(v, Verdict::Failed);
        }
    }
}
