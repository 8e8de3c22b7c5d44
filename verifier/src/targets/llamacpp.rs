//! llama.cpp `llama-server`: `POST /completion` with a token-array prompt, `cache_prompt`
//! (reuses the common prefix of consecutive calls) and `return_tokens`.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use super::{
    Continuation, ContinuationRequest, StreamChunk, TargetClient, TargetConfig, TargetFacts,
    TargetTimings, TokenStream, get_json, get_ok, http_client, join, post_json, post_sse,
    slots::SlotPins, token_ids, unless_missing,
};
use crate::error::TargetError;

/// Client for llama.cpp's native API.
#[derive(Debug, Clone)]
pub struct LlamaCppTarget {
    cfg: TargetConfig,
    http: reqwest::Client,
    /// The server's slot count (`/props` `total_slots`), asked once; `None` when it does not
    /// say, and then no call names a slot.
    total_slots: Arc<OnceCell<Option<usize>>>,
    /// Which slot each live answer's calls go to (see `super::slots`).
    pins: Arc<SlotPins>,
}

impl LlamaCppTarget {
    /// A client for `cfg.base_url` (the server root, without `/v1`).
    pub fn new(cfg: TargetConfig) -> Result<Self, TargetError> {
        Ok(Self {
            http: http_client(&cfg)?,
            cfg,
            total_slots: Arc::default(),
            pins: Arc::default(),
        })
    }

    /// `req`'s body, naming the slot its answer holds where there is one.
    async fn body_for(&self, req: &ContinuationRequest, stream: bool) -> Value {
        let mut b = body(req, stream);
        if let Some(answer) = req.answer.filter(|_| self.cfg.cache_hints.slots) {
            // A server that cannot say is asked once; one that failed to answer, again.
            let total = self
                .total_slots
                .get_or_try_init(|| async {
                    let props = join(&self.cfg.base_url, "props");
                    let v = unless_missing(get_json(&self.http, &self.cfg, &props).await)?;
                    Ok::<_, TargetError>(v.and_then(|v| props_slots(&v)))
                })
                .await
                .ok()
                .copied()
                .flatten();
            if let Some(slot) = total.and_then(|t| self.pins.pin(answer, &req.prefix, t)) {
                b["id_slot"] = json!(slot);
            }
        }
        b
    }
}

fn body(req: &ContinuationRequest, stream: bool) -> Value {
    let s = &req.sampling;
    let mut body = json!({
        "prompt": req.prefix,
        "n_predict": req.max_tokens,
        "temperature": s.temperature.max(0.0),
        "top_p": s.top_p,
        "top_k": 0,
        "min_p": 0.0,
        "cache_prompt": true,
        "return_tokens": true,
        "stream": stream,
    });
    if let Some(seed) = s.seed {
        body["seed"] = json!(seed as i64);
    }
    if req.top_logprobs > 0 {
        // The probabilities before sampling (llama-server's default, `post_sampling_probs`
        // off): the model's own distribution at temperature 1, whatever the request samples
        // with.
        body["n_probs"] = json!(req.top_logprobs);
    }
    if !req.allowed.is_empty() {
        // A bias far above any gap between two logits puts every allowed token ahead of every
        // other and keeps their own order: the greedy token is the target's best allowed one.
        // It holds for every token of the call, so the engine asks for one.
        let bias: Vec<Value> = req.allowed.iter().map(|&t| json!([t, PICK_BIAS])).collect();
        body["logit_bias"] = json!(bias);
    }
    body
}

/// The logit bias that keeps a call to [`ContinuationRequest::allowed`] (llama-server adds it
/// to the logits before sampling; its `n_probs` report the logits before it).
const PICK_BIAS: f32 = 1000.0;

/// The top log-probabilities at each generated token of an `n_probs` answer
/// (`completion_probabilities[i].top_logprobs[j].{id, logprob}`).
fn top_logprobs_of(v: &Value) -> Result<Vec<Vec<(u32, f32)>>, TargetError> {
    let Some(positions) = v["completion_probabilities"].as_array() else {
        return Ok(Vec::new());
    };
    positions
        .iter()
        .map(|p| {
            p["top_logprobs"]
                .as_array()
                .map(|entries| {
                    entries
                        .iter()
                        .map(|e| {
                            let id = e["id"].as_u64().and_then(|x| u32::try_from(x).ok());
                            let lp = e["logprob"].as_f64();
                            id.zip(lp).map(|(id, lp)| (id, lp as f32))
                        })
                        .collect::<Option<Vec<_>>>()
                })
                .unwrap_or(Some(Vec::new()))
                .ok_or_else(|| {
                    TargetError::Protocol("malformed top_logprobs in /completion answer".into())
                })
        })
        .collect()
}

