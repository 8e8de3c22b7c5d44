//! The importance label pipeline reproduces a label checked by hand, against the real
//! llama-server target (`APPROXY_TEST_TARGET_URL`, started by the README's test command).
//!
//! The hand-checked label (training/data/importance, HumanEval/14, `all_prefixes`): the
//! target answers `return [string[:i] for i in range(1, len(string) + 1)]`, which passes. At
//! answer position 11, after `range`, the draft proposes the token `(len` where the target
//! wrote `(`: finished by the target, the answer becomes `range(len(string) + 1)`, which also
//! yields the empty prefix, and the tests fail. The position is important.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use approxy_training::corpus::load_human_eval;
use approxy_training::humaneval::{STOP, Sandbox, Verdict, check};
use approxy_training::importance::{LabelledAnswer, Labeller, label_target, load};
use approxy_verifier::Tokenizer;
use approxy_verifier::home::Home;

const TASK: &str = "HumanEval/14";
const AT: usize = 11;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_checked_label_is_reproduced() {
    let home = Home::from_env().unwrap();
    let tok = Tokenizer::from_file(&home.draft_onnx_dir().join("tokenizer.json")).unwrap();
    let problems = load_human_eval(&home.human_eval()).unwrap();
    let p = problems.iter().find(|p| p.task_id == TASK).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::detect().await;

    // The judge: the two completions read by hand get the verdicts the label rests on.
    let t = Duration::from_secs(10);
    let passing = "    return [string[:i] for i in range(1, len(string) + 1)]\n";
    let failing = "    return [string[:i] for i in range(len(string) + 1)]\n";
    assert_eq!(
        check(sandbox, p, passing, scratch.path(), t).await.unwrap(),
        Verdict::Passed
    );
    assert_eq!(
        check(sandbox, p, failing, scratch.path(), t).await.unwrap(),
        Verdict::Failed
    );

    // The committed label.
    let labels: Vec<LabelledAnswer> =
        load(std::path::Path::new("data/importance"), "target").unwrap();
    let answer = labels.iter().find(|a| a.task_id == TASK).unwrap();
    let d = answer.disagreements.iter().find(|d| d.at == AT).unwrap();
    assert_eq!(tok.decode(&[d.draft]).unwrap(), "(len");
    assert_eq!(tok.decode(&[d.target]).unwrap(), "(");
    assert!(d.important && !d.passed_with_draft && d.passed_with_target);

    // The pipeline, run again on the real target from the recorded answer's prefix: both
    // sides finished by the target and tested.
    let url = std::env::var("APPROXY_TEST_TARGET_URL")
        .expect("APPROXY_TEST_TARGET_URL is not set: run the README's test command");
    let target = label_target(&url).unwrap();
    let labeller = Labeller {
        target: target.as_ref(),
        tokenizer: &tok,
        sandbox,
        scratch: scratch.path(),
        max_answer_tokens: 256,
        stops: &STOP,
        test_timeout: t,
        concurrency: 1,
    };
    let prompt = tok.encode(&p.prompt).unwrap();
    assert_eq!(prompt.len(), answer.prompt_tokens);
    let again = labeller
        .label_at(p, &prompt, &answer.answer[..AT], d.draft, d.target, None)
        .await
        .unwrap();
    assert!(
        again.completion_with_draft.starts_with(failing.trim_end()),
        "{:?}",
        again.completion_with_draft
    );
    assert_eq!(
        (
            again.passed_with_draft,
            again.passed_with_target,
            again.important
        ),
        (false, true, true)
    );
}
