//! The table's [`Abilities`] against what each kind's client says and does: the two are
//! written apart (the policy validator reads the table, the engine asks the client), so a row
//! that claims what its client does not do, or the reverse, fails here.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use axum::http::{StatusCode, Uri};

use super::*;
use crate::targets::{ContinuationRequest, WindowRequest, serve_stub};
use crate::template::ChatMessage;
use crate::testing::tiny_tokenizer;

/// What a kind's client answered and sent, asked once each through a stub that records the
/// paths it was called on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Said {
    /// `continue_tokens` made a call (a client that cannot continue refuses without one).
    continues: bool,
    /// That call went to chat completions.
    sends_messages: bool,
    /// `score_window` made a call, rather than answering that it scores none.
    scores_windows: bool,
    /// `tokenize` asked the target.
    tokenizes: bool,
    /// `picks_among_tokens()`.
    picks_among_tokens: bool,
    /// `warms()`, with the policy asking for slots and warms.
    warms: bool,
}

/// Where `a` and `said` disagree, by the ability's name; empty when they agree.
fn disagreements(a: &Abilities, said: &Said) -> Vec<&'static str> {
    let token_level = a.continues && !a.text_level;
    [
        ("continues", a.continues == said.continues),
        ("chat_prefix", a.chat_prefix == said.sends_messages),
        ("scores_windows", a.scores_windows == said.scores_windows),
        // The tokenizer check asks the target only where token ids are sent.
        ("text_level", token_level == said.tokenizes),
        // Keeping to a set of token ids needs a target that is sent token ids.
        (
            "picks_among_tokens",
            !said.picks_among_tokens || token_level,
        ),
        ("names_slots", a.names_slots == said.warms),
    ]
    .into_iter()
    .filter(|(_, agree)| !agree)
    .map(|(name, _)| name)
    .collect()
}

/// Builds `kind`'s client from the table against a stub that answers every call 404, and
/// asks it each question once.
async fn said_by(kind: TargetKind) -> Said {
    let paths: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = paths.clone();
    let app = axum::Router::new().fallback(move |uri: Uri| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(uri.path().to_string());
            StatusCode::NOT_FOUND
        }
    });
    let mut cfg = serve_stub(app).await;
    cfg.cache_hints.slots = true;
    cfg.cache_hints.warm = true;
    let c = build(kind, cfg, &tiny_tokenizer(), &TextSettings::default()).unwrap();
    let calls_of = |paths: &Mutex<Vec<String>>| std::mem::take(&mut *paths.lock().unwrap());

    // The tiny tokenizer's ids are the bytes, which the text-level clients decode.
    let prefix: Vec<u32> = b"Hello".iter().map(|&b| u32::from(b)).collect();
    let req = ContinuationRequest {
        messages: Some(Arc::new(vec![ChatMessage::new(
            "user".into(),
            "Hello".into(),
        )])),
        ..ContinuationRequest::greedy(prefix.clone(), 1)
    };
    let _ = c.continue_tokens(&req).await;
    let continued = calls_of(&paths);
    let window = WindowRequest {
        prefix,
        window: vec![u32::from(b'!')],
        model: None,
        sampling: None,
        top_logprobs: 0,
    };
    let _ = c.score_window(&window).await;
    let scored = calls_of(&paths);
    let _ = c.tokenize("Hello").await;
    let tokenized = calls_of(&paths);
    Said {
        continues: !continued.is_empty(),
        sends_messages: continued.iter().any(|p| p.ends_with("/chat/completions")),
        scores_windows: !scored.is_empty(),
        tokenizes: !tokenized.is_empty(),
        picks_among_tokens: c.picks_among_tokens(),
        warms: c.warms(),
    }
}

#[tokio::test]
async fn every_kinds_abilities_agree_with_its_client() {
    for &kind in TargetKind::ALL {
        let said = said_by(kind).await;
        assert_eq!(
            disagreements(&kind.abilities(), &said),
            Vec::<&str>::new(),
            "{}: the table says {:?}, the client {said:?}",
            kind.policy_name(),
            kind.abilities()
        );
    }
}

/// The check catches a row that claims what its client does not do, and one client answering
/// for another kind's row.
#[tokio::test]
async fn a_row_that_its_client_contradicts_is_caught() {
    let vllm = said_by(TargetKind::Vllm).await;
    let claims_no_windows = Abilities {
        scores_windows: false,
        ..TargetKind::Vllm.abilities()
    };
    assert_eq!(disagreements(&claims_no_windows, &vllm), ["scores_windows"]);
    let claims_slots = Abilities {
        names_slots: true,
        ..TargetKind::Vllm.abilities()
    };
    assert_eq!(disagreements(&claims_slots, &vllm), ["names_slots"]);
    let chat_prefix = said_by(TargetKind::ChatPrefix).await;
    assert_eq!(
        disagreements(&TargetKind::OpenaiText.abilities(), &chat_prefix),
        ["chat_prefix"]
    );
    let llama = said_by(TargetKind::LlamaCpp).await;
    assert_eq!(
        disagreements(&TargetKind::OpenAiChat.abilities(), &llama),
        [
            "continues",
            "text_level",
            "picks_among_tokens",
            "names_slots"
        ]
    );
}
