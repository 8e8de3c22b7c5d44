//! Structured output: the grammar a request's answer must follow (any JSON object, or a JSON
//! Schema), compiled by llguidance against the draft's vocabulary, and the per-request
//! [`Constraint`] the decode loop consults at every position: which tokens it allows, which it
//! forces, and whether a target's token keeps the answer valid.
//!
//! Compiled grammars are cached by their schema's text, so a client that sends the same schema
//! with every request pays for compiling it once.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::earley::SlicedBiasComputer;
use llguidance::toktrie::{InferenceCapabilities, SimpleVob};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

use crate::error::EngineError;
use crate::tokenizer::Tokenizer;

mod compact;
pub mod fence;
mod indented;
pub mod place;
pub mod tools;
mod vocab;

pub use compact::MAX_SCHEMA_BYTES;
use compact::compact;
pub use indented::JsonLayout;
pub use place::{JsonPlace, Place};
pub use tools::{Tool, ToolChoice, ToolsSpec};

/// Longest a compilation may take; a schema that took longer is refused (and stays refused:
/// the refusal is cached too).
pub const COMPILE_TIME_LIMIT: Duration = Duration::from_secs(1);

/// Grammars kept, compiled or refused.
const CACHED_GRAMMARS: usize = 256;

/// Most text of the grammars kept compiled (their cache keys: the schema or Lark text). A
/// compiled grammar's memory grows with its text, so the cache is bounded in bytes as well as
/// in entries: 256 large schemas would otherwise hold hundreds of MiB (deploy/README.md,
/// "Sizing"). A refusal keeps only its key.
pub const CACHED_GRAMMAR_TEXT: usize = 1 << 20;

/// What opens and closes a JSON answer the model wraps in a Markdown fence, as llama-server's
/// own grammar for a `response_format` lets it (`common/chat-auto-parser-generator.cpp`:
/// "```json", whitespace, the value, whitespace, "```", or the value alone). The fence is not
/// part of the answer: the gateway takes it off.
pub const FENCE_OPEN: &str = "```json\n";
/// See [`FENCE_OPEN`].
pub const FENCE_CLOSE: &str = "\n```";

/// Whether a JSON answer comes inside [`FENCE_OPEN`] and [`FENCE_CLOSE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// Never: the answer starts at its `{`.
    Never,
    /// As the model picks at the first token.
    Optional,
    /// Always: the grammar forces the fence.
    Always,
}

impl Fence {
    /// The policy's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Fence::Never => "never",
            Fence::Optional => "optional",
            Fence::Always => "always",
        }
    }

    /// From the policy's name.
    pub fn parse(s: &str) -> Option<Self> {
        [Fence::Never, Fence::Optional, Fence::Always]
            .into_iter()
            .find(|f| f.name() == s)
    }

    /// `lark` (a grammar of one JSON value, its rule `start` first) with the value fenced as
    /// this says.
    fn around(self, lark: &str) -> String {
        let body = lark.strip_prefix("start:").unwrap_or(lark);
        let (open, close) = (
            Value::String(FENCE_OPEN.into()),
            Value::String(FENCE_CLOSE.into()),
        );
        match self {
            Fence::Never => lark.to_string(),
            Fence::Optional => format!("start: answer | {open} answer {close}\nanswer:{body}"),
            Fence::Always => format!("start: {open} answer {close}\nanswer:{body}"),
        }
    }
}

/// How a JSON answer is written: its layout, and whether it comes inside a fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonStyle {
    /// Where its line breaks go.
    pub layout: JsonLayout,
    /// Whether it comes inside [`FENCE_OPEN`] and [`FENCE_CLOSE`].
    pub fence: Fence,
}

impl From<JsonLayout> for JsonStyle {
    fn from(layout: JsonLayout) -> Self {
        Self {
            layout,
            fence: Fence::Never,
        }
    }
}

/// What a request's answer must be.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON Schema (`response_format: {"type": "json_schema"}`).
    JsonSchema(Value),
    /// Text or tool calls (`tools`, `tool_choice`, `parallel_tool_calls`).
    Tools(ToolsSpec),
}

