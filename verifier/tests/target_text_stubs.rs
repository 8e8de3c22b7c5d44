//! The text-level kinds against stubs of providers that cannot be reached from here. Each
//! stub speaks the provider's documented streaming wire format:
//! - DeepSeek chat prefix completion (<https://api-docs.deepseek.com/guides/chat_prefix_completion>,
//!   <https://api-docs.deepseek.com/api/create-chat-completion>): the last message is
//!   `{"role": "assistant", "content": ..., "prefix": true}`; chunks carry
//!   `choices[0].delta.content`; the usage chunk reports `prompt_cache_hit_tokens`;
//! - OpenAI-compatible text completions as Together and OpenRouter serve them
//!   (<https://platform.openai.com/docs/api-reference/completions/create>): chunks carry
//!   `choices[0].text`; the usage chunk reports `prompt_tokens_details.cached_tokens`;
//! - vLLM's chat parameters `continue_final_message` and `add_generation_prompt`.
//!
//! The real servers that speak these here (llama-server, vLLM) run the same clients in
//! `target_clients.rs` and `target_vllm.rs`.

// Tests fail by panicking; helpers here are test code too.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
use serde_json::{Value, json};

use approxy_verifier::targets::{
    CacheHints, ChatPrefixTarget, OpenAiTextTarget, PrefixStyle, TargetClient,
};

/// What the stub was sent: each call's body and headers.
type Calls = Arc<Mutex<Vec<(Value, HeaderMap)>>>;

/// A stub that answers call `i` by streaming `answers[i]` (the last one repeats) as SSE
/// events built by `event(text)`, a finish chunk, a usage chunk `usage` and `[DONE]`.
async fn stub(
    answers: Vec<Vec<&'static str>>,
    event: fn(&str, Option<&str>) -> Value,
    usage: Value,
) -> (String, Calls) {
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let app = axum::Router::new().fallback(move |headers: HeaderMap, body: axum::body::Bytes| {
        let seen = seen.clone();
        let answers = answers.clone();
        let usage = usage.clone();
        async move {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let n = {
                let mut s = seen.lock().unwrap();
                s.push((v, headers));
                s.len() - 1
            };
            let pieces = &answers[n.min(answers.len() - 1)];
            let mut out = String::new();
            for p in pieces {
                out += &format!("data: {}\n\n", event(p, None));
            }
            out += &format!("data: {}\n\n", event("", Some("stop")));
            out += &format!("data: {}\n\n", json!({"choices": [], "usage": usage}));
            out += "data: [DONE]\n\n";
            ([("content-type", "text/event-stream")], out)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), calls)
}

fn chat_event(text: &str, finish: Option<&str>) -> Value {
    json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]})
}

