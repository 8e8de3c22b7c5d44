//! Shared helpers for the verifier's integration tests: real assets from `$APPROXY_HOME`
//! (provided by `approxy setup`) and, where needed, a real `llama-server` target.

#![allow(dead_code)]

use std::path::PathBuf;

use approxy_verifier::home::Home;
use approxy_verifier::{DraftConfig, DraftMeta, Tokenizer};

/// The cache, failing loudly (not skipping) when setup has not run.
pub fn home() -> Home {
    let h = Home::from_env().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        h.draft_onnx_dir().join("model.onnx").is_file(),
        "no draft model under {}: run the README's test command (it runs `approxy setup`)",
        h.root.display()
    );
    h
}

pub fn draft_config(workers: usize) -> DraftConfig {
    let h = home();
    DraftConfig { model_dir: h.draft_onnx_dir(), onnxruntime_lib: h.onnxruntime_lib(), workers, threads_per_worker: 2 }
}

pub fn meta() -> DraftMeta {
    DraftMeta::load(&home().draft_onnx_dir()).unwrap_or_else(|e| panic!("{e}"))
}

pub fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(&home().draft_onnx_dir().join("tokenizer.json")).unwrap_or_else(|e| panic!("{e}"))
}

/// A chat prompt in the Qwen template, as token ids.
pub fn chat_prompt(user: &str) -> Vec<u32> {
    let text = format!("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n");
    tokenizer().encode(&text).unwrap_or_else(|e| panic!("{e}"))
}

/// Base URL of the real llama-server target for tests: `APPROXY_TEST_TARGET_URL`, which the
/// README's test command sets after starting one.
pub fn target_url() -> String {
    std::env::var("APPROXY_TEST_TARGET_URL")
        .unwrap_or_else(|_| panic!("APPROXY_TEST_TARGET_URL is not set: run the README's test command, which starts llama-server"))
}

pub fn lib_path() -> PathBuf {
    home().onnxruntime_lib()
}
