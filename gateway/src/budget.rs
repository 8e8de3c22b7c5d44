//! The budget guard's side in the gateway: one ledger per policy entry, prompt kind and output
//! (structured or free text), kept across policy reloads, read when a request starts (the model's rates and whether its
//! traffic is within budget) and written when it ends; and its gauges on `/metrics`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use approxy_verifier::infer::{BudgetGuard, CostEstimate, CostGuard, Ledger, Rates, Stats, Unit};
use approxy_verifier::policy::{CacheRules, Pricing, Tariff};
use approxy_verifier::request::Guard;

use crate::policy::PromptKind;
use crate::policy::{GuardPolicy, ModelPolicy};

/// How many tokens of traffic the prior weighs as against a ledger's own record: once a
/// model has answered a few answers' worth, its own rates decide.
const PRIOR_TOKENS: f64 = 512.0;

/// Requests a ledger holds before its cost ratio can put a model over budget.
const MIN_REQUESTS: u64 = 8;

/// The rates a model starts from, before its traffic says otherwise: what spans at the shipped
/// threshold without a guard made on code and on chat under `approxy bench calls`, so that a
/// fresh model is judged as such traffic was, not as free or as hopeless (see
/// policies/README.md, "Guard modes").
pub fn prior(kind: PromptKind) -> Rates {
    match kind {
        PromptKind::Code => Rates {
            calls_per_token: 0.055,
            target_share: 0.33,
            mean_completion: None,
        },
        PromptKind::Chat => Rates {
            calls_per_token: 0.058,
            target_share: 0.87,
            mean_completion: None,
        },
    }
}

/// Where a request's spend is recorded.
#[derive(Clone)]
pub struct Account {
    ledger: Arc<Ledger>,
    model: String,
    kind: PromptKind,
    output: Output,
    unit: Unit,
}

/// What kind of answer a ledger keeps: structured answers (a grammar forces many of their
/// tokens, so they cost the target far less than free text) and free text each have their own,
/// so that cheap structured traffic cannot let costly free text go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Output {
    /// Free text.
    Text,
    /// Under a grammar (JSON mode, a schema, tools).
    Structured,
}

impl Output {
    /// The answer's output kind: structured when it is drafted under a grammar.
    pub fn of(structured: bool) -> Self {
        if structured {
            Output::Structured
        } else {
            Output::Text
        }
    }

    /// Its name on `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            Output::Text => "text",
            Output::Structured => "structured",
        }
    }
}

/// The ledgers, by policy entry, prompt kind and output.
#[derive(Default)]
pub struct Ledgers {
    by_key: Mutex<HashMap<(String, PromptKind, Output), Arc<Ledger>>>,
}

impl Ledgers {
    /// The ledger of policy entry `model` (an id or `"*"`) for prompts of `kind` answered as
    /// `output`, kept over `window` (a reload that changes the window starts it afresh).
    pub(crate) fn ledger(
        &self,
        model: &str,
        kind: PromptKind,
        output: Output,
        window: std::time::Duration,
    ) -> Arc<Ledger> {
        let mut map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map
            .entry((model.to_string(), kind, output))
            .or_insert_with(|| Arc::new(Ledger::new(window)));
        if entry.window() != Ledger::kept(window) {
            *entry = Arc::new(Ledger::new(window));
        }
        Arc::clone(entry)
    }

    /// The engine's guard for a request of `kind` answered as `output` under `mp` (policy
    /// entry `model`), its target's work priced at `price` (the model's class at the rates of
    /// now), and the account its spend goes to (budget guard only).
    pub fn guard(
        &self,
        mp: &ModelPolicy,
        price: Pricing,
        model: &str,
        (kind, output): (PromptKind, Output),
        cache: CacheRules,
    ) -> (Option<Guard>, Option<Account>) {
        match mp.guard {
            GuardPolicy::Off => (None, None),
            GuardPolicy::Strict => (
                Some(Guard::Strict(CostGuard {
                    price,
                    max_cost_ratio: mp.max_cost_ratio,
                    cache,
                })),
                None,
            ),
            GuardPolicy::Budget { hard_cap, window } => {
                let ledger = self.ledger(model, kind, output, window);
                let view = ledger.view();
                let guard = BudgetGuard {
                    price,
                    cache,
                    hard_cap,
                    max_cost_ratio: mp.max_cost_ratio,
                    prior: view.rates(prior(kind), PRIOR_TOKENS),
                    // A few requests are no traffic: one answer handed off with its tokens in
                    // flight would otherwise put the model over budget on its own.
                    traffic_ratio: view.cost_ratio().filter(|_| view.requests >= MIN_REQUESTS),
                };
                let account = Account {
                    ledger,
                    model: model.to_string(),
                    kind,
                    output,
                    unit: price.unit(),
                };
                (Some(Guard::Budget(guard)), Some(account))
            }
        }
    }
}

