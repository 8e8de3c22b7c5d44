//! A model's entry: its mode, dial, verifier, verification and correction, guard, price
//! and fallback.

use std::time::Duration;

use approxy_verifier::policy::{
    BailoutBudget, BusyRates, Correction, Fence, JsonLayout, JsonThresholds, Price, Pricing,
    SpanAsk, SpanClose, TargetKind, Verification, VerifierChoice, kinds_that,
};

use crate::policy::raw::{
    RawBailout, RawCorrection, RawModel, RawPerKind, RawPricing, RawStructuredThreshold,
};
use crate::policy::typed::{GuardPolicy, KindThresholds, Mode, ModelPolicy};

use super::*;

impl Validator {
    /// One `models.<id>` table. Its sections are read in the order its problems are reported;
    /// the dial is read before the override range, whose default is the dial's own values.
    pub(super) fn model(
        &mut self,
        id: &str,
        m: RawModel,
        kind: TargetKind,
        busy: BusyRates,
    ) -> ModelPolicy {
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
    pub(super) fn named<T>(
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

    pub(super) fn structured_threshold(
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

    pub(super) fn window_max(&mut self, f: Field, n: Option<u32>, kind: TargetKind) -> u32 {
        use approxy_verifier::policy::{WINDOW_MAX, WINDOW_MAX_LIMIT, WINDOW_MIN};
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

    pub(super) fn prompt_lookup(&mut self, f: Field, n: Option<u32>) -> usize {
        let n = n.unwrap_or(DEFAULT_PROMPT_LOOKUP);
        if n > MAX_PROMPT_LOOKUP {
            self.err(format!(
                "{}: at most {MAX_PROMPT_LOOKUP}",
                f("prompt_lookup")
            ));
        }
        n.min(MAX_PROMPT_LOOKUP) as usize
    }

    pub(super) fn mode(&mut self, f: Field, mode: &str) -> Mode {
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

    pub(super) fn verifier(&mut self, f: Field, verifier: Option<&str>) -> VerifierChoice {
        let choice = VerifierChoice::parse(verifier, |p| self.path(p));
        if let Err(e) = choice.check() {
            self.err(format!("{}: {e}", f("verifier")));
        }
        choice
    }

    /// The dial: given outright, or read off the calibration at a false-accept budget.
    pub(super) fn threshold(
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
    pub(super) fn calibrated(
        &mut self,
        f: Field,
        c: &str,
        far: RawPerKind,
        verifier: &VerifierChoice,
    ) -> KindThresholds {
        use approxy_verifier::policy::{threshold_for, threshold_for_kind};
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

    pub(super) fn model_correction(&mut self, f: Field, m: &RawModel, fewest: bool) -> Correction {
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

    pub(super) fn verification(
        &mut self,
        f: Field,
        v: Option<&str>,
        kind: TargetKind,
    ) -> Verification {
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
                match approxy_verifier::policy::AcceptanceRule::parse(relaxed.unwrap_or_default()) {
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
    pub(super) fn guard(&mut self, f: Field, m: &RawModel) -> (f64, GuardPolicy) {
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

    pub(super) fn bailout(&mut self, f: Field, b: Option<&RawBailout>) -> Option<BailoutBudget> {
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

    pub(super) fn threshold_override(
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

    pub(super) fn price(
        &mut self,
        f: Field,
        price: Option<&RawPricing>,
        busy: BusyRates,
    ) -> Pricing {
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
    pub(super) fn fallback(&mut self, f: Field, fallback: Option<&str>) -> bool {
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

    pub(super) fn fixed(&mut self, field: &str, tokens: u32) -> Correction {
        if !(1..=256).contains(&tokens) {
            self.err(format!("{field}: tokens must be in 1..=256"));
        }
        Correction::Fixed { tokens }
    }

    /// `fewest`: what a span's calls ask for by default (see [`SpanAsk`]).
    pub(super) fn correction(
        &mut self,
        field: &str,
        c: &RawCorrection,
        fewest: bool,
    ) -> Correction {
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
