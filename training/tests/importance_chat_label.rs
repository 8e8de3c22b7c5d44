//! The chat importance label pipeline reproduces a label checked by hand, against the real
//! llama-server target (`APPROXY_TEST_TARGET_URL`, started by the README's test command).
//!
//! The hand-checked label (training/data/importance-chat, `if-03`: a note to a neighbour in
//! lowercase that must end with "thanks so much!"): the target answers "hello, my neighbour,
//! please water my plants while i'm away for the weekend. thanks so much!", which follows both
//! instructions. At answer position 2 the draft proposes " thank" where the target wrote
//! " my": finished by the target, the note thanks the neighbour for watering instead of asking
//! and no longer ends with the phrase. The end-phrase instruction flips: the position is
//! important.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use approxy_training::humaneval::Sandbox;
use approxy_training::importance::{Labeller, label_target, load};
use approxy_training::importance_chat::{
    ChatLabelledAnswer, ChatPrompt, DEFAULT_MARGIN, InstructionJudge, judge_instructions, label_at,
};
use approxy_training::instructions::InstructionPrompt;
use approxy_verifier::Tokenizer;
use approxy_verifier::home::Home;
use approxy_verifier::template::{ChatMessage, ChatTemplate};

const ID: &str = "if-03";
const AT: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_checked_chat_label_is_reproduced() {
    let home = Home::from_env().unwrap();
    let dir = home.draft_onnx_dir();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
    let template = ChatTemplate::from_file(&dir.join("chat_template.jinja")).unwrap();
    let instructions = Path::new("../tests/bench/instructions");
    let prompt: InstructionPrompt = std::fs::read_to_string(instructions.join("prompts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<InstructionPrompt>(l).unwrap())
        .find(|p| p.id == ID)
        .unwrap();
    let rendered = template
        .render(&[ChatMessage::new("user".into(), prompt.prompt.clone())])
        .unwrap();
    let p = ChatPrompt {
        id: ID.into(),
        number: 2,
        tokens: tok.encode(&rendered).unwrap(),
        instructions: true,
    };

    // The committed label.
    let labels: Vec<ChatLabelledAnswer> =
        load(Path::new("data/importance-chat"), "held-out-chat-target").unwrap();
    let answer = labels.iter().find(|a| a.id == ID).unwrap();
    assert_eq!(p.tokens.len(), answer.prompt_tokens);
    let d = answer.disagreements.iter().find(|d| d.at == AT).unwrap();
    assert_eq!(tok.decode(&[d.draft]).unwrap(), " thank");
    assert_eq!(tok.decode(&[d.target]).unwrap(), " my");
    assert_eq!(answer.instructions, [true, true]);
    assert_eq!(d.instructions, [true, false]);
    assert!(answer.important(d, DEFAULT_MARGIN));

    // Labelled again against the real target.
    let url = std::env::var("APPROXY_TEST_TARGET_URL")
        .expect("APPROXY_TEST_TARGET_URL (the README's test command starts llama-server)");
    let target = label_target(&url).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let labeller = Labeller {
        target: target.as_ref(),
        tokenizer: &tok,
        sandbox: Sandbox::detect().await,
        scratch: scratch.path(),
        max_answer_tokens: 96,
        stops: &[],
        test_timeout: Duration::from_secs(10),
        concurrency: 1,
    };
    let mut again = vec![
        label_at(
            &labeller,
            &p,
            &answer.answer,
            &answer.logprobs,
            AT,
            d.draft,
            (d.draft_logprob, d.draft_logprob.unwrap()),
        )
        .await
        .unwrap(),
    ];
    assert!(
        again[0].text.starts_with("hello, thank you for watering"),
        "{:?}",
        again[0].text
    );
    let target_text = labeller.completion(&answer.answer).unwrap();
    let judge = InstructionJudge {
        home: &home,
        dir: instructions,
        scratch: scratch.path(),
    };
    let verdicts = judge_instructions(&judge, ID, &target_text, &mut again)
        .await
        .unwrap();
    assert_eq!(verdicts, [true, true]);
    assert_eq!(again[0].instructions, [true, false]);
    assert!(answer.important(&again[0], DEFAULT_MARGIN));
}
