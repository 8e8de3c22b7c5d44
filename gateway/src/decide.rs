//! The one decision per chat or completion request: does approxy answer it (draft, verifier,
//! target on rejection), or does the target answer it unchanged, and why. Checked in this
//! order, the first that applies deciding: the model's policy, whether the target can continue
//! a partial answer, features the draft loop does not implement, the request's validity (only
//! now: a request that passes through is the target's to judge), the tokenizer check, and a
//! free draft worker.

use std::sync::Arc;

use axum::http::HeaderMap;
use serde_json::{Map, Value};

use approxy_verifier::policy::Verification;
use approxy_verifier::request::{
    Constraint, Draft, GenerateRequest, GrammarSpec, Guard, JsonStyle, ToolChoice, Unsupported,
};

use crate::error::ApiError;
use crate::policy::{Mode, ModelPolicy, PromptKind, SpecialTokenText};
use crate::reason::Reason;
use crate::request::error::ValidationError;
use crate::request::format::{self, Format};
use crate::request::tools::{self, Tooling};
use crate::request::unsupported::unsupported_feature;
use crate::request::validate::{self, ValidRequest};
use crate::request::{self, Endpoint, Prompt, limits, prompt_kind, shapes};
use crate::state::{AppState, ModelRuntime, Runtime, Shared, TokenizerCheck};

/// Everything the approximate path needs, including the draft worker it will run on.
pub struct Approximate {
    /// The validated request.
    pub request: ValidRequest,
    /// Its prompt's kind (which of the policy's thresholds applies).
    pub prompt_kind: PromptKind,
    /// Engine parameters (prompt token ids, threshold, guard, the model's decode settings).
    pub generation: GenerateRequest,
    /// The model's policy entry: its policy, verifier and decode settings.
    pub model: Arc<ModelRuntime>,
    /// The leased draft streams, one per answer asked for (`n`; free again when dropped).
    pub drafts: Vec<Box<dyn Draft>>,
    /// Where its spend is recorded (budget guard).
    pub account: Option<crate::budget::Account>,
    /// Whether it may be passed through as sent if the engine fails before its first token
    /// (see [`passable`]).
    pub passable: bool,
}

/// The decision.
pub enum Decision {
    /// approxy answers.
    Approximate(Box<Approximate>),
    /// The target answers the request as sent.
    Passthrough(Reason),
}

