//! Raw policy to typed [`Policy`]: every value checked, defaults filled in, relative paths
//! anchored at the policy file, and every problem collected rather than the first returned.

use std::path::{Path, PathBuf};
use std::time::Duration;

use approxy_verifier::cost::CacheRules;
use approxy_verifier::cost::{BusyRates, Price, Pricing};
use approxy_verifier::decode::JsonThresholds;
use approxy_verifier::grammar::{Fence, JsonLayout};
use approxy_verifier::targets::kind::{Abilities, kinds_that};
use approxy_verifier::targets::{CacheHints, PrefixStyle};
use approxy_verifier::verify::VerifierChoice;
use approxy_verifier::{BailoutBudget, Correction, SpanAsk, SpanClose, TargetKind, Verification};

use super::raw::{
    RawBailout, RawBusyRates, RawCache, RawCorrection, RawDraft, RawGateway, RawModel,
    RawPassthrough, RawPerKind, RawPolicy, RawPricing, RawStructuredThreshold, RawTarget,
};
use super::typed::{
    Auth, DraftPolicy, GatewayPolicy, GuardPolicy, KindThresholds, Mode, ModelPolicy,
    PassthroughPolicy, Policy, SpecialTokenText, TargetPolicy,
};

/// Whether a model overlaps drafting with target calls unless its policy says. Off: with the
/// target on the same cores the guesses take the cores the target needs (tests/README.md, "Drafting
/// while the target works", from `approxy bench calls`).
pub const DEFAULT_OVERLAP: bool = false;

/// How JSON answers are laid out unless the policy says: on lines as the model writes JSON,
/// which moved the target's own values less than one line did (tests/README.md, "Structured
/// output", from `approxy bench structured`).
pub const DEFAULT_JSON_LAYOUT: JsonLayout = JsonLayout::Indented;

/// How a model fences its JSON answers unless its policy says.
pub const DEFAULT_JSON_FENCE: Fence = Fence::Always;

/// Most tokens prompt lookup proposes at once unless the policy says (0: off).
pub const DEFAULT_PROMPT_LOOKUP: u32 = 0;

/// Streams a draft worker batches by default.
pub const DEFAULT_STREAMS_PER_WORKER: usize = 8;

/// Each stream's draft speed floor by default, tokens a second.
pub const DEFAULT_MIN_STREAM_SPEED: f64 = 10.0;

/// MiB a draft worker's batch cache may reach by default.
pub const DEFAULT_KV_MEMORY_MB: usize = 1024;

/// The most a policy may set: as many as a window's largest, a draft pass's worth.
pub const MAX_PROMPT_LOOKUP: u32 = 16;

/// What ends a span the draft has caught up with unless the policy says. The fixed rule until
/// `approxy bench calls` shows the expected one better (tests/README.md, "What the budget guard saves").
pub const DEFAULT_SPAN_CLOSE: SpanClose = SpanClose::Resync;

/// The budget guard's per-request bound unless the policy says: a request may cost up to half
/// again passthrough when its calls were expected to pay and did not.
pub const DEFAULT_HARD_COST_CAP: f64 = 1.5;

/// The window the budget guard keeps a model's traffic within `max_cost_ratio` over.
pub const DEFAULT_BUDGET_WINDOW: Duration = Duration::from_secs(3600);

/// Validates a raw policy read from `path`; the problems list is empty when it is valid.
pub(super) fn validate(raw: RawPolicy, path: &Path) -> (Policy, Vec<String>) {
    let mut v = Validator {
        problems: Vec::new(),
        base: path.parent().map(Path::to_path_buf).unwrap_or_default(),
    };
    let policy = v.policy(raw, path);
    (policy, v.problems)
}

/// Parses durations such as `250ms`, `30s`, `5m`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit() && c != '.')?);
    let n: f64 = num.parse().ok()?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}

