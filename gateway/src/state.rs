//! Gateway state. [`Shared`] is fixed for the life of the process (draft workers, tokenizer,
//! chat template, metrics); [`Runtime`] is built from a policy and swapped as a whole when
//! the policy file changes, so a request keeps the runtime it started with.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;

use approxy_verifier::infer::{
    DecodeSettings, DraftWorkers, Engine, EngineError, Grammars, TargetClient, TargetConfig,
    TargetFacts, Verifier,
};
use approxy_verifier::request::{ChatTemplate, Tokenizer};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::{OnceCell, Semaphore};

use crate::policy::{Auth, Mode, ModelPolicy, Policy};

/// Process-wide parts.
pub struct Shared {
    /// Draft workers (ONNX Runtime sessions; scripted ones in tests).
    pub draft: Arc<dyn DraftWorkers>,
    /// Draft tokenizer.
    pub tokenizer: Tokenizer,
    /// Chat template.
    pub template: ChatTemplate,
    /// Ids that end a generation.
    pub eos: Vec<u32>,
    /// Identity of the draft model, checked against learned verifier artifacts.
    pub draft_sha256: String,
    /// Prometheus renderer.
    pub prometheus: PrometheusHandle,
    /// Requests in flight (permits live as long as the response body).
    pub inflight: Arc<Semaphore>,
    /// Bytes of request bodies being read before their requests take a slot.
    pub body_budget: crate::body_budget::BodyBudget,
    /// Policy file watched for changes.
    pub policy_path: PathBuf,
    /// The budget guard's ledgers (kept across policy reloads).
    pub ledgers: crate::budget::Ledgers,
    /// What each target's time costs, as learned (kept across policy reloads).
    pub meters: crate::meters::Meters,
    /// The grammar compiler for structured output (its token trie takes half a second), built
    /// at start-up beside the first requests, or by the first request that needs it if that
    /// comes first; or why it could not be.
    pub grammars: OnceCell<Result<Arc<Grammars>, String>>,
}

impl Shared {
    /// The grammar compiler, built off the async runtime on first use.
    pub async fn grammars(&self) -> Result<Arc<Grammars>, String> {
        self.grammars
            .get_or_init(|| async {
                let tokenizer = self.tokenizer.clone();
                let width = self.draft.meta().vocab_size;
                let eos = self.eos.clone();
                let built = tokio::task::spawn_blocking(move || {
                    Grammars::new(&tokenizer, width, &eos).map(Arc::new)
                })
                .await;
                match built {
                    Ok(Ok(g)) => Ok(g),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(e) => Err(format!("grammar compiler: {e}")),
                }
            })
            .await
            .clone()
    }
}

/// Outcome of the draft/target tokenizer comparison, done once per runtime.
#[derive(Debug, Clone)]
pub enum TokenizerCheck {
    /// Identical on the probe text.
    Same,
    /// The target has no tokenize endpoint; approximate mode is trusted to the operator.
    Unchecked,
    /// Different: approximate mode refused.
    Different(String),
    /// The target is sent text and its answers are re-tokenized: nothing to compare.
    NotNeeded,
}

/// What one policy entry (a model id, or `"*"` for the rest) needs for every request to it,
/// built once with the runtime.
pub struct ModelRuntime {
    /// The entry's key: a model id or `"*"` (its budget ledger's name).
    pub key: String,
    /// Its policy.
    pub policy: ModelPolicy,
    /// Its verifier.
    pub verifier: Arc<dyn Verifier>,
    /// Its decode settings, which its requests share.
    pub decode: Arc<DecodeSettings>,
}

/// Everything derived from one policy.
pub struct Runtime {
    /// The policy.
    pub policy: Arc<Policy>,
    /// Engine (draft tokenizer + target client).
    pub engine: Engine,
    /// Per policy entry (model id or `"*"`).
    pub models: HashMap<String, Arc<ModelRuntime>>,
    /// HTTP client for passthrough and readiness, with the policy's TLS settings.
    pub http: reqwest::Client,
    /// The connection settings the policy gives the target: the engine's client and
    /// passthrough share them, with their retry policy.
    pub target_config: TargetConfig,
    /// The target's API key, from the environment. Never logged.
    pub target_key: Option<String>,
    /// Client keys; empty only when the policy says `auth = "none"`.
    pub client_keys: Vec<String>,
    /// Lazily computed tokenizer comparison.
    pub tokenizer_check: OnceCell<TokenizerCheck>,
    /// What the target says of itself, once known.
    pub target_facts: OnceCell<TargetFacts>,
    /// When the target last failed to say it.
    facts_failed_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// What the target's time costs, as learned from its reports.
    pub meter: Arc<crate::meters::TargetMeter>,
    /// Cores each draft worker's inference uses (a request's draft seconds times this bounds
    /// the cores it held).
    pub draft_threads: usize,
}