fn text_event(text: &str, finish: Option<&str>) -> Value {
    json!({"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]})
}

const TASK: &str = "Write a Python function that checks whether a string is a palindrome.";

fn answer(text: &str) -> Vec<u32> {
    common::tokenizer().encode(text).unwrap()
}

fn decoded(ids: &[u32]) -> String {
    common::tokenizer().decode(ids).unwrap()
}

#[tokio::test]
async fn deepseek_prefix_continues_the_partial_answer_with_its_last_piece_held_back() {
    let usage = json!({"prompt_tokens": 40, "completion_tokens": 6, "prompt_cache_hit_tokens": 32, "prompt_cache_miss_tokens": 8});
    let (url, calls) = stub(vec![vec!["_pal", "indrome", "(s", "):"]], chat_event, usage).await;
    let mut cfg = common::target_config(&url);
    cfg.cache_hints = CacheHints {
        key: true,
        ..CacheHints::default()
    };
    let c = ChatPrefixTarget::new(cfg, common::tokenizer(), PrefixStyle::Prefix).unwrap();
    let req = common::chat_req(TASK, &answer("def is_pal"), 8);
    let out = c.continue_tokens(&req).await.unwrap();
    // The held-back "_pal" came back first and was dropped; the rest is new.
    assert_eq!(decoded(&out.tokens), "indrome(s):");
    assert!(out.stopped_on_eos);
    assert_eq!(out.cached_prompt_tokens, Some(32));
    assert_eq!(out.extra_calls, 0);
    let calls = calls.lock().unwrap();
    let body = &calls[0].0;
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(
        messages[0],
        json!({"role": "system", "content": "You are a helpful assistant."})
    );
    assert_eq!(messages[1], json!({"role": "user", "content": TASK}));
    assert_eq!(
        messages[2],
        json!({"role": "assistant", "content": "def is", "prefix": true})
    );
    assert_eq!(body["stream"], json!(true));
    assert!(body.get("continue_final_message").is_none());
    // One key for every call of the conversation, as prompt_cache_key and user.
    let key = req.cache_key();
    assert_eq!(
        (body["prompt_cache_key"].as_str(), body["user"].as_str()),
        (Some(key.as_str()), Some(key.as_str()))
    );
}

#[tokio::test]
async fn vllm_style_continues_the_final_message_by_flags() {
    let (url, calls) = stub(vec![vec![" is", "_pal"]], chat_event, json!({})).await;
    let c = ChatPrefixTarget::new(
        common::target_config(&url),
        common::tokenizer(),
        PrefixStyle::ContinueFinalMessage,
    )
    .unwrap();
    let out = c
        .continue_tokens(&common::chat_req(TASK, &answer("def is"), 4))
        .await
        .unwrap();
    assert_eq!(decoded(&out.tokens), "_pal");
    let body = &calls.lock().unwrap()[0].0;
    assert_eq!(body["continue_final_message"], json!(true));
    assert_eq!(body["add_generation_prompt"], json!(false));
    assert_eq!(
        body["messages"][2],
        json!({"role": "assistant", "content": "def"})
    );
    // Without a cache setting, no cache fields.
    assert!(body.get("prompt_cache_key").is_none());
}

#[tokio::test]
async fn the_first_call_of_an_answer_is_a_plain_chat_call() {
    let (url, calls) = stub(vec![vec!["def", " f"]], chat_event, json!({})).await;
    let c = ChatPrefixTarget::new(
        common::target_config(&url),
        common::tokenizer(),
        PrefixStyle::Prefix,
    )
    .unwrap();
    let out = c
        .continue_tokens(&common::chat_req(TASK, &[], 4))
        .await
        .unwrap();
    assert_eq!(decoded(&out.tokens), "def f");
    assert_eq!(
        calls.lock().unwrap()[0].0["messages"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
}

#[tokio::test]
async fn text_completions_send_the_rendered_prompt_and_retry_unhealed_when_the_target_diverges() {
    let usage = json!({"prompt_tokens": 40, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 16}});
    // First call: the held-back "_pal" is not what the target writes. Second call (unhealed):
    // it continues after "_pal".
    let (url, calls) = stub(
        vec![vec!["_check", "(s)"], vec!["indrome", "(s)"]],
        text_event,
        usage,
    )
    .await;
    let mut cfg = common::target_config(&url);
    cfg.cache_hints = CacheHints {
        key: false,
        affinity_header: Some("x-session-affinity".into()),
        ..CacheHints::default()
    };
    let c = OpenAiTextTarget::new(cfg, common::tokenizer()).unwrap();
    let req = common::chat_req(TASK, &answer("def is_pal"), 8);
    let out = c.continue_tokens(&req).await.unwrap();
    assert_eq!(decoded(&out.tokens), "indrome(s)");
    assert_eq!(out.extra_calls, 1);
    assert_eq!(out.cached_prompt_tokens, Some(16));
    let calls = calls.lock().unwrap();
    assert_eq!(calls.len(), 2);
    let prompt = |i: usize| {
        calls[i].0["prompt"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let rendered = common::tokenizer()
        .decode_with_specials(&common::chat_prompt(TASK))
        .unwrap();
    assert_eq!(prompt(0), format!("{rendered}def is"));
    assert_eq!(prompt(1), format!("{rendered}def is_pal"));
    // The affinity header carries the conversation's key; no body fields were asked for.
    assert_eq!(
        calls[0]
            .1
            .get("x-session-affinity")
            .and_then(|v| v.to_str().ok()),
        Some(req.cache_key().as_str())
    );
    assert!(calls[0].0.get("prompt_cache_key").is_none());
}

#[tokio::test]
async fn only_one_unhealed_retry() {
    // The healed call diverges; the unhealed one has nothing held back to check, so its text
    // is taken as the continuation: two calls, no more.
    let (url, calls) = stub(vec![vec!["Sure! Here"]], text_event, json!({})).await;
    let c = OpenAiTextTarget::new(common::target_config(&url), common::tokenizer()).unwrap();
    let out = c
        .continue_tokens(&common::chat_req(TASK, &answer("def is_pal"), 8))
        .await
        .unwrap();
    assert_eq!(
        (decoded(&out.tokens).as_str(), out.extra_calls),
        ("Sure! Here", 1)
    );
    assert_eq!(calls.lock().unwrap().len(), 2);
    // A prefill server must echo the answer it was sent; one that does not diverges on both
    // calls, which is an error rather than a third call.
    let (url, calls) = stub(vec![vec!["unrelated"]], chat_event, json!({})).await;
    let c = ChatPrefixTarget::new(
        common::target_config(&url),
        common::tokenizer(),
        PrefixStyle::Prefill,
    )
    .unwrap();
    let err = c
        .continue_tokens(&common::chat_req(TASK, &answer("def is_pal"), 8))
        .await;
    assert!(
        err.as_ref()
            .is_err_and(|e| e.to_string().contains("does not continue")),
        "{err:?}"
    );
    assert_eq!(calls.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn dropping_a_text_stream_closes_the_upstream_connection() {
    use futures::StreamExt;
    // The stub holds its stream open; the client drops it after the first tokens.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let tx = Arc::new(Mutex::new(Some(tx)));
    let app = axum::Router::new().fallback(move || {
        let tx = tx.clone();
        async move {
            struct Closed(Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>>);
            impl Drop for Closed {
                fn drop(&mut self) {
                    if let Some(t) = self.0.lock().unwrap().take() {
                        let _ = t.send(());
                    }
                }
            }
            let guard = Closed(tx);
            let body = futures::stream::unfold((0u32, guard), |(i, g)| async move {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let ev = format!("data: {}\n\n", text_event(&format!(" word{i}"), None));
                Some((Ok::<_, std::io::Error>(ev), (i + 1, g)))
            });
            (
                [("content-type", "text/event-stream")],
                axum::body::Body::from_stream(body),
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let c = OpenAiTextTarget::new(
        common::target_config(&format!("http://{addr}/v1")),
        common::tokenizer(),
    )
    .unwrap();
    let mut s = c
        .stream_tokens(&common::chat_req(TASK, &[], 1000))
        .await
        .unwrap();
    assert!(matches!(s.next().await, Some(Ok(_))));
    drop(s);
    tokio::time::timeout(std::time::Duration::from_secs(5), rx)
        .await
        .expect("the stub kept streaming after the client dropped")
        .unwrap();
}

#[tokio::test]
async fn a_target_of_another_family_gets_its_own_chat_template() {
    use approxy_verifier::template::ChatTemplate;
    // Llama 3's header layout, reduced to what the prompt needs.
    let llama3 = "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";
    let (url, calls) = stub(vec![vec!["_pal", "indrome"]], text_event, json!({})).await;
    let c = OpenAiTextTarget::new(common::target_config(&url), common::tokenizer())
        .unwrap()
        .with_template(Some(Arc::new(
            ChatTemplate::from_source(llama3.into()).unwrap(),
        )));
    let out = c
        .continue_tokens(&common::chat_req(TASK, &answer("def is_pal"), 8))
        .await
        .unwrap();
    assert_eq!(decoded(&out.tokens), "indrome");
    let prompt = calls.lock().unwrap()[0].0["prompt"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        prompt,
        format!(
            "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n{TASK}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\ndef is"
        )
    );
}