/// Decides for one request body sent to `endpoint`. `Err` is a 400 (or a target failure
/// during the tokenizer check). The limits that hold on every path (`limits`) are checked
/// before the path is chosen, and a request that is to pass through is checked for
/// special-token text in its messages, as the policy says.
pub async fn decide(
    state: &AppState,
    rt: &Runtime,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Decision, ApiError> {
    let json: Value =
        serde_json::from_slice(body).map_err(|e| ValidationError::NotJson(e.to_string()))?;
    let Value::Object(map) = &json else {
        return Err(ValidationError::NotObject.into());
    };
    limits::check(endpoint, map, &rt.policy.gateway)?;
    // An image or a sound to a target that says it takes none is the client's mistake on
    // either path (llama-server answers it with a 500, which would read as the target failing).
    if endpoint == Endpoint::Chat {
        let image = shapes::has_part(map, &["image_url", "input_image"]);
        let audio = shapes::has_part(map, &["input_audio"]);
        if image || audio {
            let facts = rt.target_facts().await;
            let refused = if image && facts.images == Some(false) {
                Some("an image")
            } else if audio && facts.audio == Some(false) {
                Some("audio")
            } else {
                None
            };
            if let Some(what) = refused {
                return Err(ValidationError::Invalid {
                    param: "messages".into(),
                    reason: format!("holds {what}, and the target model takes none"),
                }
                .into());
            }
        }
    }
    cannot_fit(state, rt, endpoint, map).await?;
    let decision = choose(state, rt, endpoint, headers, &json, map).await?;
    if matches!(decision, Decision::Passthrough(_)) {
        passable(rt, &state.shared, map)?;
        within_the_targets_answers(rt, map).await?;
    }
    Ok(decision)
}

/// Refuses a request to pass through whose `n` is over the answers the target writes at once
/// (llama-server's slots): it would refuse it with a 400 of its own, counted against it, after
/// the request had waited for the decision. Within `gateway.max_n`, such an `n` is served
/// only where the draft takes every answer (`n` streams free).
async fn within_the_targets_answers(
    rt: &Runtime,
    map: &Map<String, Value>,
) -> Result<(), ValidationError> {
    let n = map
        .get("n")
        .and_then(Value::as_f64)
        .map_or(1, |n| n as usize);
    match rt.target_facts().await.parallel {
        Some(most) if n > most => Err(ValidationError::Invalid {
            param: "n".into(),
            reason: format!(
                "n = {n} is more than the {most} answers the target writes at once; this request is one the target answers itself, so ask for at most {most}"
            ),
        }),
        _ => Ok(()),
    }
}

/// Refuses, on either path, a prompt whose length alone says it cannot fit the target's
/// context: its text's bytes over the longest token's ([`Tokenizer::fewest_tokens`]). No
/// tokenizer runs for it, the gateway's or the target's.
///
/// [`Tokenizer::fewest_tokens`]: approxy_verifier::request::Tokenizer::fewest_tokens
async fn cannot_fit(
    state: &AppState,
    rt: &Runtime,
    endpoint: Endpoint,
    map: &Map<String, Value>,
) -> Result<(), ValidationError> {
    let at_least = state
        .shared
        .tokenizer
        .fewest_tokens(limits::prompt_bytes(endpoint, map));
    if at_least == 0 {
        return Ok(());
    }
    match rt.target_facts().await.context_length {
        Some(context) if at_least >= context => Err(ValidationError::CannotFit {
            endpoint,
            at_least,
            context,
        }),
        _ => Ok(()),
    }
}

/// Whether a request may be passed through as sent, beyond the limits every path has: its
/// messages hold no special-token text, unless the policy forwards it.
pub fn passable(
    rt: &Runtime,
    shared: &crate::state::Shared,
    body: &Map<String, Value>,
) -> Result<(), ValidationError> {
    match rt.policy.passthrough.special_token_text {
        SpecialTokenText::Forward => Ok(()),
        SpecialTokenText::Refuse => {
            limits::special_token_text(body, shared.tokenizer.special_texts())
        }
    }
}

/// The path for a request within the limits: admitted (valid, tokenized), then planned.
async fn choose(
    state: &AppState,
    rt: &Runtime,
    endpoint: Endpoint,
    headers: &HeaderMap,
    json: &Value,
    map: &Map<String, Value>,
) -> Result<Decision, ApiError> {
    match admit(state, rt, endpoint, headers, json, map).await? {
        Admission::Passthrough(reason) => Ok(Decision::Passthrough(reason)),
        Admission::Admitted(a) => plan(state, rt, a, map).await,
    }
}

/// A request approxy could answer: valid, its prompt tokenized.
struct Admitted {
    /// The model's policy entry.
    model: Arc<ModelRuntime>,
    /// The validated request.
    valid: ValidRequest,
    /// Its prompt's token ids.
    prompt: Vec<u32>,
    /// Its prompt's kind.
    kind: PromptKind,
    /// The threshold its header asks for, within the policy's range.
    requested: Option<f32>,
    /// The grammar its answer follows (structured output).
    constraint: Option<Constraint>,
}

/// Whether approxy takes the request on.
enum Admission {
    Admitted(Box<Admitted>),
    Passthrough(Reason),
}

/// A limitation of approxy's own, not the client's mistake: the policy's fallback turns it
/// into a passthrough for `reason`, or the error stands.
fn fallback(mp: &ModelPolicy, reason: Reason, e: impl Into<ApiError>) -> Result<Reason, ApiError> {
    if mp.fallback_to_passthrough {
        Ok(reason)
    } else {
        Err(e.into())
    }
}

/// Admits a request: its model's policy, the target's and the draft loop's abilities, the
/// request's validity (only now: a request that passes through is the target's to judge),
/// the tokenizer check, and its prompt's tokens.
async fn admit(
    state: &AppState,
    rt: &Runtime,
    endpoint: Endpoint,
    headers: &HeaderMap,
    json: &Value,
    map: &Map<String, Value>,
) -> Result<Admission, ApiError> {
    let Some(m) = rt.model(model_name(map)?) else {
        return Ok(Admission::Passthrough(Reason::ModelWithoutPolicy));
    };
    let mp = &m.policy;
    if let Some(r) = left_to_the_target(rt, mp, endpoint, map) {
        return Ok(Admission::Passthrough(r));
    }
    let (tools, spec) = match answerable_tools(rt, endpoint, map) {
        Ok(t) => t,
        Err(r) => return Ok(Admission::Passthrough(r)),
    };
    let typed =
        request::parse(json).map_err(|(path, reason)| ValidationError::from_parse(path, reason))?;
    let mut valid = validate::validate(endpoint, typed, &rt.policy.gateway)?;
    valid.tools = tools;
    if let Some(s) = spec.as_ref().filter(|s| s.choice == ToolChoice::Auto) {
        valid.auto_tools = s.tools.clone();
    }
    let requested = validate::requested_threshold(headers, mp)?;
    if let Some(r) = tokenizers_differ(rt, mp).await? {
        return Ok(Admission::Passthrough(r));
    }
    // Tokenizing stops past what the target's context holds (and past approxy's own limit,
    // `prompt_tokens` sees to that): a prompt's tokens beyond it are never counted.
    let context = rt.target_facts().await.context_length;
    let limit = context.map_or(usize::MAX, |c| c.saturating_sub(1));
    let (valid, tokens, kind) = tokenize(&state.shared, valid, limit).await?;
    let prompt = match tokens {
        Ok(p) => p,
        Err(e) => return too_long(mp, endpoint, context, e).map(Admission::Passthrough),
    };
    let constraint = match structured(state, m, spec, map).await? {
        Ok(c) => c,
        Err(reason) => return Ok(Admission::Passthrough(reason)),
    };
    Ok(Admission::Admitted(Box::new(Admitted {
        model: Arc::clone(m),
        valid,
        prompt,
        kind,
        requested,
        constraint,
    })))
}

/// The model the request names. It picks the policy, so it is the one field read before
/// deciding.
fn model_name(map: &Map<String, Value>) -> Result<&str, ValidationError> {
    match map.get("model") {
        Some(Value::String(s)) => Ok(s.as_str()),
        Some(_) => Err(ValidationError::Invalid {
            param: "model".into(),
            reason: "must be a string".into(),
        }),
        None => Err(ValidationError::Missing("model".into())),
    }
}

/// Why the target answers a request before it is even validated: the model's policy says so,
/// the target cannot continue a partial answer, or the request asks for what the draft loop
/// does not implement.
fn left_to_the_target(
    rt: &Runtime,
    mp: &ModelPolicy,
    endpoint: Endpoint,
    map: &Map<String, Value>,
) -> Option<Reason> {
    if mp.mode == Mode::Passthrough {
        return Some(Reason::PolicyPassthrough);
    }
    let kind = rt.policy.target.kind;
    // A chat-level target continues chat answers only: a completions prompt has no messages.
    if !kind.can_continue() || (kind.needs_messages() && endpoint == Endpoint::Completions) {
        return Some(Reason::TargetCannotContinue);
    }
    unsupported_feature(endpoint, map)
}

/// Why the target answers the request after the tokenizer check: its tokenizer is not the
/// draft's, or the check failed and the policy falls back to the target.
async fn tokenizers_differ(rt: &Runtime, mp: &ModelPolicy) -> Result<Option<Reason>, ApiError> {
    match rt.tokenizer_check().await {
        Ok(TokenizerCheck::Different(_)) => Ok(Some(Reason::TokenizerMismatch)),
        Ok(_) => Ok(None),
        Err(e) => fallback(mp, Reason::TokenizerCheckFailed, e).map(Some),
    }
}

/// A prompt that could not be tokenized within the limit. Past the target's context, the
/// target would refuse it on either path, so it is the client's 400; past approxy's own
/// limit only, the policy's fallback may pass it through.
fn too_long(
    mp: &ModelPolicy,
    endpoint: Endpoint,
    context: Option<usize>,
    e: ValidationError,
) -> Result<Reason, ApiError> {
    match e {
        e @ ValidationError::PromptTooLong { tokens, .. } => {
            if let Some(context) = context
                && tokens >= context
            {
                return Err(ValidationError::CannotFit {
                    endpoint,
                    at_least: tokens,
                    context,
                }
                .into());
            }
            fallback(mp, Reason::PromptTooLong, e)
        }
        e => Err(e.into()),
    }
}

/// The grammar the answer follows, if it is structured (tools, or a `response_format`), or
/// why the target answers instead. It is compiled before any draft work, and one the grammar
/// engine cannot take passes through: it is never answered unconstrained.
async fn structured(
    state: &AppState,
    m: &ModelRuntime,
    tools: Option<approxy_verifier::request::ToolsSpec>,
    map: &Map<String, Value>,
) -> Result<Result<Option<Constraint>, Reason>, ApiError> {
    let answer = match (tools, format::read(map)) {
        (Some(tools), _) => Format::Structured(GrammarSpec::Tools(tools)),
        (None, f) => f,
    };
    match answer {
        Format::Structured(spec) => Ok(constrain(state, m, spec).await?.map(Some)),
        Format::Text | Format::Unknown => Ok(Ok(None)),
    }
}

/// The grammar a structured answer follows, or why the target answers the request instead: a
/// model whose target scores every token (its own constrained answer is what the policy asks
/// for), or a schema the grammar engine does not read. A schema over the grammar's limits is
/// the client's 400: a constrained target would spend long on it and refuse it too, so it is
/// the client's to mend, at no target's expense.
async fn constrain(
    state: &AppState,
    m: &ModelRuntime,
    spec: GrammarSpec,
) -> Result<Result<Constraint, Reason>, ApiError> {
    let (param, reason) = match spec {
        GrammarSpec::Tools(_) => ("tools", Reason::Tools),
        _ => ("response_format", Reason::ResponseFormat),
    };
    if m.decode.verification.target_scores_every_token() {
        return Ok(Err(reason));
    }
    let style = JsonStyle {
        layout: m.policy.json_layout,
        fence: m.policy.json_fence,
    };
    match compile(&state.shared, spec, style).await {
        Ok(c) => Ok(Ok(c)),
        Err(why) if why.over_limits() => {
            tracing::info!(%why, "schema refused");
            Err(ApiError::bad(param, why.to_string()))
        }
        Err(why) => {
            tracing::info!(%why, "schema passed through");
            Ok(Err(Reason::SchemaUnsupported))
        }
    }
}

/// The tools approxy answers a chat request with (as sent, for the template) and their
/// grammar, or why it leaves them to the target: tools it does not read, tools asked for
/// together with a `response_format`, or tool traffic to a target that is sent messages or
/// renders its own template (approxy's rendering of the tools would not reach it).
fn answerable_tools(
    rt: &Runtime,
    endpoint: Endpoint,
    map: &Map<String, Value>,
) -> Result<(Vec<Value>, Option<approxy_verifier::request::ToolsSpec>), Reason> {
    if endpoint != Endpoint::Chat {
        return Ok((Vec::new(), None));
    }
    let tooling = tools::read(map);
    let own_rendering =
        rt.policy.target.kind.needs_messages() || rt.policy.target.chat_template.is_some();
    if own_rendering && (tooling != Tooling::Absent || tools::in_messages(map)) {
        return Err(Reason::Tools);
    }
    match tooling {
        Tooling::Absent => Ok((Vec::new(), None)),
        Tooling::Unsupported => Err(Reason::Tools),
        Tooling::Calls { .. } if format::read(map) != Format::Text => Err(Reason::Tools),
        Tooling::Calls { tools, spec } => Ok((tools, Some(spec))),
    }
}

/// The grammar for a structured answer, compiled off the async runtime (or from the cache),
/// or why the schema is not served. A compiler that cannot be built or that failed passes
/// the request through, as for a schema it does not read.
async fn compile(
    shared: &Shared,
    spec: GrammarSpec,
    style: JsonStyle,
) -> Result<Constraint, Unsupported> {
    let grammars = shared.grammars().await.map_err(Unsupported::Refused)?;
    let started = std::time::Instant::now();
    let compiled = tokio::task::spawn_blocking(move || grammars.constraint(&spec, style))
        .await
        .map_err(|e| Unsupported::Refused(format!("grammar compilation: {e}")))?;
    metrics::histogram!("approxy_grammar_compile_seconds").record(started.elapsed().as_secs_f64());
    compiled
}

/// The prompt's token ids and its kind. Rendering and tokenizing a prompt of megabytes takes
/// long enough to stall the async runtime's other requests: it runs on a blocking thread.
async fn tokenize(
    shared: &Arc<Shared>,
    valid: ValidRequest,
    limit: usize,
) -> Result<(ValidRequest, Result<Vec<u32>, ValidationError>, PromptKind), ApiError> {
    let shared = Arc::clone(shared);
    tokio::task::spawn_blocking(move || {
        let tokens = validate::prompt_tokens(
            &valid,
            &shared.template,
            &shared.tokenizer,
            shared.draft.meta().vocab_size,
            limit,
        );
        // A prompt of token ids is classified on its text.
        let decoded = match &valid.prompt {
            Prompt::Tokens(ids) => shared.tokenizer.decode(ids).ok(),
            _ => None,
        };
        let kind = prompt_kind::detect(&valid.prompt, decoded.as_deref());
        (valid, tokens, kind)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("prompt tokenization: {e}")))
}

/// Plans an admitted request: the target's and the draft's context, a draft worker, the
/// threshold and the cost guard.
async fn plan(
    state: &AppState,
    rt: &Runtime,
    a: Box<Admitted>,
    map: &Map<String, Value>,
) -> Result<Decision, ApiError> {
    let Admitted {
        model,
        mut valid,
        prompt,
        kind,
        requested,
        constraint,
    } = *a;
    let mp = &model.policy;
    fit_the_target(rt, prompt.len(), &mut valid).await?;
    let shared = &state.shared;
    if let Err(e) = fit_the_draft(shared, prompt.len(), &valid) {
        return fallback(mp, Reason::PromptTooLong, e).map(Decision::Passthrough);
    }
    let Some(drafts) = lease_drafts(shared, map, prompt.len() + valid.max_tokens as usize) else {
        return Ok(Decision::Passthrough(Reason::DraftSaturated));
    };
    let threshold = requested.unwrap_or_else(|| mp.threshold.get(kind));
    let (guard, account) = cost_guard(rt, shared, &model, kind, constraint.is_some());
    let mut generation = GenerateRequest {
        prompt,
        max_tokens: valid.max_tokens,
        sampling: valid.sampling,
        stop: valid.stop.clone(),
        threshold,
        cost_guard: guard,
        model: Some(valid.model.clone()),
        messages: match &valid.prompt {
            Prompt::Chat(m) => Some(Arc::new(m.clone())),
            Prompt::Text(_) | Prompt::Tokens(_) => None,
        },
        settings: Arc::clone(&model.decode),
        constraint,
    };
    own_settings(&mut generation, requested.is_some());
    Ok(Decision::Approximate(Box::new(Approximate {
        request: valid,
        prompt_kind: kind,
        generation,
        model,
        drafts,
        account,
        passable: passable(rt, &state.shared, map).is_ok(),
    })))
}

/// Checks the target's context before any draft work: a prompt it cannot hold would keep a
/// draft worker through its prefill only to fail at the first call. Passing it through would
/// fail the same way, so it is the client's 400 on either path. An answer the target would
/// cut at its context's end has its `max_tokens` cut the same way.
async fn fit_the_target(
    rt: &Runtime,
    prompt: usize,
    valid: &mut ValidRequest,
) -> Result<(), ValidationError> {
    let Some(context) = rt.target_facts().await.context_length else {
        return Ok(());
    };
    let asked = prompt + valid.max_tokens as usize;
    // Some targets write until their context is full; so does any target when the limit
    // is only the gateway's default, which the client never asked for (vLLM's own
    // default is what the context leaves).
    let writes_to_the_end =
        rt.policy.target.kind.abilities().fills_context || !valid.max_tokens_given;
    if prompt >= context || (asked > context && !writes_to_the_end) {
        return Err(ValidationError::TargetContextExceeded {
            prompt,
            max_tokens: valid.max_tokens,
            context,
        });
    }
    if asked > context {
        // As llama-server does: it writes until its context is full and stops ("length").
        valid.max_tokens = u32::try_from(context - prompt).unwrap_or(u32::MAX);
    }
    Ok(())
}

/// Checks the draft's context before any work: the draft cannot hold more, and failing
/// mid-answer would cost the tokens already streamed.
fn fit_the_draft(
    shared: &Shared,
    prompt: usize,
    valid: &ValidRequest,
) -> Result<(), ValidationError> {
    let context = shared.draft.meta().context_length;
    if prompt + valid.max_tokens as usize > context {
        return Err(ValidationError::ContextTooLong {
            prompt,
            max_tokens: valid.max_tokens,
            context,
        });
    }
    Ok(())
}

/// The draft streams for the request's `n` answers, each for `positions`, all or none
/// (`None`: the draft is saturated). Leased last, so a worker is held only by a request that
/// will use it.
fn lease_drafts(
    shared: &Shared,
    map: &Map<String, Value>,
    positions: usize,
) -> Option<Vec<Box<dyn Draft>>> {
    let n = map
        .get("n")
        .and_then(Value::as_f64)
        .map_or(1, |n| n as usize)
        .max(1);
    let mut drafts = Vec::with_capacity(n);
    for _ in 0..n {
        drafts.push(shared.draft.try_lease_for(positions)?);
    }
    Some(drafts)
}

/// The engine's cost guard for a request of `kind` to `model`, its target's work priced at
/// the rates of now, and the account its spend goes to (budget guard only).
fn cost_guard(
    rt: &Runtime,
    shared: &Shared,
    model: &ModelRuntime,
    kind: PromptKind,
    structured: bool,
) -> (Option<Guard>, Option<crate::budget::Account>) {
    let mp = &model.policy;
    let price = mp.price.at(|| rt.meter.rates());
    let output = crate::budget::Output::of(structured);
    shared
        .ledgers
        .guard(mp, price, &model.key, (kind, output), model.decode.cache)
}

/// Departs from the model's decode settings where the request calls for it.
fn own_settings(generation: &mut GenerateRequest, threshold_requested: bool) {
    if threshold_requested && generation.settings.json_thresholds.is_some() {
        // The client turned the dial: its threshold holds everywhere in the answer.
        generation.settings_mut().json_thresholds = None;
    }
    if generation.constraint.is_some()
        && generation.settings.verification == Verification::ApproximateWindows
    {
        // Windows are scored on the draft's free run ahead, which no grammar checks: a
        // structured answer is corrected by the model's spans or fixed corrections instead.
        generation.settings_mut().verification = Verification::Approximate;
    }
}
