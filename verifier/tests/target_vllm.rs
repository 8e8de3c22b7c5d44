//! The `vllm` target kind against a real vLLM (CPU build) serving the draft model dequantised
//! to float32: the shared target-client suite, and the decode loop with every token taken
//! from vLLM. `deploy/test-all.sh` starts vLLM and runs these with `--ignored` once the
//! llama-server tests are done (both servers on two cores at once would starve each other).

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use approxy_verifier::DraftConfig;
use approxy_verifier::draft::pool::DraftPool;
use approxy_verifier::target::{OpenAiCompletionsTarget, TargetClient};

fn vllm_url() -> String {
    std::env::var("APPROXY_TEST_VLLM_URL").unwrap_or_else(|_| panic!("APPROXY_TEST_VLLM_URL is not set: deploy/test-all.sh starts vLLM and sets it"))
}

fn vllm() -> OpenAiCompletionsTarget {
    let url = vllm_url();
    let mut cfg = common::target_config(&format!("{url}/v1"));
    cfg.model = std::env::var("APPROXY_TEST_VLLM_MODEL").unwrap_or_else(|_| panic!("APPROXY_TEST_VLLM_MODEL is not set"));
    OpenAiCompletionsTarget::new(cfg).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
#[ignore = "needs a real vLLM: deploy/test-all.sh runs it with --ignored"]
async fn vllm_passes_the_shared_suite() {
    common::suite("vllm", &vllm()).await;
}

#[tokio::test]
#[ignore = "needs a real vLLM: deploy/test-all.sh runs it with --ignored"]
async fn dropping_a_stream_stops_vllm() {
    let url = vllm_url();
    let http = reqwest::Client::new();
    // vLLM's Prometheus gauge of requests it is generating for.
    let busy = || async {
        let text = http.get(format!("{url}/metrics")).send().await.unwrap_or_else(|e| panic!("{e}")).text().await.unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with("vllm:num_requests_running"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .any(|n| n > 0.0)
    };
    common::dropping_a_stream_stops_the_generation(&vllm(), busy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real vLLM: deploy/test-all.sh runs it with --ignored"]
async fn reject_everything_equals_vllm_greedy() {
    let h = common::home();
    let pool = DraftPool::start(&DraftConfig {
        model_dir: h.draft_onnx_dir(),
        onnxruntime_lib: h.onnxruntime_lib(),
        workers: 1,
        threads_per_worker: 2,
        spin_wait: false,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let target = Arc::new(common::Counting::new(vllm()));
    let engine = common::engine_with(target.clone());
    let eos = common::eos(engine.tokenizer());
    for p in ["Write a Python function that reverses a string.", "What is the capital of France?"] {
        let prompt = common::chat_prompt(p);
        let mut expected = target.inner.continue_tokens(&common::req(prompt.clone(), 16)).await.unwrap_or_else(|e| panic!("{e}")).tokens;
        expected.retain(|t| !eos.contains(t));
        let before = target.calls.load(Ordering::SeqCst);
        let (ids, _, stats) = common::run(&engine, &pool, common::greedy(prompt, 16, 1.0)).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ids, expected, "prompt {p:?}");
        assert_eq!(stats.draft_tokens, 0);
        assert_eq!(target.calls.load(Ordering::SeqCst) - before, stats.target_calls);
    }
}