impl GrammarSpec {
    /// What llguidance compiles, as the text it is cached under and the grammar. A schema the
    /// indented layout does not lay out is compiled compact. A JSON answer is fenced as `fence`
    /// says (see [`FENCE_OPEN`]); tool calls never are.
    fn grammar(&self, layout: JsonLayout, fence: Fence) -> (String, TopLevelGrammar) {
        let lark = |l: String| (format!("lark:{l}"), TopLevelGrammar::from_lark(l));
        let schema = match self {
            GrammarSpec::Tools(t) => return lark(t.lark()),
            GrammarSpec::JsonObject => json!({"type": "object"}),
            GrammarSpec::JsonSchema(s) => s.clone(),
        };
        let laid_out = match (layout, self) {
            (JsonLayout::Indented, GrammarSpec::JsonObject) => Some(indented::any_object_lark()),
            (JsonLayout::Indented, GrammarSpec::JsonSchema(s)) => indented::schema_lark(s),
            _ => None,
        };
        let schema = compact(schema);
        match laid_out {
            Some(l) => lark(fence.around(&l)),
            None if fence != Fence::Never => {
                lark(fence.around(&format!("start: %json {schema}\n")))
            }
            None => (
                format!("json:{schema}"),
                TopLevelGrammar::from_json_schema(schema),
            ),
        }
    }
}

/// Why a grammar was not compiled. A schema over approxy's grammar limits is the client's
/// to mend ([`Unsupported::over_limits`]): a grammar-constrained target would spend long on it
/// and refuse it too, as OpenAI's own structured outputs cap a schema's size. Any other
/// refusal (a keyword llguidance does not read) passes through as `schema_unsupported`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unsupported {
    /// The schema's text is over [`MAX_SCHEMA_BYTES`].
    #[error(
        "the schema is over the grammar's limits: {0} bytes, over the {MAX_SCHEMA_BYTES} compiled"
    )]
    TooLarge(usize),
    /// It admits no finite answer, or its answer's first tokens are over llguidance's parser
    /// limits: a `$ref` cycle, required properties that recurse, thousands of optional ones.
    #[error("the schema is over the grammar's limits: {0}")]
    Unbounded(String),
    /// llguidance refused it (an unsupported keyword, an unsatisfiable schema).
    #[error("the schema cannot be compiled: {0}")]
    Refused(String),
    /// It compiled, and reached its first free token, slower than [`COMPILE_TIME_LIMIT`].
    #[error(
        "the schema is over the grammar's limits: it took {0:?} to compile and reach its first free token, over {COMPILE_TIME_LIMIT:?}"
    )]
    TooSlow(Duration),
}

impl Unsupported {
    /// Whether the schema is over approxy's limits (the client's 400), rather than written in
    /// a form only the target may read (a passthrough).
    pub fn over_limits(&self) -> bool {
        !matches!(self, Unsupported::Refused(_))
    }

    /// llguidance's error, as one line without the parser's state (which quotes the client's
    /// schema), sorted by whether it is a limit.
    fn from_llguidance(e: &str) -> Self {
        let line = e.lines().next().unwrap_or_default();
        let line: String = line.chars().take(200).collect();
        const LIMITS: [&str; 7] = [
            "NoExtensionBias",
            "circular reference",
            "Too many items",
            "items; max is",
            "too big",
            "TooComplex",
            "no token is allowed",
        ];
        if line == "NoExtensionBias" || line.is_empty() {
            return Unsupported::Unbounded("it admits no finite JSON value".into());
        }
        if LIMITS.iter().any(|l| line.contains(l)) {
            Unsupported::Unbounded(line)
        } else {
            Unsupported::Refused(line)
        }
    }
}

/// Compiled grammars, FIFO-bounded in entries and in the text of those compiled.
#[derive(Default)]
struct Cache {
    map: HashMap<String, Result<Matcher, Unsupported>>,
    order: VecDeque<String>,
    /// The text of the compiled grammars held ([`CACHED_GRAMMAR_TEXT`] at most).
    text: usize,
}

impl Cache {
    /// What an entry weighs against [`CACHED_GRAMMAR_TEXT`].
    fn weight(key: &str, entry: &Result<Matcher, Unsupported>) -> usize {
        if entry.is_ok() { key.len() } else { 0 }
    }