impl Account {
    /// Records a finished request's spend, `cost` at its model's prices, and updates the
    /// ledger's gauges.
    pub fn record(&self, s: &Stats, cost: CostEstimate) {
        let mut part = s.approximate_part();
        if s.handed_off_at.is_some() {
            // The rejection that led to the hand-off needed a call: counted as one that brings
            // what the model's calls bring on average (a call of one token would teach the
            // ledger that calls are cheaper than they are, and swing the guard).
            let brings = self
                .ledger
                .view()
                .rates(prior(self.kind), PRIOR_TOKENS)
                .tokens_per_call()
                .round() as u64;
            part.tokens += brings;
            part.calls += 1;
            part.target_tokens += brings;
        }
        self.ledger
            .record(cost, u64::from(s.completion_tokens), part);
        let v = self.ledger.view();
        let labels = |side: Option<&'static str>| {
            let mut l = vec![
                metrics::Label::new("model", self.model.clone()),
                metrics::Label::new("kind", self.kind.name()),
                metrics::Label::new("output", self.output.name()),
            ];
            l.extend(side.map(|s| metrics::Label::new("side", s)));
            l
        };
        // A busy-priced model's ledger is in seconds of the target's time.
        match self.unit {
            Unit::Usd => {
                metrics::gauge!("approxy_budget_cost_usd", labels(Some("approxy"))).set(v.approxy);
                metrics::gauge!("approxy_budget_cost_usd", labels(Some("passthrough")))
                    .set(v.passthrough);
            }
            Unit::TargetSeconds => {
                metrics::gauge!("approxy_budget_target_seconds", labels(Some("approxy")))
                    .set(v.approxy);
                metrics::gauge!("approxy_budget_target_seconds", labels(Some("passthrough")))
                    .set(v.passthrough);
            }
        }
        if let Some(r) = v.cost_ratio() {
            metrics::gauge!("approxy_budget_cost_ratio", labels(None)).set(r);
        }
        let rates = v.rates(prior(self.kind), PRIOR_TOKENS);
        metrics::gauge!("approxy_budget_calls_per_token", labels(None)).set(rates.calls_per_token);
        metrics::gauge!("approxy_budget_target_share", labels(None)).set(rates.target_share);
    }
}

/// The engine books a finished generation's spend here as soon as it ends.
impl approxy_verifier::infer::Books for Account {
    fn record(&self, stats: &Stats, cost: CostEstimate) {
        Account::record(self, stats, cost);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Structured answers, whose tokens a grammar forces, cost the target far less than free
    /// text: each has its own ledger, so cheap JSON traffic cannot keep costly chat under
    /// budget.
    #[test]
    fn structured_answers_and_free_text_keep_separate_ledgers() {
        let ledgers = Ledgers::default();
        let window = std::time::Duration::from_secs(3600);
        let text = ledgers.ledger("*", PromptKind::Chat, Output::Text, window);
        let json = ledgers.ledger("*", PromptKind::Chat, Output::Structured, window);
        assert!(!Arc::ptr_eq(&text, &json));
        let cheap = CostEstimate {
            approxy: 1.0,
            passthrough: 10.0,
        };
        for _ in 0..20 {
            json.record(cheap, 10, Default::default());
        }
        let costly = CostEstimate {
            approxy: 14.0,
            passthrough: 10.0,
        };
        text.record(costly, 10, Default::default());
        assert!(json.view().cost_ratio().is_some_and(|r| r < 0.2));
        assert!(text.view().cost_ratio().is_some_and(|r| r > 1.3));
        // The same key finds the same ledger.
        let again = ledgers.ledger("*", PromptKind::Chat, Output::Text, window);
        assert!(Arc::ptr_eq(&text, &again));
        assert_eq!(
            (Output::of(true).name(), Output::of(false).name()),
            ("structured", "text")
        );
    }
}
