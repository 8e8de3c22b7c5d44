//! Shared helpers for the verifier's integration tests: real assets from `$APPROXY_HOME`
//! (provided by `approxy setup`) and, where needed, a real `llama-server` target.

// Tests fail by panicking; helpers here are test code too.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

use approxy_verifier::home::Home;
use approxy_verifier::{DraftConfig, DraftMeta, Tokenizer};

/// The cache, failing loudly (not skipping) when setup has not run.
pub fn home() -> Home {
    let h = Home::from_env().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        h.draft_onnx_dir()
            .join(approxy_verifier::draft::DRAFT_GRAPH)
            .is_file(),
        "no draft model under {}: run the README's test command (it runs `approxy setup`)",
        h.root.display()
    );
    h
}

/// Draft pool settings for tests: `workers` sessions of 2 threads, no spinning.
pub fn draft_config(workers: usize) -> DraftConfig {
    let h = home();
    DraftConfig::one_stream_per_worker(h.draft_onnx_dir(), h.onnxruntime_lib(), workers, 2)
}

/// One worker drafting for up to `streams` sequences at once.
pub fn batched_config(streams: usize) -> DraftConfig {
    DraftConfig {
        streams_per_worker: streams,
        ..draft_config(1)
    }
}

/// The converted draft's shape facts.
pub fn meta() -> DraftMeta {
    DraftMeta::load(&home().draft_onnx_dir()).unwrap_or_else(|e| panic!("{e}"))
}

/// The draft's tokenizer.
pub fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(&home().draft_onnx_dir().join("tokenizer.json"))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A chat prompt in the Qwen template, as token ids.
pub fn chat_prompt(user: &str) -> Vec<u32> {
    let text = format!(
        "<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    );
    tokenizer().encode(&text).unwrap_or_else(|e| panic!("{e}"))
}

const SYSTEM: &str = "You are a helpful assistant.";

/// The messages [`chat_prompt`] renders.
pub fn chat_messages(user: &str) -> Vec<approxy_verifier::template::ChatMessage> {
    use approxy_verifier::template::ChatMessage;
    vec![
        ChatMessage::new("system".into(), SYSTEM.into()),
        ChatMessage::new("user".into(), user.into()),
    ]
}

/// A greedy request for `n` tokens after the chat prompt for `user` and a partial `answer`,
/// with the messages, as the engine makes it.
pub fn chat_req(user: &str, answer: &[u32], n: u32) -> ContinuationRequest {
    let prompt = chat_prompt(user);
    let prefix = [prompt.as_slice(), answer].concat();
    ContinuationRequest {
        prompt_len: prompt.len(),
        messages: Some(Arc::new(chat_messages(user))),
        ..ContinuationRequest::greedy(prefix, n)
    }
}

/// Base URL of the real llama-server target for tests: `APPROXY_TEST_TARGET_URL`, which the
/// README's test command sets after starting one.
pub fn target_url() -> String {
    std::env::var("APPROXY_TEST_TARGET_URL")
        .unwrap_or_else(|_| panic!("APPROXY_TEST_TARGET_URL is not set: run the README's test command, which starts llama-server"))
}

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use approxy_verifier::targets::{
    Continuation, ContinuationRequest, LlamaCppTarget, TargetClient, TargetConfig, TokenStream,
};
use approxy_verifier::{
    ConfidenceVerifier, DraftPool, DraftWorkers, Engine, GenerateRequest, SamplingParams, Stats,
    TargetError, TokenEvent,
};

/// Client settings for a target at `url`: generous timeout, one quick retry.
pub fn target_config(url: &str) -> TargetConfig {
    TargetConfig {
        base_url: url.to_string(),
        api_key: None,
        model: "target".into(),
        timeout: Duration::from_secs(120),
        retries: 1,
        backoff: Duration::from_millis(20),
        ca_file: None,
        cache_hints: Default::default(),
        use_env_proxy: false,
    }
}

/// The real llama-server target.
pub fn llama_target() -> LlamaCppTarget {
    LlamaCppTarget::new(target_config(&target_url())).unwrap_or_else(|e| panic!("{e}"))
}

/// Wraps a target and counts calls, to see what the engine really asks for.
#[derive(Debug)]
pub struct Counting<T> {
    /// The wrapped client.
    pub inner: T,
    /// Continuation calls so far.
    pub calls: AtomicU32,
    /// Sampling parameters of every call, in order.
    pub sampling: std::sync::Mutex<Vec<SamplingParams>>,
}

impl<T> Counting<T> {
    /// Wraps `inner` with zero counts.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            calls: AtomicU32::new(0),
            sampling: Default::default(),
        }
    }
}

