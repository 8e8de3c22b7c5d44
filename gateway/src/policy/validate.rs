//! Raw policy to typed [`Policy`]: every value checked, defaults filled in, relative paths
//! anchored at the policy file, and every problem collected rather than the first returned.

use std::path::{Path, PathBuf};
use std::time::Duration;

use approxy_verifier::policy::{Fence, JsonLayout, SpanClose};

use super::raw::{RawPerKind, RawPolicy};
use super::typed::{KindThresholds, Policy};

mod gateway;
mod model;
mod target;

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
            &approxy_verifier::infer::Home::from_env()
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
