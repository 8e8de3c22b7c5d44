//! Policy files: TOML -> [`raw`] structs (unknown keys rejected) -> a validated [`Policy`]
//! with typed values. Validation collects every problem before failing, so `approxy check`
//! can list them all at once.

pub mod raw;
mod typed;
mod validate;

use std::path::Path;

/// USD per million tokens (the engine's own type: its cost guard reads it).
pub use approxy_verifier::policy::{BusyRates, Price, Pricing, VerifierChoice};
use raw::RawPolicy;
pub use typed::{
    Auth, DraftPolicy, GatewayPolicy, GuardPolicy, KindThresholds, Mode, ModelPolicy,
    PassthroughPolicy, Policy, PolicyError, PromptKind, SpecialTokenText, TargetPolicy,
};
pub use validate::{DEFAULT_BUDGET_WINDOW, DEFAULT_HARD_COST_CAP, parse_duration};

// What the tests below (`use super::*`) read beside the policy's own names.
#[cfg(test)]
use approxy_verifier::policy::{
    CacheHints, CacheRules, Correction, JsonLayout, JsonThresholds, PrefixStyle, TargetKind,
    Verification,
};
#[cfg(test)]
use std::time::Duration;

impl Policy {
    /// Reads and validates a file.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let fail = |m: String| PolicyError {
            path: path.display().to_string(),
            problems: vec![m],
        };
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        Self::parse(&text, path)
    }

    /// Validates policy text; `path` names the file and anchors relative paths.
    pub fn parse(text: &str, path: &Path) -> Result<Self, PolicyError> {
        let raw: RawPolicy = toml::from_str(text).map_err(|e| PolicyError {
            path: path.display().to_string(),
            problems: vec![e.to_string()],
        })?;
        let (policy, problems) = validate::validate(raw, path);
        if problems.is_empty() {
            Ok(policy)
        } else {
            Err(PolicyError {
                path: path.display().to_string(),
                problems,
            })
        }
    }
}

/// Where the committed JSON Schema of policy files lives, from the repository's root.
pub const SCHEMA_PATH: &str = "policies/policy.schema.json";

/// The JSON Schema of policy files, from the types the parser reads them into: editors that
/// check TOML against a schema (taplo, VS Code's TOML extensions) complete and check keys with
/// it. Value rules the validator applies (ranges, durations, one of a few names) are in the
/// descriptions, not the schema.
pub fn json_schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(raw::RawPolicy).to_value();
    schema["title"] = serde_json::json!("approxy policy file");
    schema
}

/// `approxy schema`: prints [`json_schema`] (the committed copy is [`SCHEMA_PATH`]).
pub fn print_schema() -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(&json_schema())?);
    Ok(())
}