#[async_trait::async_trait]
impl<T: TargetClient> TargetClient for Counting<T> {
    async fn continue_tokens(
        &self,
        req: &ContinuationRequest,
    ) -> Result<Continuation, TargetError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut v) = self.sampling.lock() {
            v.push(req.sampling);
        }
        self.inner.continue_tokens(req).await
    }
    async fn stream_tokens(&self, req: &ContinuationRequest) -> Result<TokenStream, TargetError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut v) = self.sampling.lock() {
            v.push(req.sampling);
        }
        self.inner.stream_tokens(req).await
    }
    async fn tokenize(&self, text: &str) -> Result<Option<Vec<u32>>, TargetError> {
        self.inner.tokenize(text).await
    }
    fn answer_done(&self, answer: u64) {
        self.inner.answer_done(answer);
    }
    async fn health(&self) -> Result<(), TargetError> {
        self.inner.health().await
    }
}

/// End-of-sequence ids of the Qwen tokenizer.
pub fn eos(tok: &Tokenizer) -> Vec<u32> {
    tok.end_of_sequence_ids()
}

/// An engine with the draft tokenizer and the given target.
pub fn engine_with(target: Arc<dyn TargetClient>) -> Engine {
    let tok = tokenizer();
    let eos = eos(&tok);
    Engine::new(tok, target, eos)
}

/// A greedy request with one correction token and no bail-out.
pub fn greedy(prompt: Vec<u32>, max_tokens: u32, threshold: f32) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams::default(),
        stop: vec![],
        threshold,
        cost_guard: None,
        model: None,
        messages: None,
        settings: Default::default(),
        constraint: None,
    }
}

/// Runs one generation to the end; returns the emitted ids and the stats.
pub async fn run(
    engine: &Engine,
    pool: &Arc<DraftPool>,
    req: GenerateRequest,
) -> Result<(Vec<u32>, String, Stats), approxy_verifier::EngineError> {
    let lease = pool
        .try_lease()
        .unwrap_or_else(|| panic!("no idle draft worker"));
    let (tx, mut rx) = tokio::sync::mpsc::channel::<TokenEvent>(1024);
    let collect = tokio::spawn(async move {
        let mut ids = Vec::new();
        let mut text = String::new();
        while let Some(ev) = rx.recv().await {
            ids.extend(ev.id);
            text.push_str(&ev.text);
        }
        (ids, text)
    });
    let stats = engine
        .generate(lease.as_ref(), &ConfidenceVerifier, req, tx)
        .await;
    let (ids, text) = collect.await.unwrap_or_else(|e| panic!("{e}"));
    let stats = stats?;
    assert_eq!(
        stats.draft_tokens + stats.target_tokens,
        stats.completion_tokens,
        "who wrote what must add up: {stats:?}"
    );
    assert_eq!(stats.completion_tokens as usize, ids.len());
    Ok((ids, text, stats))
}

/// A greedy continuation request for `n` tokens.
pub fn req(prefix: Vec<u32>, n: u32) -> ContinuationRequest {
    ContinuationRequest::greedy(prefix, n)
}

/// The contract every target client must meet against a real server with the draft's
/// tokenizer; returns the greedy continuation of a fixed prompt.
pub async fn suite(name: &str, c: &dyn TargetClient) -> Vec<u32> {
    c.health()
        .await
        .unwrap_or_else(|e| panic!("{name}: not healthy: {e}"));
    let tok = tokenizer();
    let task = "Write a Python function that squares a number.";
    let long = c
        .continue_tokens(&chat_req(task, &[], 12))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(long.tokens.len(), 12, "{name}: wrong count");
    assert!(!long.stopped_on_eos);
    // Greedy continuation of an exact prefix is consistent: continuing prompt + first 5 gives
    // the rest (for a text-level client, across a healed boundary).
    let rest = c
        .continue_tokens(&chat_req(task, &long.tokens[..5], 7))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        rest.tokens,
        long.tokens[5..],
        "{name}: prefix continuation differs"
    );
    // A short answer ends on end-of-sequence.
    let ok = "Reply with the single word OK.";
    let short = c
        .continue_tokens(&chat_req(ok, &[], 40))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(short.stopped_on_eos, "{name}: {short:?}");
    // Streamed, the same greedy continuation arrives, and a short answer still ends on
    // end-of-sequence.
    let streamed = collect_stream(c, &chat_req(task, &[], 12)).await;
    assert_eq!(
        streamed.0, long.tokens,
        "{name}: streamed continuation differs"
    );
    assert!(!streamed.1);
    let streamed_short = collect_stream(c, &chat_req(ok, &[], 40)).await;
    assert!(
        streamed_short.1,
        "{name}: streamed short answer did not end on end-of-sequence: {streamed_short:?}"
    );
    // A client that keeps a call to a set of tokens answers with one of them, its own best:
    // its greedy token where the set holds it.
    if c.picks_among_tokens() {
        let greedy = long.tokens[0];
        // Two first tokens of an answer that are not the greedy one.
        let others: Vec<u32> = ["Sure", "Here", "Hello"]
            .iter()
            .filter_map(|w| tok.encode(w).ok()?.first().copied())
            .filter(|&t| t != greedy)
            .take(2)
            .collect();
        assert_eq!(others.len(), 2, "{name}");
        let mut one = chat_req(task, &[], 1);
        one.allowed = [others.as_slice(), &[greedy]].concat();
        let got = c
            .continue_tokens(&one)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got.tokens, vec![greedy], "{name}: not its best of the set");
        one.allowed = others.clone();
        let got = c
            .continue_tokens(&one)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            got.tokens.len() == 1 && others.contains(&got.tokens[0]),
            "{name}: {:?} is not one of {others:?}",
            got.tokens
        );
    }
    // Tokenizer agreement when the target can tokenize.
    if let Some(ids) = c
        .tokenize("fn main() { println!(\"héllo 🚀\"); }")
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"))
    {
        assert_eq!(
            ids,
            tok.encode("fn main() { println!(\"héllo 🚀\"); }")
                .unwrap_or_default(),
            "{name}"
        );
    }
    long.tokens
}