/// Longest wait for the target to say what it is (`Runtime::target_facts`).
const FACTS_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a target that failed to say what it is goes unasked.
const FACTS_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

impl Runtime {
    /// Builds a runtime with the target client the policy names; fails when a verifier
    /// artifact cannot be used.
    pub fn build(policy: Policy, shared: &Shared) -> anyhow::Result<Self> {
        let t = &policy.target;
        let target = approxy_verifier::infer::connect(
            t.kind,
            Self::target_config(&policy),
            &shared.tokenizer,
            t.prefix_style,
            t.chat_template.as_deref(),
        )?;
        Self::with_target(policy, shared, target)
    }

    fn target_config(policy: &Policy) -> TargetConfig {
        TargetConfig {
            base_url: policy.target.base_url.clone(),
            api_key: target_key(policy),
            // Calls name the client's model id; this is only the fallback for calls made
            // outside a request.
            model: policy
                .models
                .keys()
                .find(|k| *k != "*")
                .cloned()
                .unwrap_or_default(),
            timeout: policy.target.timeout,
            retries: policy.target.retries,
            backoff: policy.target.backoff,
            ca_file: policy.target.ca_file.clone(),
            cache_hints: policy.target.cache_hints.clone(),
            use_env_proxy: policy.target.use_env_proxy,
        }
    }

