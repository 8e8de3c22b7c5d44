//! The live-decode collection mode against the real draft and the real llama-server target
//! (`APPROXY_TEST_TARGET_URL`, started by the README's test command).

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use approxy_training::collect::{CollectItem, LiveOptions, collect_live};
use approxy_training::dataset::{live_shard_path, load_dir};
use approxy_verifier::home::Home;
use approxy_verifier::targets::{LlamaCppTarget, TargetConfig};
use approxy_verifier::template::ChatMessage;
use approxy_verifier::{
    ConfidenceVerifier, DraftConfig, DraftPool, Engine, TargetClient, Tokenizer,
};
use indicatif::ProgressBar;

/// A code prompt: its ids in the Qwen template and the messages they were rendered from.
fn item(tok: &Tokenizer, id: u32, user: &str) -> CollectItem {
    let text = format!(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    );
    let messages = vec![
        ChatMessage::new("system".into(), "You are a helpful assistant.".into()),
        ChatMessage::new("user".into(), user.into()),
    ];
    CollectItem {
        id,
        kind: 0,
        prompt: tok.encode(&text).unwrap(),
        messages: Arc::new(messages),
    }
}

/// Every row carries the target's top-20 log-probabilities from the real llama-server, and they
/// agree with the row's identity label: the target's top token there is the token it chose,
/// except at a numerical tie (a re-sent prefix is computed as a batch and rounds differently).
fn target_probs_line_up(rows: &approxy_training::dataset::Rows, what: &str) {
    use approxy_verifier::verify::AcceptanceRule;
    assert_eq!(
        rows.rows_with_target_probs(),
        rows.len(),
        "{what}: rows without probabilities"
    );
    let mut disagree = Vec::new();
    for i in 0..rows.len() {
        let probs = rows.target_probs(i).unwrap();
        assert_eq!(probs.top.len(), 20, "{what}: row {i}");
        assert!(
            probs.top.windows(2).all(|w| w[0].1 >= w[1].1) && probs.top[0].1 <= 0.0,
            "{what}: row {i}: not log-probabilities, most likely first: {:?}",
            probs.top
        );
        let identical = rows.rule_label(i, &AcceptanceRule::Identical).unwrap() == 1.0;
        if identical != (rows.labels[i] == 1) {
            let margin = probs.top[0].1 - probs.top[1].1;
            disagree.push((i, margin));
        }
        if rows.target_token_outside[i] == 0 {
            assert_eq!(
                Some(rows.target_token_logprob[i]),
                probs.logprob(rows.tokens[i]),
                "{what}: row {i}"
            );
        }
    }
    assert!(
        disagree.iter().all(|&(_, margin)| margin < 0.1),
        "{what}: the target's top token and the row's label disagree away from a tie: {disagree:?}"
    );
}

/// Rows land at the visited positions, one per emitted token, and their labels line up with
/// the target: on code prompts the draft agrees with the target at most positions, which a
/// label shifted by one position (or taken from the wrong prefix) would not show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_rows_follow_the_decode_loop() {
    let home = Home::from_env().unwrap();
    let url = std::env::var("APPROXY_TEST_TARGET_URL")
        .expect("APPROXY_TEST_TARGET_URL is not set: run the README's test command");
    let dir = home.draft_onnx_dir();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
    let items: Vec<CollectItem> = [
        "Write a Python function that returns the sum of a list of integers.",
        "Write a Python function that reverses a string.",
    ]
    .iter()
    .enumerate()
    .map(|(i, p)| item(&tok, i as u32, p))
    .collect();
    let pool = DraftPool::start(&DraftConfig::one_stream_per_worker(
        dir,
        home.onnxruntime_lib(),
        1,
        2,
    ))
    .unwrap();
    let cfg = TargetConfig {
        base_url: url,
        api_key: None,
        model: String::new(),
        timeout: Duration::from_secs(120),
        retries: 1,
        backoff: Duration::from_millis(50),
        ca_file: None,
        cache_hints: Default::default(),
        use_env_proxy: false,
    };
    let target: Arc<dyn TargetClient> = Arc::new(LlamaCppTarget::new(cfg).unwrap());
    let eos = tok.end_of_sequence_ids();
    let engine = Engine::new(tok, target, eos);
    let out = tempfile::tempdir().unwrap();
    let opts = LiveOptions {
        max_tokens: 24,
        threshold: 0.7,
        shard_prompts: 20,
        concurrency: 2,
    };
    let s = collect_live(
        Arc::clone(&pool),
        &engine,
        &ConfidenceVerifier,
        &items,
        out.path(),
        &opts,
        &ProgressBar::hidden(),
    )
    .await
    .unwrap();
    assert_eq!(s.shards_written, 1);
    assert!(live_shard_path(out.path(), 0).is_file());
    let rows = load_dir(out.path()).unwrap();
    assert_eq!(rows.len(), s.rows);
    for id in 0..2u32 {
        let n = rows.prompt_ids.iter().filter(|&&p| p == id).count();
        assert!(
            n > 0 && n <= 24,
            "prompt {id}: {n} rows for at most 24 visited positions"
        );
    }
    let agree = rows.labels.iter().filter(|&&l| l == 1).count() as f64 / rows.len() as f64;
    assert!(
        agree > 0.5,
        "draft agreed with the target at only {:.0} % of visited code positions",
        100.0 * agree
    );
    target_probs_line_up(&rows, "live");
    // A rerun finds the shard and does no work.
    let again = collect_live(
        pool,
        &engine,
        &ConfidenceVerifier,
        &items,
        out.path(),
        &opts,
        &ProgressBar::hidden(),
    )
    .await
    .unwrap();
    assert_eq!((again.shards_written, again.shards_skipped), (0, 1));
}