/// Every token of a streamed continuation, and whether it ended on end-of-sequence.
pub async fn collect_stream(c: &dyn TargetClient, r: &ContinuationRequest) -> (Vec<u32>, bool) {
    use futures::StreamExt;
    let mut s = c.stream_tokens(r).await.unwrap_or_else(|e| panic!("{e}"));
    let (mut tokens, mut eos) = (Vec::new(), false);
    while let Some(chunk) = s.next().await {
        let chunk = chunk.unwrap_or_else(|e| panic!("{e}"));
        tokens.extend(chunk.tokens);
        eos |= chunk.stopped_on_eos;
    }
    (tokens, eos)
}

/// Opens a long streamed continuation, takes its first chunk, drops the stream, and waits up
/// to 10 s for `busy` to say the server is idle again: the connection's close must stop the
/// generation (otherwise the server stays busy for the whole answer).
pub async fn dropping_a_stream_stops_the_generation<F, Fut>(c: &dyn TargetClient, busy: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    use futures::StreamExt;
    let r = chat_req(
        "Write a long essay about the history of computing, with many details.",
        &[],
        2000,
    );
    let mut s = c.stream_tokens(&r).await.unwrap_or_else(|e| panic!("{e}"));
    let first = s.next().await;
    assert!(matches!(first, Some(Ok(_))), "{first:?}");
    assert!(busy().await, "the server should be generating");
    drop(s);
    let started = std::time::Instant::now();
    while busy().await {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the server kept generating after the stream was dropped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Largest gap, in nats, between the target's top two tokens that still counts as a numerical tie.
/// llama-server computes a re-sent answer as one prompt batch and its own answer token by token;
/// the two round differently (a 0.013-nat gap flipped "_str" to "_s" on an AVX-512 machine).
pub const TIE_NATS: f64 = 0.1;

/// Asserts that `got` is llama-server's greedy answer `expected` to `prompt`, allowing the one
/// difference greedy decoding cannot rule out across call structures: where they first differ,
/// the two tokens are a numerical tie for the target (asked for its top tokens at that point).
/// After that point the answers are free to differ; `eos` stands for a missing token.
pub async fn assert_greedy_up_to_a_tie(
    prompt: &[u32],
    got: &[u32],
    expected: &[u32],
    eos: &[u32],
    what: &str,
) {
    if got == expected {
        return;
    }
    let at = got.iter().zip(expected).take_while(|(a, b)| a == b).count();
    let top = target_top(&[prompt, &expected[..at]].concat()).await;
    let logprob = |t: Option<&u32>| {
        top.iter()
            .filter(|(id, _)| t.map_or(eos.contains(id), |t| t == id))
            .map(|(_, lp)| *lp)
            .fold(None, |m: Option<f64>, lp| Some(m.map_or(lp, |m| m.max(lp))))
    };
    let (a, b) = (logprob(got.get(at)), logprob(expected.get(at)));
    let gap = a.zip(b).map(|(a, b)| (a - b).abs());
    assert!(
        gap.is_some_and(|g| g <= TIE_NATS),
        "{what}: differs from the target's greedy answer at {at} ({:?} vs {:?}) without a tie \
         (gap {gap:?} nats, target's top {top:?}):\n got {got:?}\n expected {expected:?}",
        got.get(at),
        expected.get(at)
    );
    eprintln!("{what}: a numerical tie at {at} (gap {gap:?} nats); the answers part there");
}

/// llama-server's ten most likely next tokens after `prefix`, with their log-probabilities.
pub async fn target_top(prefix: &[u32]) -> Vec<(u32, f64)> {
    let body = serde_json::json!({
        "prompt": prefix,
        "n_predict": 1,
        "n_probs": 10,
        "temperature": 0,
        "cache_prompt": false,
    });
    let answer: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/completion", target_url()))
        .json(&body)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .unwrap_or_else(|e| panic!("{e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    answer["completion_probabilities"][0]["top_logprobs"]
        .as_array()
        .unwrap_or_else(|| panic!("no top_logprobs in {answer}"))
        .iter()
        .map(|e| {
            (
                e["id"].as_u64().unwrap() as u32,
                e["logprob"].as_f64().unwrap(),
            )
        })
        .collect()
}