/// The `tokens` of an answer from `endpoint`.
fn tokens_of(v: &Value, endpoint: &str) -> Result<Vec<u32>, TargetError> {
    if !v.is_array() {
        return Err(TargetError::Protocol(format!(
            "no `tokens` in {endpoint} answer"
        )));
    }
    token_ids(v).ok_or_else(|| TargetError::Protocol("non-integer token id".into()))
}

#[async_trait]
impl TargetClient for LlamaCppTarget {
    async fn continue_tokens(
        &self,
        req: &ContinuationRequest,
    ) -> Result<Continuation, TargetError> {
        let v = post_json(
            &self.http,
            &self.cfg,
            &join(&self.cfg.base_url, "completion"),
            &self.body_for(req, false).await,
            None,
        )
        .await?;
        let tokens = tokens_of(&v["tokens"], "/completion")?;
        let stopped_on_eos = v["stop_type"].as_str() == Some("eos");
        let cached = v["tokens_cached"]
            .as_u64()
            .and_then(|x| u32::try_from(x).ok());
        let cached_prompt = v["timings"]["cache_n"]
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .or(cached);
        let top_logprobs = if req.top_logprobs > 0 {
            top_logprobs_of(&v)?
        } else {
            Vec::new()
        };
        Ok(Continuation {
            tokens,
            stopped_on_eos,
            cached_prompt_tokens: cached_prompt,
            extra_calls: 0,
            top_logprobs,
            timings: TargetTimings::from_llama(&v["timings"]),
        })
    }

    async fn stream_tokens(&self, req: &ContinuationRequest) -> Result<TokenStream, TargetError> {
        let alternatives = req.top_logprobs > 0;
        let events = post_sse(
            &self.http,
            &self.cfg,
            &join(&self.cfg.base_url, "completion"),
            &self.body_for(req, true).await,
            None,
        )
        .await?;
        // Each event carries the tokens of its piece of text (`return_tokens`); the last one
        // says `stop` and why. A piece may hold no token (text held back at a stop string).
        Ok(Box::pin(events.map(move |ev| {
            let v = ev?;
            let tokens = if v["tokens"].is_null() {
                Vec::new()
            } else {
                tokens_of(&v["tokens"], "/completion")?
            };
            let cached = v["timings"]["cache_n"]
                .as_u64()
                .and_then(|x| u32::try_from(x).ok());
            let last = v["stop"].as_bool() == Some(true);
            let top_logprobs = if alternatives {
                top_logprobs_of(&v)?
            } else {
                Vec::new()
            };
            Ok(StreamChunk {
                top_logprobs,
                tokens,
                stopped_on_eos: last && v["stop_type"].as_str() == Some("eos"),
                cached_prompt_tokens: cached,
                extra_calls: 0,
                // Read from the last event only: the call's totals, once.
                timings: if last {
                    TargetTimings::from_llama(&v["timings"])
                } else {
                    None
                },
            })
        })))
    }

    fn picks_among_tokens(&self) -> bool {
        true
    }

    async fn tokenize(&self, text: &str) -> Result<Option<Vec<u32>>, TargetError> {
        let body = json!({"content": text, "add_special": false, "parse_special": true});
        let v = post_json(
            &self.http,
            &self.cfg,
            &join(&self.cfg.base_url, "tokenize"),
            &body,
            None,
        )
        .await?;
        tokens_of(&v["tokens"], "/tokenize").map(Some)
    }

    async fn health(&self) -> Result<(), TargetError> {
        get_ok(&self.http, &self.cfg, &join(&self.cfg.base_url, "health")).await
    }

    fn answer_done(&self, answer: u64) {
        self.pins.release(answer);
    }

    fn warms(&self) -> bool {
        self.cfg.cache_hints.warm && self.cfg.cache_hints.slots
    }

    /// `n_predict: 0` on the answer's slot: llama-server computes the prompt into the slot's
    /// cache and samples nothing more (it reports one token predicted, in a microsecond: the
    /// one sampled from the prompt's last position, which is not used).
    async fn warm(&self, req: &ContinuationRequest) -> Result<Option<Continuation>, TargetError> {
        if !self.warms() {
            return Ok(None);
        }
        let mut b = self.body_for(req, false).await;
        if b.get("id_slot").is_none() {
            // Every slot is held: the server would choose one, and the answer's first call,
            // which names none either, might land on another.
            return Ok(None);
        }
        b["n_predict"] = json!(0);
        let v = post_json(
            &self.http,
            &self.cfg,
            &join(&self.cfg.base_url, "completion"),
            &b,
            None,
        )
        .await?;
        Ok(Some(Continuation {
            cached_prompt_tokens: v["timings"]["cache_n"]
                .as_u64()
                .and_then(|x| u32::try_from(x).ok()),
            timings: TargetTimings::from_llama(&v["timings"]),
            ..Continuation::default()
        }))
    }