/// Teacher-forced collection works through a text-level kind too (so a user can calibrate for
/// a target that takes text): the same llama-server, reached as `openai_text` and as
/// `chat_prefix`, gives the same rows as through its native API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collection_through_the_text_level_kinds_matches_the_native_one() {
    use approxy_training::collect::{CollectOptions, collect};
    use approxy_verifier::targets::{ChatPrefixTarget, OpenAiTextTarget, PrefixStyle};
    let home = Home::from_env().unwrap();
    let url = std::env::var("APPROXY_TEST_TARGET_URL")
        .expect("APPROXY_TEST_TARGET_URL is not set: run the README's test command");
    let dir = home.draft_onnx_dir();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
    let user = "Write a Python function that returns the sum of a list of integers.";
    let items = vec![item(&tok, 0, user)];
    let pool = DraftPool::start(&DraftConfig::one_stream_per_worker(
        dir,
        home.onnxruntime_lib(),
        1,
        2,
    ))
    .unwrap();
    let cfg = |base: String| TargetConfig {
        base_url: base,
        api_key: None,
        model: "target".into(),
        timeout: Duration::from_secs(120),
        retries: 1,
        backoff: Duration::from_millis(50),
        ca_file: None,
        cache_hints: Default::default(),
        use_env_proxy: false,
    };
    let targets: Vec<(&str, Arc<dyn TargetClient>)> = vec![
        (
            "llama_cpp",
            Arc::new(LlamaCppTarget::new(cfg(url.clone())).unwrap()),
        ),
        (
            "openai_text",
            Arc::new(OpenAiTextTarget::new(cfg(format!("{url}/v1")), tok.clone()).unwrap()),
        ),
        (
            "chat_prefix",
            Arc::new(
                ChatPrefixTarget::new(cfg(format!("{url}/v1")), tok.clone(), PrefixStyle::Prefill)
                    .unwrap(),
            ),
        ),
    ];
    let opts = CollectOptions {
        max_answer_tokens: 24,
        shard_prompts: 20,
        concurrency: 1,
    };
    let mut all = Vec::new();
    for (name, target) in targets {
        let out = tempfile::tempdir().unwrap();
        let s = collect(
            Arc::clone(&pool),
            target,
            &tok,
            &items,
            out.path(),
            &opts,
            &ProgressBar::hidden(),
        )
        .await
        .unwrap();
        let rows = load_dir(out.path()).unwrap();
        assert!(
            s.rows > 0 && rows.len() == s.rows,
            "{name}: {} rows",
            s.rows
        );
        if name == "llama_cpp" {
            target_probs_line_up(&rows, name);
        } else {
            // The text-level kinds do not ask for probabilities yet: the rows say so.
            assert_eq!(rows.rows_with_target_probs(), 0, "{name}");
        }
        all.push((name, rows.labels.clone()));
    }
    for (name, labels) in &all[1..] {
        assert_eq!(labels, &all[0].1, "{name} labels differ from llama_cpp's");
    }
}
