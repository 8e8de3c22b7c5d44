//! Policy files: TOML -> [`raw`] structs (unknown keys rejected) -> a validated [`Policy`]
//! with typed values. Validation collects every problem before failing, so `approxy check`
//! can list them all at once.

pub mod raw;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use approxy_verifier::{BailoutBudget, TargetKind};

use raw::{RawModel, RawPolicy};

/// Everything wrong with a policy file.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {}", .problems.join("; "))]
pub struct PolicyError {
    /// The file.
    pub path: String,
    /// One entry per problem.
    pub problems: Vec<String>,
}

/// The target section, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetPolicy {
    /// Client kind.
    pub kind: TargetKind,
    /// As configured.
    pub base_url: String,
    /// Environment variable name of the API key.
    pub api_key_env: Option<String>,
    /// Per-call timeout.
    pub timeout: Duration,
    /// Retries.
    pub retries: u32,
    /// First backoff.
    pub backoff: Duration,
    /// Extra CA certificates (PEM) trusted for the target.
    pub ca_file: Option<PathBuf>,
}

impl TargetPolicy {
    /// Base URL of the target's OpenAI-compatible API (ends in `/v1`), for passthrough.
    pub fn openai_base(&self) -> String {
        let b = self.base_url.trim_end_matches('/');
        match self.kind {
            TargetKind::LlamaCpp => format!("{b}/v1"),
            TargetKind::Vllm | TargetKind::OpenAiChat => b.to_string(),
        }
    }
}

/// The gateway section, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayPolicy {
    /// Environment variable with client keys.
    pub api_keys_env: Option<String>,
    /// Body limit.
    pub max_body_bytes: usize,
    /// Concurrency limit.
    pub max_concurrent_requests: usize,
    /// Time to produce a response head.
    pub request_timeout: Duration,
    /// Largest `max_tokens`.
    pub max_tokens_limit: u32,
    /// Default `max_tokens`.
    pub default_max_tokens: u32,
}

/// The draft section, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftPolicy {
    /// Explicit model directory, if any.
    pub model_dir: Option<PathBuf>,
    /// Draft identity for learned-verifier checks.
    pub model_sha256: Option<String>,
    /// Workers.
    pub workers: usize,
    /// Threads per worker.
    pub threads_per_worker: usize,
    /// Spin-wait between runs.
    pub spin_wait: bool,
}

/// Which verifier a model uses.
#[derive(Debug, Clone, PartialEq)]
pub enum VerifierChoice {
    /// Draft top-1 probability.
    Confidence,
    /// A learned head from this artifact.
    Learned(PathBuf),
}

/// How a model is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Draft + verify + target on rejection.
    Approximate,
    /// Straight to the target.
    Passthrough,
}

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    /// Input.
    pub input: f64,
    /// Cached input.
    pub cached_input: f64,
    /// Output.
    pub output: f64,
}

/// One model's policy.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPolicy {
    /// Mode.
    pub mode: Mode,
    /// Verifier.
    pub verifier: VerifierChoice,
    /// Threshold (resolved from the quality target when one was given).
    pub threshold: f32,
    /// Correction tokens per rejection.
    pub correction_tokens: u32,
    /// Bail-out budget.
    pub bailout: Option<BailoutBudget>,
    /// Allowed per-request threshold range.
    pub threshold_override: (f32, f32),
    /// Prices.
    pub price: Price,
}

/// A validated policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Source file.
    pub path: PathBuf,
    /// Target.
    pub target: TargetPolicy,
    /// Gateway.
    pub gateway: GatewayPolicy,
    /// Draft.
    pub draft: DraftPolicy,
    /// Models by id; `"*"` is the fallback.
    pub models: BTreeMap<String, ModelPolicy>,
}

impl Policy {
    /// The policy for a model id: its own entry, else `"*"`, else none (passthrough).
    pub fn model(&self, id: &str) -> Option<&ModelPolicy> {
        self.models.get(id).or_else(|| self.models.get("*"))
    }