    /// Keeps `entry` under `key`, dropping the oldest entries until both bounds hold.
    fn keep(&mut self, key: String, entry: Result<Matcher, Unsupported>) {
        if self.map.contains_key(&key) {
            return;
        }
        let weight = Self::weight(&key, &entry);
        if weight > CACHED_GRAMMAR_TEXT {
            return;
        }
        while self.order.len() >= CACHED_GRAMMARS || self.text + weight > CACHED_GRAMMAR_TEXT {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(e) = self.map.remove(&old) {
                self.text -= Self::weight(&old, &e);
            }
        }
        self.text += weight;
        self.order.push_back(key.clone());
        self.map.insert(key, entry);
    }
}

/// The grammar compiler for one draft vocabulary, with its cache.
pub struct Grammars {
    factory: ParserFactory,
    cache: Mutex<Cache>,
    eos: Vec<u32>,
    /// [`FENCE_OPEN`] in the draft's tokens: the way into a fenced answer's value.
    fence_open: Vec<u32>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("eos", &self.eos).finish()
    }
}

impl Grammars {
    /// A compiler for the draft's vocabulary: `width` logits, `eos` ending an answer. Builds
    /// the token trie and its slices once (a fraction of a second for 152k tokens).
    pub fn new(tokenizer: &Tokenizer, width: usize, eos: &[u32]) -> Result<Self, EngineError> {
        let env = vocab::tok_env(tokenizer, width, eos)?;
        let caps = InferenceCapabilities {
            ff_tokens: true,
            ..InferenceCapabilities::default()
        };
        let mut factory = ParserFactory::new(&env, caps, &SlicedBiasComputer::general_slices())
            .map_err(|e| EngineError::Grammar(format!("grammar engine: {e}")))?;
        factory.quiet();
        Ok(Self {
            factory,
            cache: Mutex::new(Cache::default()),
            eos: eos.to_vec(),
            fence_open: tokenizer.encode_plain(FENCE_OPEN)?,
        })
    }

    /// The constraint for one answer under `spec`, its JSON written as `style` says,
    /// compiled or from the cache. Takes up to [`COMPILE_TIME_LIMIT`] on a new schema: call
    /// it off the async runtime. A schema whose indented grammar llguidance refuses, or whose
    /// Lark text is over [`MAX_SCHEMA_BYTES`], is tried compact, so the layout makes no schema
    /// unsupported that the compact form supports (a slow one aside).
    pub fn constraint(
        &self,
        spec: &GrammarSpec,
        style: impl Into<JsonStyle>,
    ) -> Result<Constraint, Unsupported> {
        let style = style.into();
        let laid_out = self.constraint_as(spec, style);
        match laid_out {
            Err(Unsupported::Refused(_) | Unsupported::TooLarge(_) | Unsupported::Unbounded(_))
                if style.layout != JsonLayout::Compact =>
            {
                let compact = JsonStyle {
                    layout: JsonLayout::Compact,
                    ..style
                };
                self.constraint_as(spec, compact)
            }
            other => other,
        }
    }

    fn constraint_as(
        &self,
        spec: &GrammarSpec,
        style: JsonStyle,
    ) -> Result<Constraint, Unsupported> {
        let (key, grammar) = spec.grammar(style.layout, style.fence);
        let several = matches!(spec, GrammarSpec::Tools(t) if t.several_calls());
        let json = !matches!(spec, GrammarSpec::Tools(_));
        let fenced = style.fence != Fence::Never && json;
        let wrap = |m: Matcher| self.wrap(m, several, fenced, json);
        if let Some(found) = self.cached(&key) {
            return found.map(wrap);
        }
        let compiled = self.compile(grammar, key.len(), fenced);
        let kept = match &compiled {
            Ok(m) => Ok(m.deep_clone()),
            Err(e) => Err(e.clone()),
        };
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keep(key, kept);
        compiled.map(wrap)
    }