    /// Builds a runtime around a given target client (tests pass a scripted one).
    pub fn with_target(
        policy: Policy,
        shared: &Shared,
        target: Arc<dyn TargetClient>,
    ) -> anyhow::Result<Self> {
        let target_key = target_key(&policy);
        let client_keys: Vec<String> = policy
            .gateway
            .api_keys_env
            .as_ref()
            .and_then(|v| std::env::var(v).ok())
            .map(|s| {
                s.split(',')
                    .map(|k| k.trim().to_string())
                    .filter(|k| !k.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        match policy.gateway.auth {
            Auth::Keys if client_keys.is_empty() => anyhow::bail!(
                "gateway.api_keys_env names {:?}, which holds no key: set it (comma-separated keys), or say gateway.auth = \"none\" to run without auth",
                policy.gateway.api_keys_env.as_deref().unwrap_or_default()
            ),
            Auth::Keys => {}
            Auth::None => tracing::warn!(
                "gateway.auth = \"none\": ANY CLIENT THAT CAN REACH THIS PORT USES THE TARGET ON YOUR KEY; keep it on a trusted network"
            ),
        }
        let target_config = Self::target_config(&policy);
        let http =
            approxy_verifier::infer::transport::http_client_builder(&target_config)?.build()?;
        let kind = policy.target.kind;
        if !kind.can_continue() && policy.models.values().any(|m| m.mode == Mode::Approximate) {
            tracing::warn!(
                kind = kind.policy_name(),
                "this target cannot continue a partial answer: every request passes through (reason target_cannot_continue)"
            );
        }
        let engine = Engine::new(shared.tokenizer.clone(), target, shared.eos.clone());
        let mut models = HashMap::new();
        for (key, m) in &policy.models {
            let model = ModelRuntime {
                key: key.clone(),
                policy: m.clone(),
                verifier: verifier(key, m, &policy, shared)?,
                decode: Arc::new(DecodeSettings {
                    verification: m.verification,
                    correction: m.correction,
                    bailout: m.bailout,
                    max_target_calls: m.max_target_calls,
                    cache: policy.target.cache_rules,
                    overlap: m.overlap,
                    prompt_lookup: m.prompt_lookup,
                    window_max: m.window_max,
                    json_thresholds: m.structured_threshold,
                }),
            };
            models.insert(key.clone(), Arc::new(model));
        }
        let meter = shared
            .meters
            .meter(&policy.target.base_url, policy.target.busy_prior);
        let draft_threads = policy.draft.threads_per_worker;
        Ok(Self {
            policy: Arc::new(policy),
            engine,
            models,
            http,
            target_config,
            target_key,
            client_keys,
            tokenizer_check: OnceCell::new(),
            target_facts: OnceCell::new(),
            facts_failed_at: std::sync::Mutex::new(None),
            meter,
            draft_threads,
        })
    }

    /// The entry a model id is served by: its own, or `"*"`'s.
    pub fn model(&self, id: &str) -> Option<&Arc<ModelRuntime>> {
        self.models.get(id).or_else(|| self.models.get("*"))
    }

    /// What the target says of itself (asked once; a failure is kept for `FACTS_RETRY` and
    /// then the target is asked again, so one that comes up later is heard; meanwhile nothing
    /// is known), with the policy's `target.context_length` over its own word.
    pub async fn target_facts(&self) -> TargetFacts {
        // Requests queue on the first ask: without the memo, each would wait for its own ask
        // (up to FACTS_WAIT) behind a target that hangs, and a target that always fails would
        // be asked, and logged, once per request.
        let failed_lately = || {
            self.facts_failed_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_some_and(|t| t.elapsed() < FACTS_RETRY)
        };
        let said = match self.target_facts.get() {
            Some(f) => *f,
            None if failed_lately() => TargetFacts::default(),
            None => self
                .target_facts
                .get_or_try_init(|| async {
                    if failed_lately() {
                        return Err(());
                    }
                    // Bounded like a readiness probe: a request waits on it at most this long.
                    let asked = tokio::time::timeout(FACTS_WAIT, self.engine.target().facts())
                        .await
                        .map_err(|_| "no answer in time".to_string())
                        .and_then(|r| r.map_err(|e| e.to_string()));
                    match asked {
                        Ok(facts) => {
                            tracing::info!(context = ?facts.context_length, images = ?facts.images, "what the target says of itself");
                            Ok(facts)
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, retry_in = ?FACTS_RETRY, "the target did not say what it is");
                            *self
                                .facts_failed_at
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                                Some(std::time::Instant::now());
                            Err(())
                        }
                    }
                })
                .await
                .ok()
                .copied()
                .unwrap_or_default(),
        };
        TargetFacts {
            context_length: self.policy.target.context_length.or(said.context_length),
            ..said
        }
    }

    /// Compares tokenizers once; target errors are not cached (the target may come up later).
    pub async fn tokenizer_check(&self) -> Result<&TokenizerCheck, EngineError> {
        self.tokenizer_check
            .get_or_try_init(|| async {
                if self.policy.target.kind.is_text_level() {
                    return Ok(TokenizerCheck::NotNeeded);
                }
                match self.engine.check_tokenizer().await {
                    Ok(true) => Ok(TokenizerCheck::Same),
                    Ok(false) => Ok(TokenizerCheck::Unchecked),
                    Err(EngineError::TokenizerMismatch(m)) => {
                        tracing::error!(%m, "approximate mode refused");
                        Ok(TokenizerCheck::Different(m))
                    }
                    Err(e) => Err(e),
                }
            })
            .await
    }
}

/// The verifier a policy entry names, loaded for the draft; one calibrated against a target
/// must be run against that target.
fn verifier(
    id: &str,
    m: &ModelPolicy,
    policy: &Policy,
    shared: &Shared,
) -> anyhow::Result<Arc<dyn Verifier>> {
    let v = m.verifier.load(&shared.draft_sha256, shared.draft.meta())?;
    if let Some(target) = v.calibrated_with() {
        // Its thresholds mean something only for the pair it was calibrated on.
        if policy.target.model.as_deref() != Some(target) {
            anyhow::bail!(
                "models.{id:?}: the {} was calibrated with target {target:?}, but this policy's target.model is {}; \
                 use verifier = \"confidence\", or calibrate for this pair (approxy train collect --target-kind ..., then train fit --target NAME)",
                m.verifier,
                policy
                    .target
                    .model
                    .as_deref()
                    .map_or("not set".to_string(), |m| format!("{m:?}"))
            );
        }
        tracing::info!(model = %id, verifier = %m.verifier, draft_sha256 = %shared.draft_sha256, target, "verifier for this draft-target pair");
    }
    Ok(v)
}

/// The target's API key, from the environment variable the policy names.
fn target_key(policy: &Policy) -> Option<String> {
    policy
        .target
        .api_key_env
        .as_ref()
        .and_then(|v| std::env::var(v).ok())
        .filter(|k| !k.is_empty())
}

/// Shared state handed to every handler and layer.
#[derive(Clone)]
pub struct AppState {
    /// Fixed parts.
    pub shared: Arc<Shared>,
    runtime: Arc<ArcSwap<Runtime>>,
}

/// The runtime one request runs under, taken once by the first layer of the stack and kept in
/// the request's extensions: every layer and handler after it reads this one, so a reload
/// between them cannot give one request the auth of one policy and the limits of another.
#[derive(Clone)]
pub struct Snapshot(pub Arc<Runtime>);

impl AppState {
    /// State with an initial runtime.
    pub fn new(shared: Arc<Shared>, runtime: Runtime) -> Self {
        Self {
            shared,
            runtime: Arc::new(ArcSwap::from_pointee(runtime)),
        }
    }

    /// The current runtime. Inside the API stack, read the request's [`Snapshot`] instead
    /// ([`AppState::runtime_of`]).
    pub fn runtime(&self) -> Arc<Runtime> {
        self.runtime.load_full()
    }

    /// The runtime the request with these extensions runs under: its [`Snapshot`], or the
    /// current one for a request outside the API stack (the probes).
    pub fn runtime_of(&self, extensions: &axum::http::Extensions) -> Arc<Runtime> {
        extensions
            .get::<Snapshot>()
            .map_or_else(|| self.runtime(), |s| Arc::clone(&s.0))
    }

    /// Swaps in a new runtime; requests in flight keep the old one.
    pub fn replace(&self, rt: impl Into<Arc<Runtime>>) {
        self.runtime.store(rt.into());
    }
}