    /// Reads and validates a file.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let fail = |m: String| PolicyError { path: path.display().to_string(), problems: vec![m] };
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        Self::parse(&text, path)
    }

    /// Validates policy text; `path` names the file and anchors relative paths.
    pub fn parse(text: &str, path: &Path) -> Result<Self, PolicyError> {
        let raw: RawPolicy = toml::from_str(text)
            .map_err(|e| PolicyError { path: path.display().to_string(), problems: vec![e.to_string()] })?;
        let mut v = Validator { problems: Vec::new(), base: path.parent().map(Path::to_path_buf).unwrap_or_default() };
        let policy = v.policy(raw, path);
        if v.problems.is_empty() {
            Ok(policy)
        } else {
            Err(PolicyError { path: path.display().to_string(), problems: v.problems })
        }
    }
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
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

struct Validator {
    problems: Vec<String>,
    base: PathBuf,
}

impl Validator {
    fn err(&mut self, m: impl Into<String>) {
        self.problems.push(m.into());
    }

    fn duration(&mut self, field: &str, v: Option<String>, default: Duration) -> Duration {
        match v {
            None => default,
            Some(s) => parse_duration(&s).unwrap_or_else(|| {
                self.err(format!("{field}: {s:?} is not a duration like \"250ms\", \"30s\" or \"5m\""));
                default
            }),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        let expanded = p.replace(
            "${APPROXY_HOME}",
            &crate::setup::Home::from_env().map(|h| h.root.display().to_string()).unwrap_or_default(),
        );
        let pb = PathBuf::from(expanded);
        if pb.is_absolute() { pb } else { self.base.join(pb) }
    }

    fn policy(&mut self, raw: RawPolicy, path: &Path) -> Policy {
        let t = raw.target;
        let kind = match t.kind.as_str() {
            "llama_cpp" => TargetKind::LlamaCpp,
            "vllm" | "openai" => TargetKind::Vllm,
            "openai_chat" => TargetKind::OpenAiChat,
            k => {
                self.err(format!("target.kind: {k:?} is not one of \"llama_cpp\", \"vllm\", \"openai_chat\""));
                TargetKind::LlamaCpp
            }
        };
        match reqwest::Url::parse(&t.base_url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            Ok(u) => self.err(format!(
                "target.base_url: scheme {:?} cannot be served; approxy speaks http:// and https:// (TLS by rustls)",
                u.scheme()
            )),
            Err(e) => self.err(format!("target.base_url: {:?} is not a URL: {e}", t.base_url)),
        }
        if t.base_url.contains('@') {
            self.err("target.base_url: put credentials in the environment variable named by target.api_key_env, not in the URL");
        }
        let target = TargetPolicy {
            kind,
            base_url: t.base_url,
            api_key_env: t.api_key_env,
            timeout: self.duration("target.timeout", t.timeout, Duration::from_secs(120)),
            retries: t.retries.unwrap_or(2),
            backoff: self.duration("target.backoff", t.backoff, Duration::from_millis(200)),
            ca_file: t.ca_file.as_deref().map(|p| self.path(p)),
        };
        if let Some(ca) = &target.ca_file {
            if let Err(e) = approxy_verifier::target::load_ca_file(ca) {
                self.err(format!("target.ca_file: {e}"));
            }
            if !target.base_url.starts_with("https://") {
                self.err("target.ca_file: set, but target.base_url is not https://");
            }
        }
        if target.retries > 10 {
            self.err("target.retries: at most 10");
        }
        let g = raw.gateway;
        let gateway = GatewayPolicy {
            api_keys_env: g.api_keys_env,
            max_body_bytes: g.max_body_bytes.unwrap_or(4 << 20),
            max_concurrent_requests: g.max_concurrent_requests.unwrap_or(64),
            request_timeout: self.duration("gateway.request_timeout", g.request_timeout, Duration::from_secs(600)),
            max_tokens_limit: g.max_tokens_limit.unwrap_or(8192),
            default_max_tokens: g.default_max_tokens.unwrap_or(512),
        };
        if gateway.max_body_bytes < 1024 {
            self.err("gateway.max_body_bytes: at least 1024");
        }
        if gateway.max_concurrent_requests == 0 {
            self.err("gateway.max_concurrent_requests: at least 1");
        }
        if gateway.default_max_tokens == 0 || gateway.default_max_tokens > gateway.max_tokens_limit {
            self.err("gateway.default_max_tokens: must be in 1..=gateway.max_tokens_limit");
        }
        let d = raw.draft;
        let draft = DraftPolicy {
            model_dir: d.model_dir.as_deref().map(|p| self.path(p)),
            model_sha256: d.model_sha256,
            workers: d.workers.unwrap_or(1),
            threads_per_worker: d.threads_per_worker.unwrap_or(2),
            spin_wait: d.spin_wait.unwrap_or(false),
        };
        if draft.workers == 0 || draft.workers > 64 {
            self.err("draft.workers: must be in 1..=64");
        }
        if draft.threads_per_worker == 0 {
            self.err("draft.threads_per_worker: at least 1");
        }
        let models = raw.models.into_iter().map(|(id, m)| {
            let mp = self.model(&id, m);
            (id, mp)
        }).collect();
        Policy { path: path.to_path_buf(), target, gateway, draft, models }
    }

    fn model(&mut self, id: &str, m: RawModel) -> ModelPolicy {
        let f = |k: &str| format!("models.{id:?}.{k}");
        let mode = match m.mode.as_str() {
            "approximate" => Mode::Approximate,
            "passthrough" => Mode::Passthrough,
            other => {
                self.err(format!("{}: {other:?} is not one of \"approximate\", \"passthrough\"", f("mode")));
                Mode::Passthrough
            }
        };
        let verifier = match m.verifier.as_deref() {
            None | Some("confidence") => VerifierChoice::Confidence,
            Some(p) => {
                let path = self.path(p);
                if !path.is_file() {
                    self.err(format!("{}: artifact {} does not exist", f("verifier"), path.display()));
                }
                VerifierChoice::Learned(path)
            }
        };
        let threshold = match (m.threshold, m.max_false_accept_rate) {
            (Some(_), Some(_)) => {
                self.err(format!("{} and {}: give one, not both", f("threshold"), f("max_false_accept_rate")));
                0.5
            }
            (Some(t), None) => {
                if !(0.0..=1.0).contains(&t) {
                    self.err(format!("{}: {t} is outside [0, 1]", f("threshold")));
                }
                t
            }
            (None, Some(far)) => match m.calibration.as_deref() {
                None => {
                    self.err(format!("{}: needs {}", f("max_false_accept_rate"), f("calibration")));
                    0.5
                }
                Some(c) => {
                    let path = self.path(c);
                    match crate::calibration::threshold_for(&path, far) {
                        Ok(t) => t,
                        Err(e) => {
                            self.err(format!("{}: {e}", f("calibration")));
                            0.5
                        }
                    }
                }
            },
            (None, None) => {
                if mode == Mode::Approximate {
                    self.err(format!("{}: an approximate model needs threshold or max_false_accept_rate", f("threshold")));
                }
                1.0
            }
        };
        let correction_tokens = m.correction_tokens.unwrap_or(1);
        if !(1..=256).contains(&correction_tokens) {
            self.err(format!("{}: must be in 1..=256", f("correction_tokens")));
        }
        let bailout = m.bailout.map(|b| {
            if b.window == 0 || b.window > 4096 {
                self.err(format!("{}: must be in 1..=4096", f("bailout.window")));
            }
            if !(0.0..=1.0).contains(&b.max_rejection_rate) {
                self.err(format!("{}: must be in [0, 1]", f("bailout.max_rejection_rate")));
            }
            BailoutBudget { window: b.window, max_rejection_rate: b.max_rejection_rate }
        });
        let (lo, hi) = m.threshold_override.map(|[a, b]| (a, b)).unwrap_or((threshold, threshold));
        if lo > hi || !(0.0..=1.0).contains(&lo) || !(0.0..=1.0).contains(&hi) {
            self.err(format!("{}: [{lo}, {hi}] must be an ordered range inside [0, 1]", f("threshold_override")));
        }
        let price = m.price.map(|p| Price { input: p.input, cached_input: p.cached_input, output: p.output }).unwrap_or_default();
        if [price.input, price.cached_input, price.output].iter().any(|x| !x.is_finite() || *x < 0.0) {
            self.err(format!("{}: prices must be finite and >= 0", f("price")));
        }
        ModelPolicy { mode, verifier, threshold, correction_tokens, bailout, threshold_override: (lo, hi), price }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[target]
kind = "llama_cpp"
base_url = "http://127.0.0.1:8081"
timeout = "30s"

[models."*"]
mode = "approximate"
threshold = 0.7
threshold_override = [0.0, 1.0]
bailout = { window = 32, max_rejection_rate = 0.4 }
price = { input = 0.5, cached_input = 0.05, output = 1.5 }
"#;

    #[test]
    fn good_policy_validates() -> Result<(), PolicyError> {
        let p = Policy::parse(GOOD, Path::new("/x/p.toml"))?;
        assert_eq!(p.target.timeout, Duration::from_secs(30));
        assert_eq!(p.target.openai_base(), "http://127.0.0.1:8081/v1");
        let m = p.model("anything").map(|m| m.threshold);
        assert_eq!(m, Some(0.7));
        Ok(())
    }

    #[test]
    fn every_problem_is_reported() {
        let bad = r#"
[target]
kind = "grpc"
base_url = "ftp://x"
timeout = "soon"

[models.a]
mode = "fast"
threshold = 1.5
correction_tokens = 0
"#;
        let e = Policy::parse(bad, Path::new("p.toml")).err().map(|e| e.problems).unwrap_or_default();
        for needle in ["target.kind", "target.base_url", "target.timeout", "mode", "threshold", "correction_tokens"] {
            assert!(e.iter().any(|p| p.contains(needle)), "{needle} missing from {e:?}");
        }
        assert!(e.len() >= 6, "{e:?}");
    }

    #[test]
    fn target_kinds_by_name() -> Result<(), PolicyError> {
        for (name, kind, base) in [
            ("llama_cpp", TargetKind::LlamaCpp, "https://h:1/v1"),
            ("vllm", TargetKind::Vllm, "https://h:1"),
            ("openai", TargetKind::Vllm, "https://h:1"),
            ("openai_chat", TargetKind::OpenAiChat, "https://h:1"),
        ] {
            let text = GOOD.replace("kind = \"llama_cpp\"", &format!("kind = {name:?}")).replace("http://127.0.0.1:8081", "https://h:1");
            let p = Policy::parse(&text, Path::new("p.toml"))?;
            assert_eq!(p.target.kind, kind, "{name}");
            assert_eq!(p.target.openai_base(), base, "{name}");
            assert_eq!(kind.can_continue(), name != "openai_chat");
        }
        Ok(())
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = Policy::parse(&GOOD.replace("timeout = \"30s\"", "timeuot = \"30s\""), Path::new("p.toml"));
        assert!(e.is_err_and(|e| e.to_string().contains("timeuot")));
    }

    #[test]
    fn shipped_policies_validate() -> Result<(), PolicyError> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("policies");
        for name in ["default.toml", "strict.toml", "economy.toml"] {
            let p = Policy::load(&dir.join(name))?;
            let m = p.model("any-model").map(|m| (m.mode, m.threshold));
            assert!(matches!(m, Some((Mode::Approximate, t)) if (0.0..=1.0).contains(&t)), "{name}: {m:?}");
        }
        Ok(())
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("2"), None);
        assert_eq!(parse_duration("x s"), None);
    }
}