    fn cached(&self, key: &str) -> Option<Result<Matcher, Unsupported>> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.map.get(key).map(|r| match r {
            Ok(m) => Ok(m.deep_clone()),
            Err(e) => Err(e.clone()),
        })
    }

    fn compile(
        &self,
        grammar: TopLevelGrammar,
        bytes: usize,
        fenced: bool,
    ) -> Result<Matcher, Unsupported> {
        if bytes > MAX_SCHEMA_BYTES {
            return Err(Unsupported::TooLarge(bytes));
        }
        let started = Instant::now();
        let parser = self.factory.create_parser(grammar);
        let matcher = Matcher::new(parser);
        if let Some(e) = matcher.get_error() {
            return Err(Unsupported::from_llguidance(&e));
        }
        // A schema that compiles can still fail at its answer's first token (a `$ref` cycle
        // has no value to start; required recursion forces tokens until the parser's limits):
        // a copy walks to the first free choice, inside the fence where there is one, so that
        // such a schema is refused here, once and cached, never mid-answer.
        let mut probe = matcher.deep_clone();
        if fenced
            && matches!(probe.validate_tokens(&self.fence_open), Ok(n) if n == self.fence_open.len())
        {
            probe
                .consume_tokens(&self.fence_open)
                .map_err(|e| Unsupported::from_llguidance(&e.to_string()))?;
        }
        self.walk_to_first_choice(&mut probe, started)?;
        let took = started.elapsed();
        if took > COMPILE_TIME_LIMIT {
            return Err(Unsupported::TooSlow(took));
        }
        Ok(matcher)
    }

    /// Takes the forced tokens until the answer's first free choice (or its end), as the
    /// decode loop would, within [`COMPILE_TIME_LIMIT`] of `started`.
    fn walk_to_first_choice(&self, m: &mut Matcher, started: Instant) -> Result<(), Unsupported> {
        let refused =
            |m: &Matcher, e: String| Unsupported::from_llguidance(&m.get_error().unwrap_or(e));
        loop {
            if m.is_stopped() {
                return Ok(());
            }
            let forced = m.compute_ff_tokens();
            if m.is_error() {
                return Err(refused(m, "forced tokens".into()));
            }
            if started.elapsed() > COMPILE_TIME_LIMIT {
                return Err(Unsupported::TooSlow(started.elapsed()));
            }
            if forced.is_empty() {
                let mask = m.compute_mask().map_err(|e| refused(m, e.to_string()))?;
                if mask.is_zero() {
                    return Err(refused(m, "no token is allowed".into()));
                }
                return Ok(());
            }
            m.consume_tokens(&forced)
                .map_err(|e| refused(m, e.to_string()))?;
        }
    }

    fn wrap(&self, matcher: Matcher, several_calls: bool, fenced: bool, json: bool) -> Constraint {
        Constraint {
            matcher,
            eos: self.eos.clone(),
            several_calls,
            fenced,
            json,
        }
    }
}

/// What the grammar says of the next position.
#[derive(Debug)]
pub enum Next {
    /// These tokens, and only these, come next: emitted without the verifier or the target.
    Forced(Vec<u32>),
    /// The answer is complete and only its end is allowed.
    End,
    /// The draft chooses among the allowed tokens (at least two, or one and the end).
    Choose(Mask),
}

/// The tokens allowed at one position.
#[derive(Debug)]
pub struct Mask(SimpleVob);

impl Mask {
    /// Sets every token the grammar forbids to −∞.
    pub fn apply(&self, logits: &mut [f32]) {
        let n = logits.len();
        self.0.iter_unset_entries(|i| {
            if i < n {
                logits[i] = f32::NEG_INFINITY;
            }
        });
        // Logits past the mask's width (none for the draft it was built for) stay allowed
        // only if the mask says so: it does not, so they go too.
        for l in logits.iter_mut().skip(self.0.len()) {
            *l = f32::NEG_INFINITY;
        }
    }

    /// Whether the token is allowed.
    pub fn allows(&self, token: u32) -> bool {
        (token as usize) < self.0.len() && self.0.is_allowed(token)
    }
}