/// The longest duration a policy may set.
const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The shortest network deadline a policy may set (a target call, a body, an idle or a write
/// wait): below it a loaded machine's scheduling alone would trip it.
pub const LEAST_DEADLINE: Duration = Duration::from_millis(100);

/// The shortest `gateway.request_timeout`: a whole answer's head, a tokenization and a first
/// target call at least.
pub const LEAST_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// A model's field's full name, `models."<id>".<key>`, for its problems.
type Field<'a> = &'a dyn Fn(&str) -> String;

struct Validator {
    problems: Vec<String>,
    base: PathBuf,
}

impl Validator {
    fn err(&mut self, m: impl Into<String>) {
        self.problems.push(m.into());
    }

    /// A deadline or timeout: at least `least` (a zero one refuses every body or drops every
    /// stream at once; a 1 ms `request_timeout` made every request a 504 `target_timeout`, an
    /// operator's mistake read as a target outage) and at most [`MAX_DURATION`] (past that an
    /// instant plus it overflows).
    fn duration(
        &mut self,
        field: &str,
        v: Option<String>,
        default: Duration,
        least: Duration,
    ) -> Duration {
        let d = self.duration_or_zero(field, v, default);
        if d < least {
            self.err(format!("{field}: must be at least {least:?}"));
            return default;
        }
        d
    }

    /// As [`Self::duration`], where zero means "at once" (a retry's backoff).
    fn duration_or_zero(&mut self, field: &str, v: Option<String>, default: Duration) -> Duration {
        let Some(s) = v else { return default };
        match parse_duration(&s) {
            Some(d) if d <= MAX_DURATION => d,
            Some(_) => {
                self.err(format!("{field}: {s:?} is longer than 7 days"));
                default
            }
            None => {
                self.err(format!(
                    "{field}: {s:?} is not a duration like \"250ms\", \"30s\" or \"5m\""
                ));
                default
            }
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        let expanded = p.replace(
            "${APPROXY_HOME}",
            &approxy_verifier::home::Home::from_env()
                .map(|h| h.root.display().to_string())
                .unwrap_or_default(),
        );
        let pb = PathBuf::from(expanded);
        if pb.is_absolute() {
            pb
        } else {
            self.base.join(pb)
        }
    }

    fn policy(&mut self, raw: RawPolicy, path: &Path) -> Policy {
        let target = self.target(raw.target);
        let gateway = self.gateway(raw.gateway);
        let draft = self.draft(raw.draft);
        let models = raw
            .models
            .into_iter()
            .map(|(id, m)| {
                let mp = self.model(&id, m, target.kind, target.busy_prior);
                (id, mp)
            })
            .collect();
        let passthrough = self.passthrough(raw.passthrough);
        Policy {
            path: path.to_path_buf(),
            target,
            gateway,
            draft,
            passthrough,
            models,
        }
    }

    /// The `target` table: its kind first, since what else it may set depends on the kind.
    fn target(&mut self, t: RawTarget) -> TargetPolicy {
        let kind = TargetKind::parse(&t.kind).unwrap_or_else(|e| {
            self.err(format!("target.kind: {e}"));
            TargetKind::LlamaCpp
        });
        let can = kind.abilities();
        let prefix_style = self.prefix_style(t.prefix_style.as_deref(), can);
        let chat_template = self.chat_template(t.chat_template.as_deref(), can);
        let (cache_hints, cache_rules) = self.cache(t.cache.unwrap_or_default(), can);
        self.base_url(&t.base_url);
        let target = TargetPolicy {
            kind,
            base_url: t.base_url,
            api_key_env: t.api_key_env,
            timeout: self.duration(
                "target.timeout",
                t.timeout,
                Duration::from_secs(120),
                LEAST_DEADLINE,
            ),
            retries: t.retries.unwrap_or(2),
            backoff: self.duration_or_zero("target.backoff", t.backoff, Duration::from_millis(200)),
            ca_file: t.ca_file.as_deref().map(|p| self.path(p)),
            model: t.model,
            chat_template,
            prefix_style,
            cache_hints,
            use_env_proxy: t.use_env_proxy.unwrap_or(false),
            cache_rules,
            context_length: t.context_length,
            busy_prior: self.busy_prior(t.busy_prior),
        };
        if target.context_length == Some(0) {
            self.err("target.context_length: at least 1");
        }
        if let Some(ca) = &target.ca_file {
            if let Err(e) = approxy_verifier::targets::load_ca_file(ca) {
                self.err(format!("target.ca_file: {e}"));
            }
            if !target.base_url.starts_with("https://") {
                self.err("target.ca_file: set, but target.base_url is not https://");
            }
        }
        if target.retries > 10 {
            self.err("target.retries: at most 10");
        }
        target
    }

    fn busy_prior(&mut self, raw: Option<RawBusyRates>) -> BusyRates {
        let d = BusyRates::default();
        let Some(r) = raw else { return d };
        let rates = BusyRates {
            prefill_ms: r.prefill_ms.unwrap_or(d.prefill_ms),
            generate_ms: r.generate_ms.unwrap_or(d.generate_ms),
            call_ms: r.call_ms.unwrap_or(d.call_ms),
        };
        if !rates.valid() {
            self.err("target.busy_prior: every rate finite and >= 0, and generate_ms above 0");
            return d;
        }
        rates
    }

    fn prefix_style(&mut self, name: Option<&str>, can: Abilities) -> PrefixStyle {
        match name {
            None => PrefixStyle::default(),
            Some(_) if !can.chat_prefix => {
                self.err(format!(
                    "target.prefix_style: only a {} target has one",
                    kinds_that(|a| a.chat_prefix)
                ));
                PrefixStyle::default()
            }
            Some(name) => PrefixStyle::parse(name).unwrap_or_else(|e| {
                self.err(format!("target.prefix_style: {e}"));
                PrefixStyle::default()
            }),
        }
    }

    fn chat_template(&mut self, path: Option<&str>, can: Abilities) -> Option<PathBuf> {
        match path {
            None => None,
            Some(_) if !can.chat_template => {
                self.err(format!(
                    "target.chat_template: only an {} target is sent a rendered prompt",
                    kinds_that(|a| a.chat_template)
                ));
                None
            }
            Some(p) => {
                let path = self.path(p);
                if let Err(e) = approxy_verifier::template::ChatTemplate::from_file(&path) {
                    self.err(format!("target.chat_template: {e}"));
                }
                Some(path)
            }
        }
    }

    fn cache(&mut self, cache: RawCache, can: Abilities) -> (CacheHints, CacheRules) {
        // Per kind, as its abilities say: the text-level kinds talk to hosted APIs, whose caches
        // key on `prompt_cache_key`; each kind's cache serves prefixes in its own blocks.
        let cache_hints = CacheHints {
            key: cache.key.unwrap_or(can.text_level),
            affinity_header: cache.affinity_header,
            slots: cache.slots.unwrap_or(false),
            warm: cache.warm.unwrap_or(false),
        };
        if cache_hints.slots && !can.names_slots {
            self.err("target.cache.slots: llama_cpp targets only (llama-server's `id_slot`)");
        }
        if cache_hints.warm && !cache_hints.slots {
            // The warmed cache must be the one the answer's calls read: a slot it names.
            self.err("target.cache.warm: needs target.cache.slots = true");
        }
        let cache_rules = CacheRules {
            min_tokens: cache.min_tokens.unwrap_or(0),
            block: cache.block.unwrap_or(can.cache_block),
        };
        if cache_rules.block == 0 {
            self.err("target.cache.block: at least 1");
        }
        if let Some(h) = &cache_hints.affinity_header
            && reqwest::header::HeaderName::from_bytes(h.as_bytes()).is_err()
        {
            self.err(format!(
                "target.cache.affinity_header: {h:?} is not a header name"
            ));
        }
        (cache_hints, cache_rules)
    }

    fn base_url(&mut self, base_url: &str) {
        match reqwest::Url::parse(base_url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            Ok(u) => self.err(format!(
                "target.base_url: scheme {:?} cannot be served; approxy speaks http:// and https:// (TLS by rustls)",
                u.scheme()
            )),
            Err(e) => self.err(format!("target.base_url: {base_url:?} is not a URL: {e}")),
        }
        if base_url.contains('@') {
            self.err("target.base_url: put credentials in the environment variable named by target.api_key_env, not in the URL");
        }
    }

    /// The `gateway` table: who may call, and the bounds every request and connection keeps.
    fn gateway(&mut self, g: RawGateway) -> GatewayPolicy {
        let auth = self.auth(g.auth.as_deref(), g.api_keys_env.as_deref());
        let gateway = GatewayPolicy {
            auth,
            api_keys_env: g.api_keys_env,
            max_body_bytes: g.max_body_bytes.unwrap_or(4 << 20),
            max_concurrent_requests: g.max_concurrent_requests.unwrap_or(64),
            request_timeout: self.duration(
                "gateway.request_timeout",
                g.request_timeout,
                Duration::from_secs(600),
                LEAST_REQUEST_TIMEOUT,
            ),
            header_timeout: self.duration(
                "gateway.header_timeout",
                g.header_timeout,
                Duration::from_secs(10),
                LEAST_DEADLINE,
            ),
            body_timeout: self.duration(
                "gateway.body_timeout",
                g.body_timeout,
                Duration::from_secs(30),
                LEAST_DEADLINE,
            ),
            body_idle_timeout: self.duration(
                "gateway.body_idle_timeout",
                g.body_idle_timeout,
                Duration::from_secs(10),
                LEAST_DEADLINE,
            ),
            max_n: g.max_n.unwrap_or(16),
            max_response_bytes: g.max_response_bytes.unwrap_or(32 << 20),
            max_connections: g.max_connections.unwrap_or(1024),
            idle_timeout: self.duration(
                "gateway.idle_timeout",
                g.idle_timeout,
                Duration::from_secs(60),
                LEAST_DEADLINE,
            ),
            max_connections_per_ip: g.max_connections_per_ip.unwrap_or(256),
            write_idle_timeout: self.duration(
                "gateway.write_idle_timeout",
                g.write_idle_timeout,
                Duration::from_secs(60),
                LEAST_DEADLINE,
            ),
            max_tokens_limit: g.max_tokens_limit.unwrap_or(8192),
            default_max_tokens: g.default_max_tokens.unwrap_or(512),
        };
        self.gateway_bounds(&gateway);
        gateway
    }

    fn auth(&mut self, auth: Option<&str>, api_keys_env: Option<&str>) -> Auth {
        // Fail closed: running without keys is a choice the policy states.
        match (auth, api_keys_env) {
            (None | Some("keys"), Some(_)) => Auth::Keys,
            (None | Some("keys"), None) => {
                self.err("gateway.api_keys_env: needed for client keys; to run without them, say gateway.auth = \"none\"");
                Auth::Keys
            }
            (Some("none"), None) => Auth::None,
            (Some("none"), Some(_)) => {
                self.err("gateway.auth = \"none\" and gateway.api_keys_env: give one, not both");
                Auth::None
            }
            (Some(other), _) => {
                self.err(format!(
                    "gateway.auth: {other:?} is not one of \"keys\", \"none\""
                ));
                Auth::Keys
            }
        }
    }

    fn gateway_bounds(&mut self, gateway: &GatewayPolicy) {
        if gateway.max_n == 0 {
            self.err("gateway.max_n: at least 1");
        }
        if gateway.max_response_bytes < 1024 {
            self.err("gateway.max_response_bytes: at least 1024");
        }
        if gateway.max_body_bytes < 1024 {
            self.err("gateway.max_body_bytes: at least 1024");
        }
        if gateway.max_connections == 0 || u32::try_from(gateway.max_connections).is_err() {
            self.err("gateway.max_connections: at least 1, at most 4294967295");
        }
        if gateway.max_concurrent_requests == 0 {
            self.err("gateway.max_concurrent_requests: at least 1");
        }
        if gateway.default_max_tokens == 0 || gateway.default_max_tokens > gateway.max_tokens_limit
        {
            self.err("gateway.default_max_tokens: must be in 1..=gateway.max_tokens_limit");
        }
    }

    fn draft(&mut self, d: RawDraft) -> DraftPolicy {
        let draft = DraftPolicy {
            model_dir: d.model_dir.as_deref().map(|p| self.path(p)),
            model_sha256: d.model_sha256,
            workers: d.workers.unwrap_or(1),
            threads_per_worker: d.threads_per_worker.unwrap_or(2),
            spin_wait: d.spin_wait.unwrap_or(false),
            streams_per_worker: d.streams_per_worker.unwrap_or(DEFAULT_STREAMS_PER_WORKER),
            min_stream_speed: d.min_stream_speed.unwrap_or(DEFAULT_MIN_STREAM_SPEED),
            kv_memory_mb: d.kv_memory_mb.unwrap_or(DEFAULT_KV_MEMORY_MB),
        };
        if draft.streams_per_worker == 0 || draft.streams_per_worker > 64 {
            self.err("draft.streams_per_worker: must be in 1..=64");
        }
        if !(draft.min_stream_speed.is_finite()
            && (0.0..=10_000.0).contains(&draft.min_stream_speed))
        {
            self.err("draft.min_stream_speed: must be in 0..=10000 tokens a second");
        }
        if draft.kv_memory_mb == 0 {
            self.err("draft.kv_memory_mb: at least 1");
        }
        if draft.workers == 0 || draft.workers > 64 {
            self.err("draft.workers: must be in 1..=64");
        }
        if draft.threads_per_worker == 0 {
            self.err("draft.threads_per_worker: at least 1");
        }
        draft
    }

    fn passthrough(&mut self, p: Option<RawPassthrough>) -> PassthroughPolicy {
        let (extra_routes, special) = p
            .map(|p| (p.extra_routes, p.special_token_text))
            .unwrap_or_default();
        let special_token_text = match special.as_deref() {
            None | Some("refuse") => SpecialTokenText::Refuse,
            Some("forward") => SpecialTokenText::Forward,
            Some(other) => {
                self.err(format!(
                    "passthrough.special_token_text: {other:?} is not one of \"refuse\", \"forward\""
                ));
                SpecialTokenText::Refuse
            }
        };
        for route in &extra_routes {
            let ok = route.split_once(' ').is_some_and(|(m, p)| {
                matches!(m, "GET" | "POST" | "PUT" | "PATCH" | "DELETE")
                    && p.starts_with("/v1/")
                    && !crate::route::has_dot_segments(p)
            });
            if !ok {
                self.err(format!("passthrough.extra_routes: {route:?} is not \"METHOD /v1/path\" (a path ending in /* covers what is below it)"));
            }
        }
        PassthroughPolicy {
            extra_routes,
            special_token_text,
        }
    }

    /// One `models.<id>` table. Its sections are read in the order its problems are reported;
    /// the dial is read before the override range, whose default is the dial's own values.
    fn model(&mut self, id: &str, m: RawModel, kind: TargetKind, busy: BusyRates) -> ModelPolicy {
        let f = |k: &str| format!("models.{id:?}.{k}");
        let mode = self.mode(&f, &m.mode);
        let verifier = self.verifier(&f, m.verifier.as_deref());
        let threshold = self.threshold(&f, &m, mode, &verifier);
        // A span asks for only the tokens it could use where a close would cost more than a
        // call: a target that writes on after a close, paid for in its own time (a price
        // list bills every call's re-sent prefix).
        let fewest =
            kind.abilities().writes_after_close && !matches!(m.price, Some(RawPricing::List(_)));
        let correction = self.model_correction(&f, &m, fewest);
        let verification = self.verification(&f, m.verification.as_deref(), kind);
        let (max_cost_ratio, guard) = self.guard(&f, &m);
        let bailout = self.bailout(&f, m.bailout.as_ref());
        let threshold_override = self.threshold_override(&f, m.threshold_override, threshold);
        let price = self.price(&f, m.price.as_ref(), busy);
        let fallback_to_passthrough = self.fallback(&f, m.fallback.as_deref());
        if m.max_target_calls == Some(0) {
            self.err(format!("{}: at least 1", f("max_target_calls")));
        }
        ModelPolicy {
            mode,
            verifier,
            threshold,
            verification,
            correction,
            max_cost_ratio,
            guard,
            bailout,
            threshold_override,
            price,
            fallback_to_passthrough,
            max_target_calls: m.max_target_calls,
            overlap: m.overlap.unwrap_or(DEFAULT_OVERLAP),
            prompt_lookup: self.prompt_lookup(&f, m.prompt_lookup),
            window_max: self.window_max(&f, m.window_max, kind),
            structured_threshold: self.structured_threshold(&f, m.structured_threshold),
            json_layout: self.named(
                f("json_layout"),
                m.json_layout.as_deref(),
                JsonLayout::parse,
                "a layout (indented or compact)",
                DEFAULT_JSON_LAYOUT,
            ),
            json_fence: self.named(
                f("json_fence"),
                m.json_fence.as_deref(),
                Fence::parse,
                "a fence (always, optional or never)",
                DEFAULT_JSON_FENCE,
            ),
        }
    }

    /// The value a policy's name stands for (`parse`), `default` where none is given; a name
    /// that stands for none is an error naming the `key` and what it must be (`expected`).
    fn named<T>(
        &mut self,
        key: String,
        name: Option<&str>,
        parse: fn(&str) -> Option<T>,
        expected: &str,
        default: T,
    ) -> T {
        let Some(name) = name else {
            return default;
        };
        parse(name).unwrap_or_else(|| {
            self.err(format!("{key}: {name:?} is not {expected}"));
            default
        })
    }

    fn structured_threshold(
        &mut self,
        f: Field,
        t: Option<RawStructuredThreshold>,
    ) -> Option<JsonThresholds> {
        let t = t?;
        for (name, x) in [("value", t.value), ("text", t.text)] {
            if !(0.0..=1.0).contains(&x) {
                self.err(format!(
                    "{}.{name}: {x} is outside [0, 1]",
                    f("structured_threshold")
                ));
            }
        }
        Some(JsonThresholds {
            value: t.value.clamp(0.0, 1.0),
            text: t.text.clamp(0.0, 1.0),
        })
    }

    fn window_max(&mut self, f: Field, n: Option<u32>, kind: TargetKind) -> u32 {
        use approxy_verifier::decode::{WINDOW_MAX, WINDOW_MAX_LIMIT, WINDOW_MIN};
        let Some(n) = n else {
            return WINDOW_MAX;
        };
        if !kind.abilities().scores_windows {
            self.err(format!(
                "{}: windows need a target that returns prompt log-probabilities (target.kind = \"{}\")",
                f("window_max"),
                kinds_that(|a| a.scores_windows)
            ));
        } else if !(WINDOW_MIN..=WINDOW_MAX_LIMIT).contains(&n) {
            self.err(format!(
                "{}: {n} is outside {WINDOW_MIN} to {WINDOW_MAX_LIMIT}",
                f("window_max")
            ));
        }
        n.clamp(WINDOW_MIN, WINDOW_MAX_LIMIT)
    }

    fn prompt_lookup(&mut self, f: Field, n: Option<u32>) -> usize {
        let n = n.unwrap_or(DEFAULT_PROMPT_LOOKUP);
        if n > MAX_PROMPT_LOOKUP {
            self.err(format!(
                "{}: at most {MAX_PROMPT_LOOKUP}",
                f("prompt_lookup")
            ));
        }
        n.min(MAX_PROMPT_LOOKUP) as usize
    }

    fn mode(&mut self, f: Field, mode: &str) -> Mode {
        match mode {
            "approximate" => Mode::Approximate,
            "passthrough" => Mode::Passthrough,
            other => {
                self.err(format!(
                    "{}: {other:?} is not one of \"approximate\", \"passthrough\"",
                    f("mode")
                ));
                Mode::Passthrough
            }
        }
    }

    fn verifier(&mut self, f: Field, verifier: Option<&str>) -> VerifierChoice {
        let choice = VerifierChoice::parse(verifier, |p| self.path(p));
        if let Err(e) = choice.check() {
            self.err(format!("{}: {e}", f("verifier")));
        }
        choice
    }

    /// The dial: given outright, or read off the calibration at a false-accept budget.
    fn threshold(
        &mut self,
        f: Field,
        m: &RawModel,
        mode: Mode,
        verifier: &VerifierChoice,
    ) -> KindThresholds {
        match (m.threshold, m.max_false_accept_rate) {
            (Some(_), Some(_)) => {
                self.err(format!(
                    "{} and {}: give one, not both",
                    f("threshold"),
                    f("max_false_accept_rate")
                ));
                KindThresholds::all(0.5)
            }
            (Some(t), None) => {
                let t = per_kind(t);
                for (kind, v) in [("code", t.code), ("chat", t.chat)] {
                    if !(0.0..=1.0).contains(&v) {
                        let at = match m.threshold {
                            Some(RawPerKind::ByKind(_)) => format!("{}.{kind}", f("threshold")),
                            _ => f("threshold"),
                        };
                        self.err(format!("{at}: {v} is outside [0, 1]"));
                        break;
                    }
                }
                t
            }
            (None, Some(far)) => match m.calibration.as_deref() {
                None => {
                    self.err(format!(
                        "{}: needs {}",
                        f("max_false_accept_rate"),
                        f("calibration")
                    ));
                    KindThresholds::all(0.5)
                }
                Some(c) => self.calibrated(f, c, far, verifier),
            },
            (None, None) => {
                if mode == Mode::Approximate {
                    self.err(format!(
                        "{}: an approximate model needs threshold or max_false_accept_rate",
                        f("threshold")
                    ));
                }
                KindThresholds::all(1.0)
            }
        }
    }

    /// The dial that keeps false accepts within `far` on the calibration file `c`.
    fn calibrated(
        &mut self,
        f: Field,
        c: &str,
        far: RawPerKind,
        verifier: &VerifierChoice,
    ) -> KindThresholds {
        use approxy_verifier::calibration::{threshold_for, threshold_for_kind};
        let path = self.path(c);
        // The budget is read on the curve of the verifier this policy runs, which
        // need not be the one the file chose.
        let (curve, unfit) = verifier.curve(&path);
        if let Some(e) = unfit {
            self.err(format!("{}: {e}", f("calibration")));
        }
        // One budget reads the curve of all prompts; a table reads each kind's own.
        let resolved = match far {
            RawPerKind::All(x) => threshold_for(&path, x, curve).map(KindThresholds::all),
            RawPerKind::ByKind(k) => {
                threshold_for_kind(&path, "code", k.code, curve).and_then(|code| {
                    threshold_for_kind(&path, "chat", k.chat, curve)
                        .map(|chat| KindThresholds { code, chat })
                })
            }
        };
        match resolved {
            Ok(t) => t,
            Err(e) => {
                self.err(format!("{}: {e}", f("calibration")));
                KindThresholds::all(0.5)
            }
        }
    }

    fn model_correction(&mut self, f: Field, m: &RawModel, fewest: bool) -> Correction {
        match (m.correction_tokens, &m.correction) {
            (Some(_), Some(_)) => {
                self.err(format!(
                    "{} and {}: give one, not both",
                    f("correction_tokens"),
                    f("correction")
                ));
                Correction::Fixed { tokens: 1 }
            }
            (Some(tokens), None) => self.fixed(&f("correction_tokens"), tokens),
            (None, Some(c)) => self.correction(&f("correction"), c, fewest),
            (None, None) => Correction::Fixed { tokens: 1 },
        }
    }

    fn verification(&mut self, f: Field, v: Option<&str>, kind: TargetKind) -> Verification {
        // Windows need prompt log-probabilities, which not every kind gives.
        let windows = kind.abilities().scores_windows;
        let relaxed = v.and_then(|v| v.strip_prefix("relaxed:"));
        match (v, windows) {
            (None | Some("approximate"), true) => Verification::ApproximateWindows,
            (None | Some("approximate"), false) => Verification::Approximate,
            (Some("exact"), true) => Verification::Exact,
            (Some("judged"), true) => Verification::Judged,
            (Some(v), false) if v == "exact" || v == "judged" || relaxed.is_some() => {
                self.err(format!("{}: {v:?} needs a target that returns prompt log-probabilities (target.kind = \"{}\")", f("verification"), kinds_that(|a| a.scores_windows)));
                Verification::Approximate
            }
            (Some(_), true) if relaxed.is_some() => {
                match approxy_verifier::verify::AcceptanceRule::parse(relaxed.unwrap_or_default()) {
                    Ok(rule) => Verification::Relaxed(rule),
                    Err(e) => {
                        self.err(format!("{}: {e}", f("verification")));
                        Verification::Exact
                    }
                }
            }
            (Some(other), _) => {
                self.err(format!(
                    "{}: {other:?} is not one of \"approximate\", \"exact\", \"relaxed:RULE\", \"judged\"",
                    f("verification")
                ));
                Verification::Approximate
            }
        }
    }

    /// The cost bound and the guard that keeps it: `(max_cost_ratio, guard)`.
    fn guard(&mut self, f: Field, m: &RawModel) -> (f64, GuardPolicy) {
        let max_cost_ratio = m.max_cost_ratio.unwrap_or(1.0);
        if !max_cost_ratio.is_finite() || max_cost_ratio <= 0.0 {
            self.err(format!(
                "{}: must be a number above 0 (1.0: never dearer than passthrough)",
                f("max_cost_ratio")
            ));
        }
        let hard_cap = m
            .hard_cost_cap
            .unwrap_or(DEFAULT_HARD_COST_CAP.max(max_cost_ratio));
        if !hard_cap.is_finite() || hard_cap < max_cost_ratio {
            self.err(format!(
                "{}: must be a number at or above max_cost_ratio ({max_cost_ratio})",
                f("hard_cost_cap")
            ));
        }
        // Its own lower bound (1 s) below says more than "more than zero".
        let window = self.duration_or_zero(
            &f("budget_window"),
            m.budget_window.clone(),
            DEFAULT_BUDGET_WINDOW,
        );
        if window < Duration::from_secs(1) {
            self.err(format!("{}: at least 1s", f("budget_window")));
        }
        let guard = match m.guard.as_deref() {
            None | Some("budget") => GuardPolicy::Budget { hard_cap, window },
            Some("strict") => GuardPolicy::Strict,
            Some("off") => GuardPolicy::Off,
            Some(other) => {
                self.err(format!(
                    "{}: {other:?} is not one of \"budget\", \"strict\", \"off\"",
                    f("guard")
                ));
                GuardPolicy::Off
            }
        };
        if m.guard.as_deref().is_some_and(|g| g != "budget")
            && (m.hard_cost_cap.is_some() || m.budget_window.is_some())
        {
            self.err(format!(
                "{}: hard_cost_cap and budget_window belong to guard = \"budget\"",
                f("guard")
            ));
        }
        (max_cost_ratio, guard)
    }

    fn bailout(&mut self, f: Field, b: Option<&RawBailout>) -> Option<BailoutBudget> {
        b.map(|b| {
            if b.window == 0 || b.window > 4096 {
                self.err(format!("{}: must be in 1..=4096", f("bailout.window")));
            }
            if !(0.0..=1.0).contains(&b.max_rejection_rate) {
                self.err(format!(
                    "{}: must be in [0, 1]",
                    f("bailout.max_rejection_rate")
                ));
            }
            BailoutBudget {
                window: b.window,
                max_rejection_rate: b.max_rejection_rate,
            }
        })
    }

    fn threshold_override(
        &mut self,
        f: Field,
        range: Option<[f32; 2]>,
        threshold: KindThresholds,
    ) -> (f32, f32) {
        let (lo, hi) = range
            .map(|[a, b]| (a, b))
            // Without an override range, only the policy's own values may be asked for.
            .unwrap_or((
                threshold.code.min(threshold.chat),
                threshold.code.max(threshold.chat),
            ));
        if lo > hi || !(0.0..=1.0).contains(&lo) || !(0.0..=1.0).contains(&hi) {
            self.err(format!(
                "{}: [{lo}, {hi}] must be an ordered range inside [0, 1]",
                f("threshold_override")
            ));
        }
        (lo, hi)
    }

    fn price(&mut self, f: Field, price: Option<&RawPricing>, busy: BusyRates) -> Pricing {
        let price = match price {
            None => Price::default(),
            Some(RawPricing::Class(c)) if c == "busy" => return Pricing::Busy(busy),
            Some(RawPricing::Class(c)) => {
                self.err(format!(
                    "{}: {c:?} is not a price class: say \"busy\" (the target's time) or give a list {{ input, cached_input, output }}",
                    f("price")
                ));
                return Pricing::default();
            }
            Some(RawPricing::List(p)) => Price {
                input: p.input,
                cached_input: p.cached_input,
                output: p.output,
            },
        };
        if [price.input, price.cached_input, price.output]
            .iter()
            .any(|x| !x.is_finite() || *x < 0.0)
        {
            self.err(format!("{}: prices must be finite and >= 0", f("price")));
        }
        Pricing::Tokens(price)
    }

    /// Whether a model falls back to passthrough when approximating fails, or answers an error.
    fn fallback(&mut self, f: Field, fallback: Option<&str>) -> bool {
        match fallback {
            None | Some("passthrough") => true,
            Some("error") => false,
            Some(other) => {
                self.err(format!(
                    "{}: {other:?} is not one of \"passthrough\", \"error\"",
                    f("fallback")
                ));
                true
            }
        }
    }

    fn fixed(&mut self, field: &str, tokens: u32) -> Correction {
        if !(1..=256).contains(&tokens) {
            self.err(format!("{field}: tokens must be in 1..=256"));
        }
        Correction::Fixed { tokens }
    }

    /// `fewest`: what a span's calls ask for by default (see [`SpanAsk`]).
    fn correction(&mut self, field: &str, c: &RawCorrection, fewest: bool) -> Correction {
        match c.mode.as_str() {
            "fixed" => {
                if c.max_span.is_some() || c.resync.is_some() || c.end.is_some() || c.ask.is_some()
                {
                    self.err(format!(
                        "{field}: max_span, resync, end and ask belong to mode = \"span\""
                    ));
                }
                self.fixed(field, c.tokens.unwrap_or(1))
            }
            "span" => {
                if c.tokens.is_some() {
                    self.err(format!("{field}: tokens belongs to mode = \"fixed\""));
                }
                let (max_span, resync) = (c.max_span.unwrap_or(32), c.resync.unwrap_or(3));
                if !(1..=1024).contains(&max_span) {
                    self.err(format!("{field}: max_span must be in 1..=1024"));
                }
                if !(1..=64).contains(&resync) {
                    self.err(format!("{field}: resync must be in 1..=64"));
                }
                let end = match c.end.as_deref() {
                    None => DEFAULT_SPAN_CLOSE,
                    Some("expected") => SpanClose::Expected,
                    Some("resync") => SpanClose::Resync,
                    Some(other) => {
                        self.err(format!(
                            "{field}: end {other:?} is not one of \"expected\", \"resync\""
                        ));
                        DEFAULT_SPAN_CLOSE
                    }
                };
                let ask = match c.ask.as_deref() {
                    None if fewest => SpanAsk::Fewest,
                    None => SpanAsk::All,
                    Some("fewest") => SpanAsk::Fewest,
                    Some("all") => SpanAsk::All,
                    Some(other) => {
                        self.err(format!(
                            "{field}: ask {other:?} is not one of \"fewest\", \"all\""
                        ));
                        SpanAsk::All
                    }
                };
                Correction::Span {
                    max_span,
                    resync,
                    end,
                    ask,
                }
            }
            other => {
                self.err(format!(
                    "{field}: mode {other:?} is not one of \"fixed\", \"span\""
                ));
                Correction::Fixed { tokens: 1 }
            }
        }
    }
}

/// A raw per-kind value, one number standing for both kinds.
fn per_kind(v: RawPerKind) -> KindThresholds {
    match v {
        RawPerKind::All(x) => KindThresholds::all(x),
        RawPerKind::ByKind(k) => KindThresholds {
            code: k.code,
            chat: k.chat,
        },
    }
}