    /// From `/props`: a slot's context (`default_generation_settings.n_ctx`, the server's
    /// context divided among its parallel slots), whether it takes images and audio
    /// (`modalities.vision`, `.audio`: a model without a projector answers either with a 500),
    /// and its slots (`total_slots`).
    async fn facts(&self) -> Result<TargetFacts, TargetError> {
        let v = get_json(&self.http, &self.cfg, &join(&self.cfg.base_url, "props")).await?;
        Ok(props_facts(&v))
    }
}

/// The slots a `/props` answer says the server has (`total_slots`).
fn props_slots(v: &Value) -> Option<usize> {
    v["total_slots"]
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
}

/// The facts in a `/props` answer.
fn props_facts(v: &Value) -> TargetFacts {
    TargetFacts {
        context_length: v["default_generation_settings"]["n_ctx"]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok()),
        images: v["modalities"]["vision"].as_bool(),
        audio: v["modalities"]["audio"].as_bool(),
        parallel: props_slots(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::serve_stub;

    /// The parts of a real `/props` answer of the test target that are read.
    #[test]
    fn props_say_the_slots_context_and_whether_images_are_taken() {
        let v = json!({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2,
                       "modalities": {"vision": false, "video": false, "audio": false}});
        assert_eq!(
            props_facts(&v),
            TargetFacts {
                context_length: Some(4096),
                images: Some(false),
                audio: Some(false),
                parallel: Some(2),
            }
        );
        assert_eq!(props_facts(&json!({})), TargetFacts::default());
        assert_eq!(props_slots(&v), Some(2));
        assert_eq!(props_slots(&json!({})), None);
    }

    /// The shape llama-server answers `"n_probs": 2` with (copied from a real answer of the
    /// test target, `bytes` fields left out): one entry per generated token, end of sequence
    /// included.
    #[test]
    fn top_logprobs_are_read_per_generated_token() {
        let v = json!({
            "tokens": [3351, 151645],
            "completion_probabilities": [
                {"id": 3351, "token": " today", "logprob": -0.1307, "top_logprobs": [
                    {"id": 3351, "token": " today", "logprob": -0.1307},
                    {"id": 30, "token": "?", "logprob": -2.1562}]},
                {"id": 151645, "token": "<|im_end|>", "logprob": -0.0001, "top_logprobs": [
                    {"id": 151645, "token": "<|im_end|>", "logprob": -0.0001},
                    {"id": 198, "token": "\n", "logprob": -9.5}]}
            ]
        });
        let got = top_logprobs_of(&v).unwrap_or_default();
        assert_eq!(
            got,
            vec![
                vec![(3351, -0.1307), (30, -2.1562)],
                vec![(151645, -0.0001), (198, -9.5)]
            ]
        );
        let req = ContinuationRequest {
            top_logprobs: 20,
            ..ContinuationRequest::greedy(vec![1, 2], 4)
        };
        assert_eq!(body(&req, false)["n_probs"], 20);
        assert!(body(&ContinuationRequest::greedy(vec![1], 1), false)["n_probs"].is_null());
        // No probabilities in the answer: none, not an error; a malformed entry is one.
        assert_eq!(
            top_logprobs_of(&json!({"tokens": [1]})).ok(),
            Some(Vec::new())
        );
        let bad = json!({"completion_probabilities": [{"top_logprobs": [{"id": "x"}]}]});
        assert!(top_logprobs_of(&bad).is_err());
    }

    /// A stub of llama-server's `/props` (`total_slots`, or none: a 404) and `/completion`
    /// (`{"tokens", "stop_type"}`, as a real non-streamed answer has them) that keeps the
    /// `id_slot` of every call; the slots it saw, and how often `/props` was asked.
    struct SlotStub {
        slots: std::sync::Mutex<Vec<Option<u64>>>,
        /// Each call's `n_predict`.
        predicts: std::sync::Mutex<Vec<Option<u64>>>,
        props: std::sync::atomic::AtomicU32,
        total: Option<u64>,
    }

    /// `named`: the policy's `target.cache.slots`.
    async fn slot_stub(total: Option<u64>, named: bool) -> (Arc<SlotStub>, LlamaCppTarget) {
        use axum::extract::State;
        use axum::routing::{get, post};
        let stub = Arc::new(SlotStub {
            slots: std::sync::Mutex::default(),
            predicts: std::sync::Mutex::default(),
            props: Default::default(),
            total,
        });
        let app = axum::Router::new()
            .route(
                "/props",
                get(|State(s): State<Arc<SlotStub>>| async move {
                    s.props.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    match s.total {
                        Some(t) => Ok(axum::Json(json!({"total_slots": t}))),
                        None => Err(axum::http::StatusCode::NOT_FOUND),
                    }
                }),
            )
            .route(
                "/completion",
                post(
                    |State(s): State<Arc<SlotStub>>, axum::Json(b): axum::Json<Value>| async move {
                        s.slots.lock().unwrap().push(b["id_slot"].as_u64());
                        s.predicts.lock().unwrap().push(b["n_predict"].as_u64());
                        let n = b["prompt"].as_array().map_or(0, Vec::len);
                        axum::Json(json!({"tokens": [5], "stop_type": "limit", "timings": {
                            "cache_n": 0, "prompt_n": n, "prompt_ms": 2.5,
                            "predicted_n": 1, "predicted_ms": 0.001}}))
                    },
                ),
            )
            .with_state(stub.clone());
        let mut cfg = serve_stub(app).await;
        cfg.cache_hints.slots = named;
        cfg.cache_hints.warm = named;
        (stub, LlamaCppTarget::new(cfg).unwrap())
    }

    /// A warm computes the prompt on the slot the answer's calls then name, generating
    /// nothing; where every slot is held, or the policy does not ask, nothing is sent.
    #[tokio::test]
    async fn a_warm_goes_to_the_slot_the_answers_calls_take() {
        let (stub, target) = slot_stub(Some(1), true).await;
        assert!(target.warms());
        let warmed = target.warm(&call_of(Some(1), vec![1, 2, 3])).await.unwrap();
        let t = warmed.and_then(|c| c.timings).unwrap();
        assert_eq!((t.prompt_tokens, t.prompt_ms), (3, 2.5));
        target
            .continue_tokens(&call_of(Some(1), vec![1, 2, 3, 4]))
            .await
            .unwrap();
        assert_eq!(*stub.slots.lock().unwrap(), vec![Some(0), Some(0)]);
        assert_eq!(*stub.predicts.lock().unwrap(), vec![Some(0), Some(1)]);
        // Answer 1 holds the one slot: answer 2 has nowhere to warm.
        assert!(
            target
                .warm(&call_of(Some(2), vec![7]))
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(stub.slots.lock().unwrap().len(), 2, "nothing sent");

        let (stub, target) = slot_stub(Some(2), false).await;
        assert!(!target.warms());
        assert!(
            target
                .warm(&call_of(Some(1), vec![1]))
                .await
                .unwrap()
                .is_none()
        );
        assert!(stub.slots.lock().unwrap().is_empty());
    }

    fn call_of(answer: Option<u64>, prefix: Vec<u32>) -> ContinuationRequest {
        ContinuationRequest {
            answer,
            ..ContinuationRequest::greedy(prefix, 1)
        }
    }

    #[tokio::test]
    async fn each_live_answer_names_a_slot_of_its_own() {
        let (stub, target) = slot_stub(Some(2), true).await;
        for (answer, prefix) in [(1, vec![1]), (2, vec![2]), (1, vec![1, 5]), (3, vec![3])] {
            target
                .continue_tokens(&call_of(Some(answer), prefix))
                .await
                .unwrap();
        }
        target
            .continue_tokens(&call_of(None, vec![4]))
            .await
            .unwrap();
        target.answer_done(1);
        target
            .continue_tokens(&call_of(Some(3), vec![3]))
            .await
            .unwrap();
        let seen = stub.slots.lock().unwrap().clone();
        let (a, b) = (seen[0].unwrap(), seen[1].unwrap());
        assert_ne!(a, b, "two live answers, two slots: {seen:?}");
        assert_eq!(seen[2], Some(a), "an answer's next call goes to its slot");
        assert_eq!(seen[3], None, "every slot held: the server chooses");
        assert_eq!(seen[4], None, "a call of no answer names no slot");
        assert_eq!(
            seen[5],
            Some(a),
            "the slot of an answer that is over is free"
        );
        assert_eq!(stub.props.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// No call names a slot where the server does not say how many it has (asked once), nor
    /// where the policy does not ask (not asked at all).
    #[tokio::test]
    async fn calls_name_no_slot_unless_asked_and_told() {
        for (total, named, asked) in [(None, true, 1), (Some(2), false, 0)] {
            let (stub, target) = slot_stub(total, named).await;
            for prefix in [vec![1], vec![1, 5]] {
                target
                    .continue_tokens(&call_of(Some(1), prefix))
                    .await
                    .unwrap();
            }
            assert_eq!(*stub.slots.lock().unwrap(), vec![None, None]);
            assert_eq!(
                stub.props.load(std::sync::atomic::Ordering::SeqCst),
                asked,
                "{total:?} slots, named: {named}"
            );
        }
    }
}