/// One answer's grammar state. Every token the answer takes goes through
/// [`Constraint::consume`]; a token from elsewhere (the target) is checked first with
/// [`Constraint::allows`].
pub struct Constraint {
    matcher: Matcher,
    eos: Vec<u32>,
    several_calls: bool,
    fenced: bool,
    json: bool,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").finish_non_exhaustive()
    }
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            eos: self.eos.clone(),
            several_calls: self.several_calls,
            fenced: self.fenced,
            json: self.json,
        }
    }
}

impl Constraint {
    fn failed(&self, what: &str, e: impl std::fmt::Display) -> EngineError {
        let detail = self.matcher.get_error().unwrap_or_else(|| e.to_string());
        EngineError::Grammar(format!("{what}: {detail}"))
    }

    /// Whether the answer may make several tool calls (see [`tools::CallRepeats`]).
    pub fn several_calls(&self) -> bool {
        self.several_calls
    }

    /// Whether the answer may come inside a Markdown fence ([`FENCE_OPEN`]), which is not part
    /// of what the client is sent.
    pub fn fenced(&self) -> bool {
        self.fenced
    }

    /// Whether the answer is one JSON value (`response_format`), not text or tool calls.
    pub fn json(&self) -> bool {
        self.json
    }

    /// What comes next.
    pub fn step(&mut self) -> Result<Next, EngineError> {
        if self.matcher.is_stopped() {
            return Ok(Next::End);
        }
        let forced = self.matcher.compute_ff_tokens();
        if self.matcher.is_error() {
            return Err(self.failed("forced tokens", "error"));
        }
        if !forced.is_empty() {
            return Ok(Next::Forced(forced));
        }
        let mask = self
            .matcher
            .compute_mask()
            .map_err(|e| self.failed("token mask", e))?;
        // Counted on the bits: a free position allows most of the vocabulary, which listing
        // would copy at every token.
        let ends = self.ends_allowed(&mask);
        match (mask.num_set() - ends, ends) {
            (0, 0) => Err(self.failed("token mask", "no token is allowed")),
            (0, _) => Ok(Next::End),
            (1, 0) => match mask.first_bit_set() {
                Some(t) => Ok(Next::Forced(vec![t as u32])),
                None => Err(self.failed("token mask", "no token is allowed")),
            },
            _ => Ok(Next::Choose(Mask(mask))),
        }
    }

    /// The tokens that may come next other than the end, when there are at most `limit` of
    /// them (an enum's first tokens, a literal's), for a target to pick its own best among
    /// (see [`crate::targets::ContinuationRequest::allowed`]); `None` where more are allowed.
    pub fn allowed_tokens(&mut self, limit: usize) -> Option<Vec<u32>> {
        if self.matcher.is_stopped() {
            return None;
        }
        let mask = Mask(self.matcher.compute_mask().ok()?);
        self.few_of(&mask, limit)
    }

    /// The tokens `mask` (this position's, from [`Constraint::step`]) allows other than the
    /// end, when there are at most `limit` of them; as [`Constraint::allowed_tokens`] without
    /// computing the mask again.
    pub fn few_of(&self, mask: &Mask, limit: usize) -> Option<Vec<u32>> {
        if mask.0.num_set() - self.ends_allowed(&mask.0) > limit {
            return None;
        }
        let mut allowed = Vec::new();
        mask.0.iter_set_entries(|t| {
            if !self.eos.contains(&(t as u32)) {
                allowed.push(t as u32);
            }
        });
        (!allowed.is_empty()).then_some(allowed)
    }

    /// How many of the end-of-sequence ids `mask` allows.
    fn ends_allowed(&self, mask: &SimpleVob) -> usize {
        self.eos.iter().filter(|&&t| mask.is_allowed(t)).count()
    }

    /// Whether `token` may come next (an end-of-sequence id: whether the answer may end here).
    pub fn allows(&mut self, token: u32) -> bool {
        if self.eos.contains(&token) {
            return self.accepting();
        }
        matches!(self.matcher.validate_tokens(&[token]), Ok(1))
    }

    /// Whether the answer may end here.
    pub fn accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Takes `token` into the answer.
    pub fn consume(&mut self, token: u32) -> Result<(), EngineError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| self.failed("token", e))
    }
}

#[cfg(test)]
mod tests;