/// `approxy check`: validates a file, printing a summary or every problem.
pub fn check(path: &Path) -> anyhow::Result<()> {
    match Policy::load(path) {
        Ok(p) => {
            println!(
                "{}: ok ({} model entries, target {})",
                path.display(),
                p.models.len(),
                p.target.base_url
            );
            Ok(())
        }
        Err(e) => {
            eprintln!("{}: {} problem(s)", e.path, e.problems.len());
            for p in &e.problems {
                eprintln!("  - {p}");
            }
            anyhow::bail!("invalid policy")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use approxy_verifier::policy::SpanAsk;

    const GOOD: &str = r#"
[target]
kind = "llama_cpp"
base_url = "http://127.0.0.1:8081"
timeout = "30s"

[gateway]
auth = "none"

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
        assert_eq!(m, Some(KindThresholds::all(0.7)));
        Ok(())
    }

    #[test]
    fn thresholds_and_budgets_per_kind() -> Result<(), Box<dyn std::error::Error>> {
        let calibration =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/verifier/calibration.json");
        let with = |line: &str| {
            GOOD.replace("threshold = 0.7\n", &format!("{line}\n"))
                .replace("threshold_override = [0.0, 1.0]\n", "")
        };
        // A threshold per kind; without an override range, only the policy's own values.
        let p = Policy::parse(
            &with("threshold = { code = 0.6, chat = 0.8 }"),
            Path::new("/x/p.toml"),
        )?;
        let m = p.model("m").ok_or("no model policy")?;
        assert_eq!(
            (
                m.threshold.get(PromptKind::Code),
                m.threshold.get(PromptKind::Chat)
            ),
            (0.6, 0.8)
        );
        assert_eq!(m.threshold_override, (0.6, 0.8));
        assert_eq!(m.threshold.to_string(), "0.60 on code, 0.80 on chat");
        // A budget per kind resolves on each kind's own curve; one budget on the pooled curve.
        let cal = format!("calibration = {:?}", calibration.display().to_string());
        let p = Policy::parse(
            &with(&format!(
                "max_false_accept_rate = {{ code = 0.05, chat = 0.05 }}\n{cal}"
            )),
            Path::new("/x/p.toml"),
        )?;
        let t = p.model("m").map(|m| m.threshold);
        use approxy_verifier::policy::{Curve, threshold_for, threshold_for_kind};
        let k = |kind| threshold_for_kind(&calibration, kind, 0.05, Curve::Confidence);
        assert_eq!(
            t,
            Some(KindThresholds {
                code: k("code")?,
                chat: k("chat")?,
            })
        );
        let p = Policy::parse(
            &with(&format!("max_false_accept_rate = 0.05\n{cal}")),
            Path::new("/x/p.toml"),
        )?;
        let all = threshold_for(&calibration, 0.05, Curve::Confidence)?;
        assert_eq!(
            p.model("m").map(|m| m.threshold),
            Some(KindThresholds::all(all))
        );
        // A confidence policy reads the confidence curve even of a file that chose a learned
        // head (the ratio:0.2 calibration did), not the head's.
        let ratio = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/bench/results/acceptance-rules/by-rule/ratio_0.2");
        let cal = format!(
            "calibration = {:?}",
            ratio.join("calibration.json").display().to_string()
        );
        let budget = "max_false_accept_rate = { code = 0.05, chat = 0.05 }";
        let p = Policy::parse(&with(&format!("{budget}\n{cal}")), Path::new("/x/p.toml"))?;
        let on = |curve| -> Result<KindThresholds, String> {
            let k = |kind| threshold_for_kind(&ratio.join("calibration.json"), kind, 0.05, curve);
            Ok(KindThresholds {
                code: k("code")?,
                chat: k("chat")?,
            })
        };
        assert_ne!(on(Curve::Confidence)?, on(Curve::Learned)?);
        assert_eq!(
            p.model("m").map(|m| m.threshold),
            Some(on(Curve::Confidence)?)
        );
        // The head trained for that rule reads its own curve; one trained for another rule
        // is refused.
        let art = |d: &Path| {
            format!(
                "verifier = {:?}",
                d.join("default.json").display().to_string()
            )
        };
        let p = Policy::parse(
            &with(&format!("{budget}\n{cal}\n{}", art(&ratio))),
            Path::new("/x/p.toml"),
        )?;
        assert_eq!(p.model("m").map(|m| m.threshold), Some(on(Curve::Learned)?));
        let identity = calibration.parent().ok_or("no parent")?;
        let e = Policy::parse(
            &with(&format!("{budget}\n{cal}\n{}", art(identity))),
            Path::new("/x/p.toml"),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            e.contains("calibrates the rule ratio:0.2, but the verifier")
                && e.contains("was trained for identical"),
            "{e}"
        );
        // Mistakes name the key.
        for (line, says) in [
            (
                "threshold = { code = 0.6, chat = 1.5 }",
                "threshold.chat: 1.5 is outside [0, 1]",
            ),
            (
                "threshold = { code = 0.6 }",
                "a number, or a table { code = NUMBER, chat = NUMBER }",
            ),
            (
                "threshold = { code = 0.6, chat = 0.7, prose = 0.1 }",
                "a number, or a table",
            ),
            ("threshold = \"high\"", "a number, or a table"),
        ] {
            let e = Policy::parse(&with(line), Path::new("/x/p.toml"));
            assert!(
                e.as_ref().is_err_and(|e| e.to_string().contains(says)),
                "{line}: {e:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn the_guard_is_the_budget_guard_unless_the_policy_says_and_its_keys_are_checked() {
        let with = |lines: &str| {
            format!(
                "[target]\nkind = \"llama_cpp\"\nbase_url = \"http://127.0.0.1:1\"\n\n[gateway]\nauth = \"none\"\n\n[models.m]\nmode = \"approximate\"\nthreshold = 0.5\n{lines}\n"
            )
        };
        let guard = |lines: &str| {
            Policy::parse(&with(lines), Path::new("/x/p.toml")).map(|p| p.models["m"].guard)
        };
        assert_eq!(
            guard("").ok(),
            Some(GuardPolicy::Budget {
                hard_cap: DEFAULT_HARD_COST_CAP,
                window: DEFAULT_BUDGET_WINDOW
            })
        );
        assert_eq!(
            guard("hard_cost_cap = 2.0\nbudget_window = \"10m\"").ok(),
            Some(GuardPolicy::Budget {
                hard_cap: 2.0,
                window: std::time::Duration::from_secs(600)
            })
        );
        // A ratio above the default cap raises the cap with it.
        assert_eq!(
            guard("max_cost_ratio = 2.0").ok(),
            Some(GuardPolicy::Budget {
                hard_cap: 2.0,
                window: DEFAULT_BUDGET_WINDOW
            })
        );
        assert_eq!(guard("guard = \"strict\"").ok(), Some(GuardPolicy::Strict));
        assert_eq!(guard("guard = \"off\"").ok(), Some(GuardPolicy::Off));
        for (line, says) in [
            (
                "guard = \"sometimes\"",
                "guard: \"sometimes\" is not one of",
            ),
            (
                "hard_cost_cap = 0.5",
                "hard_cost_cap: must be a number at or above",
            ),
            (
                "guard = \"strict\"\nhard_cost_cap = 2.0",
                "belong to guard = \"budget\"",
            ),
            ("budget_window = \"0s\"", "budget_window: at least 1s"),
        ] {
            let e = guard(line);
            assert!(
                e.as_ref().is_err_and(|e| e.to_string().contains(says)),
                "{line}: {e:?}"
            );
        }
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
max_cost_ratio = -1
"#;
        let e = Policy::parse(bad, Path::new("p.toml"))
            .err()
            .map(|e| e.problems)
            .unwrap_or_default();
        for needle in [
            "target.kind",
            "target.base_url",
            "target.timeout",
            "mode",
            "threshold",
            "correction_tokens",
            "max_cost_ratio",
        ] {
            assert!(
                e.iter().any(|p| p.contains(needle)),
                "{needle} missing from {e:?}"
            );
        }
        assert!(e.len() >= 7, "{e:?}");
    }

    #[test]
    fn target_kinds_by_name() -> Result<(), PolicyError> {
        for (name, kind, base) in [
            ("llama_cpp", TargetKind::LlamaCpp, "https://h:1/v1"),
            ("vllm", TargetKind::Vllm, "https://h:1"),
            ("openai", TargetKind::Vllm, "https://h:1"),
            ("sglang", TargetKind::Sglang, "https://h:1/v1"),
            ("openai_text", TargetKind::OpenaiText, "https://h:1"),
            ("chat_prefix", TargetKind::ChatPrefix, "https://h:1"),
            ("openai_chat", TargetKind::OpenAiChat, "https://h:1"),
        ] {
            let text = GOOD
                .replace("kind = \"llama_cpp\"", &format!("kind = {name:?}"))
                .replace("http://127.0.0.1:8081", "https://h:1");
            let p = Policy::parse(&text, Path::new("p.toml"))?;
            assert_eq!(p.target.kind, kind, "{name}");
            assert_eq!(p.target.openai_base(), base, "{name}");
            assert_eq!(kind.can_continue(), name != "openai_chat");
        }
        Ok(())
    }

    #[test]
    fn prefix_styles_and_cache_settings() -> Result<(), PolicyError> {
        let with = |kind: &str, lines: &str| {
            Policy::parse(
                &GOOD.replace("kind = \"llama_cpp\"", &format!("kind = {kind:?}\n{lines}")),
                Path::new("p.toml"),
            )
        };
        let p = with("chat_prefix", "prefix_style = \"continue_final_message\"")?;
        assert_eq!(p.target.prefix_style, PrefixStyle::ContinueFinalMessage);
        assert_eq!(
            with("chat_prefix", "")?.target.prefix_style,
            PrefixStyle::Prefix
        );
        assert!(
            with("chat_prefix", "prefix_style = \"please\"")
                .is_err_and(|e| e.to_string().contains("prefix_style"))
        );
        assert!(
            with("vllm", "prefix_style = \"prefix\"")
                .is_err_and(|e| e.to_string().contains("chat_prefix"))
        );
        // Defaults per kind: the text kinds send a cache key, vLLM counts 16-token blocks.
        assert!(with("openai_text", "")?.target.cache_hints.key);
        assert!(!with("llama_cpp", "")?.target.cache_hints.key);
        // Slots are named only when asked, and only to a server that has them.
        assert!(!with("llama_cpp", "")?.target.cache_hints.slots);
        assert!(
            with("llama_cpp", "cache = { slots = true }")?
                .target
                .cache_hints
                .slots
        );
        assert!(
            with("vllm", "cache = { slots = true }")
                .is_err_and(|e| e.to_string().contains("target.cache.slots"))
        );
        // A warm goes to the answer's slot, so it needs slots named.
        assert!(
            with("llama_cpp", "cache = { slots = true, warm = true }")?
                .target
                .cache_hints
                .warm
        );
        assert!(
            with("llama_cpp", "cache = { warm = true }")
                .is_err_and(|e| e.to_string().contains("target.cache.warm"))
        );
        assert_eq!(
            with("vllm", "")?.target.cache_rules,
            CacheRules {
                min_tokens: 0,
                block: 16
            }
        );
        let openai = with(
            "openai_text",
            "cache = { key = false, affinity_header = \"x-session-affinity\", min_tokens = 1024, block = 128 }",
        )?;
        assert_eq!(
            openai.target.cache_hints,
            CacheHints {
                key: false,
                affinity_header: Some("x-session-affinity".into()),
                slots: false,
                warm: false,
            }
        );
        assert_eq!(
            openai.target.cache_rules,
            CacheRules {
                min_tokens: 1024,
                block: 128
            }
        );
        assert!(
            with("vllm", "cache = { block = 0 }")
                .is_err_and(|e| e.to_string().contains("target.cache.block"))
        );
        assert!(
            with("vllm", "chat_template = \"t.jinja\"")
                .is_err_and(|e| e.to_string().contains("only an openai_text"))
        );
        assert!(
            with("openai_text", "chat_template = \"/nonexistent/t.jinja\"")
                .is_err_and(|e| e.to_string().contains("target.chat_template"))
        );
        Ok(())
    }

    /// The good policy with `line` added to its model's table.
    fn with_model_line(line: &str) -> Result<Policy, PolicyError> {
        Policy::parse(
            &GOOD.replace("threshold = 0.7\n", &format!("threshold = 0.7\n{line}\n")),
            Path::new("p.toml"),
        )
    }

    #[test]
    fn corrections_fixed_span_and_the_earlier_key() -> Result<(), PolicyError> {
        let with = with_model_line;
        let c = |p: Policy| p.model("x").map(|m| m.correction);
        assert_eq!(
            c(Policy::parse(GOOD, Path::new("p.toml"))?),
            Some(Correction::Fixed { tokens: 1 })
        );
        assert_eq!(
            c(with("correction_tokens = 4")?),
            Some(Correction::Fixed { tokens: 4 })
        );
        assert_eq!(
            c(with("correction = { mode = \"fixed\", tokens = 3 }")?),
            Some(Correction::Fixed { tokens: 3 })
        );
        // GOOD gives a price list, which bills every call's re-sent prefix: one streamed call
        // a span.
        assert_eq!(
            c(with("correction = { mode = \"span\" }")?),
            Some(Correction::Span {
                max_span: 32,
                resync: 3,
                end: validate::DEFAULT_SPAN_CLOSE,
                ask: SpanAsk::All,
            })
        );
        assert_eq!(
            c(with(
                "correction = { mode = \"span\", max_span = 16, resync = 2 }"
            )?),
            Some(Correction::Span {
                max_span: 16,
                resync: 2,
                end: validate::DEFAULT_SPAN_CLOSE,
                ask: SpanAsk::All,
            })
        );
        // Without one, llama-server (which writes on after a closed stream) is asked for the
        // fewest tokens; vLLM, which aborts a closed stream at once, for the whole span.
        let unpriced = |kind: &str| {
            GOOD.replace("kind = \"llama_cpp\"", &format!("kind = {kind:?}"))
                .replace(
                    "price = { input = 0.5, cached_input = 0.05, output = 1.5 }\n",
                    "correction = { mode = \"span\" }\n",
                )
        };
        for (kind, ask) in [("llama_cpp", SpanAsk::Fewest), ("vllm", SpanAsk::All)] {
            assert!(
                matches!(
                    c(Policy::parse(&unpriced(kind), Path::new("p.toml"))?),
                    Some(Correction::Span { ask: a, .. }) if a == ask
                ),
                "{kind}"
            );
        }
        for (word, ask) in [("fewest", SpanAsk::Fewest), ("all", SpanAsk::All)] {
            assert!(matches!(
                c(with(&format!(
                    "correction = {{ mode = \"span\", ask = \"{word}\" }}"
                ))?),
                Some(Correction::Span { ask: a, .. }) if a == ask
            ));
        }
        for (word, end) in [
            ("expected", approxy_verifier::policy::SpanClose::Expected),
            ("resync", approxy_verifier::policy::SpanClose::Resync),
        ] {
            assert_eq!(
                c(with(&format!(
                    "correction = {{ mode = \"span\", end = \"{word}\" }}"
                ))?),
                Some(Correction::Span {
                    max_span: 32,
                    resync: 3,
                    end,
                    ask: SpanAsk::All,
                })
            );
        }
        for bad in [
            "correction = { mode = \"span\", tokens = 3 }",
            "correction = { mode = \"fixed\", resync = 3 }",
            "correction = { mode = \"fixed\", end = \"expected\" }",
            "correction = { mode = \"span\", end = \"never\" }",
            "correction = { mode = \"span\", ask = \"some\" }",
            "correction = { mode = \"fixed\", ask = \"fewest\" }",
            "correction = { mode = \"sometimes\" }",
            "correction = { mode = \"span\", max_span = 0 }",
            "correction_tokens = 2\ncorrection = { mode = \"fixed\" }",
        ] {
            assert!(
                with(bad).is_err_and(|e| e.to_string().contains("correction")),
                "{bad}"
            );
        }
        assert_eq!(
            Policy::parse(GOOD, Path::new("p.toml"))?
                .model("x")
                .map(|m| m.max_cost_ratio),
            Some(1.0)
        );
        Ok(())
    }

    #[test]
    fn verification_follows_the_target_kind() -> Result<(), PolicyError> {
        let vllm = GOOD.replace("kind = \"llama_cpp\"", "kind = \"vllm\"");
        let v = |text: &str| {
            Policy::parse(text, Path::new("p.toml")).map(|p| p.model("x").map(|m| m.verification))
        };
        assert_eq!(v(GOOD)?, Some(Verification::Approximate));
        assert_eq!(v(&vllm)?, Some(Verification::ApproximateWindows));
        let exact = |t: &str| {
            t.replace(
                "threshold = 0.7\n",
                "threshold = 0.7\nverification = \"exact\"\n",
            )
        };
        assert_eq!(v(&exact(&vllm))?, Some(Verification::Exact));
        assert!(v(&exact(GOOD)).is_err_and(|e| e.to_string().contains("prompt log-probabilities")));
        let relaxed = |t: &str, rule: &str| {
            t.replace(
                "threshold = 0.7\n",
                &format!("threshold = 0.7\nverification = \"relaxed:{rule}\"\n"),
            )
        };
        assert_eq!(
            v(&relaxed(&vllm, "ratio:0.8"))?,
            Some(Verification::Relaxed(
                approxy_verifier::policy::AcceptanceRule::Ratio(0.8)
            ))
        );
        assert_eq!(
            v(&relaxed(&vllm, "typical:0.09,0.3"))?,
            Some(Verification::Relaxed(
                approxy_verifier::policy::AcceptanceRule::MEDUSA_TYPICAL
            ))
        );
        assert!(
            v(&relaxed(GOOD, "ratio:0.8"))
                .is_err_and(|e| e.to_string().contains("prompt log-probabilities"))
        );
        assert!(
            v(&relaxed(&vllm, "ratio:2"))
                .is_err_and(|e| e.to_string().contains("parameters lie in [0, 1]"))
        );
        let judged = |t: &str| {
            t.replace(
                "threshold = 0.7\n",
                "threshold = 0.7\nverification = \"judged\"\n",
            )
        };
        assert_eq!(v(&judged(&vllm))?, Some(Verification::Judged));
        assert!(
            v(&judged(GOOD)).is_err_and(|e| e.to_string().contains("prompt log-probabilities"))
        );
        Ok(())
    }

    #[test]
    fn window_max_needs_windows_and_stays_in_range() -> Result<(), PolicyError> {
        let vllm = GOOD.replace("kind = \"llama_cpp\"", "kind = \"vllm\"");
        let w = |text: &str| {
            Policy::parse(text, Path::new("p.toml")).map(|p| p.model("x").map(|m| m.window_max))
        };
        let with = |t: &str, n: u32| {
            t.replace(
                "threshold = 0.7\n",
                &format!("threshold = 0.7\nwindow_max = {n}\n"),
            )
        };
        assert_eq!(w(&vllm)?, Some(approxy_verifier::policy::WINDOW_MAX));
        assert_eq!(w(&with(&vllm, 48))?, Some(48));
        assert!(w(&with(&vllm, 65)).is_err_and(|e| e.to_string().contains("4 to 64")));
        assert!(w(&with(&vllm, 3)).is_err_and(|e| e.to_string().contains("4 to 64")));
        assert!(
            w(&with(GOOD, 32)).is_err_and(|e| e.to_string().contains("prompt log-probabilities"))
        );
        Ok(())
    }

    #[test]
    fn structured_thresholds_are_two_thresholds() -> Result<(), PolicyError> {
        let s = |line: &str| {
            with_model_line(line).map(|p| p.model("x").and_then(|m| m.structured_threshold))
        };
        assert_eq!(s("")?, None);
        assert_eq!(
            s("structured_threshold = { value = 0.99, text = 0.6 }")?,
            Some(JsonThresholds {
                value: 0.99,
                text: 0.6
            })
        );
        assert!(
            s("structured_threshold = { value = 1.5, text = 0.6 }")
                .is_err_and(|e| e.to_string().contains("structured_threshold.value: 1.5"))
        );
        assert!(
            s("structured_threshold = { value = 0.9 }")
                .is_err_and(|e| e.to_string().contains("text"))
        );
        Ok(())
    }

    #[test]
    fn the_json_layout_is_one_of_two_names() -> Result<(), PolicyError> {
        let s = |line: &str| with_model_line(line).map(|p| p.model("x").map(|m| m.json_layout));
        assert_eq!(s("")?, Some(validate::DEFAULT_JSON_LAYOUT));
        assert_eq!(s("json_layout = \"indented\"")?, Some(JsonLayout::Indented));
        assert_eq!(s("json_layout = \"compact\"")?, Some(JsonLayout::Compact));
        assert!(
            s("json_layout = \"pretty\"")
                .is_err_and(|e| e.to_string().contains("json_layout: \"pretty\""))
        );
        Ok(())
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = Policy::parse(
            &GOOD.replace("timeout = \"30s\"", "timeuot = \"30s\""),
            Path::new("p.toml"),
        );
        assert!(e.is_err_and(|e| e.to_string().contains("timeuot")));
    }

    #[test]
    fn shipped_policies_validate() -> Result<(), PolicyError> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("policies");
        for name in ["default.toml", "strict.toml", "economy.toml"] {
            let p = Policy::load(&dir.join(name))?;
            let m = p.model("any-model").map(|m| (m.mode, m.threshold));
            assert!(
                matches!(m, Some((Mode::Approximate, t))
                    if (0.0..=1.0).contains(&t.code) && (0.0..=1.0).contains(&t.chat)),
                "{name}: {m:?}"
            );
        }
        Ok(())
    }

    /// The policy reference's provider snippets are these files' `[target]` tables, and every
    /// file loads.
    #[test]
    fn provider_policies_validate_and_are_the_readme_snippets() -> Result<(), PolicyError> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let readme = std::fs::read_to_string(root.join("policies/README.md")).unwrap_or_default();
        let mut n = 0;
        for entry in std::fs::read_dir(root.join("policies/providers"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            let p = Policy::load(&path)?;
            assert!(p.model("any").is_some(), "{}", path.display());
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let target = text
                .split("\n\n")
                .find(|b| b.starts_with("[target]"))
                .unwrap_or_default();
            assert!(
                !target.is_empty() && readme.contains(target),
                "policies/README.md lacks the [target] of {}",
                path.display()
            );
            n += 1;
        }
        assert!(n >= 8, "{n} provider policies");
        Ok(())
    }

    #[test]
    fn deadlines_have_a_floor_and_a_ceiling_of_a_week_but_a_backoff_may_be_zero() {
        let with = |gateway: &str, backoff: &str| {
            let text = GOOD
                .replace(
                    "timeout = \"30s\"",
                    &format!("timeout = \"30s\"\nbackoff = \"{backoff}\""),
                )
                .replace("auth = \"none\"", &format!("auth = \"none\"\n{gateway}"));
            Policy::parse(&text, Path::new("p.toml"))
                .err()
                .map(|e| e.problems)
                .unwrap_or_default()
        };
        assert_eq!(with("", "0ms"), Vec::<String>::new());
        for (key, value, says) in [
            ("write_idle_timeout", "0s", "at least 100ms"),
            ("body_timeout", "0ms", "at least 100ms"),
            ("body_idle_timeout", "99ms", "at least 100ms"),
            ("header_timeout", "1ms", "at least 100ms"),
            ("request_timeout", "1ms", "at least 1s"),
            ("request_timeout", "999ms", "at least 1s"),
            ("idle_timeout", "100000h", "longer than 7 days"),
            ("request_timeout", "2562047788015215h", "longer than 7 days"),
        ] {
            let problems = with(&format!("{key} = \"{value}\""), "200ms");
            assert!(
                problems
                    .iter()
                    .any(|p| p.contains(&format!("gateway.{key}")) && p.contains(says)),
                "{key} = {value}: {problems:?}"
            );
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("2"), None);
        assert_eq!(parse_duration("x s"), None);
        // Beyond what a duration holds: refused, not a panic.
        assert_eq!(parse_duration("99999999999999999999h"), None);
    }
}

/// Property tests (a fixed budget in every test run): any text loads as a policy or says why.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(approxy_verifier::testing::property_cases(1024)))]
        #[test]
        fn any_policy_text_loads_or_says_why(text in "\\PC{0,200}", table in proptest::sample::select(vec!["[target]\n", "[gateway]\n", "[models.\"*\"]\n", ""])) {
            let r = Policy::parse(&format!("{table}{text}"), Path::new("/p.toml"));
            if let Err(e) = r {
                prop_assert!(!e.problems.is_empty());
            }
        }
    }
}
