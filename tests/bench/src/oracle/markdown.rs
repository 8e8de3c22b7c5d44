//! The Markdown report.

use super::summary::{BUSY, OracleReport};

/// The Markdown table.
pub fn markdown(r: &OracleReport) -> String {
    let limits: Vec<String> = r
        .max_tokens
        .iter()
        .map(|(k, n)| format!("{n} ({k})"))
        .collect();
    let busy = r
        .classes
        .iter()
        .find(|c| c.0 == BUSY)
        .map_or("not measured".to_string(), |(_, b)| {
            format!(
                "{:.1} ms per computed prompt token and {:.1} ms per generated token, llama-server's counters over `approxy bench calls` target-only runs with cores pinned",
                b.input, b.output
            )
        });
    let mut s = format!(
        "Oracle study, {} on {} ({} cores): at every position the target's top-20 probabilities decide (a rule) or the draft's confidence does (a verifier), and a rejected position gets the target's own token; answers of at most {} tokens, greedy. Instructions: IFEval's checkers on `tests/bench/instructions/` (prompt level / instruction level, strict). Cheapest plan: the least any call plan pays for the positions the target wrote (every call re-sends the prefix, all of it read from the cache but what is new, spans stopped exactly, `call_floor.rs`), against target-only's answers through passthrough; at DeepSeek's prices, and in the target's busy time ({busy}).\n\n| kind | configuration | answers | target share | calls / 100 tokens | pass@1 | instructions followed | NLL / token | NLL gap closed | ROUGE-L vs target | identical to target | cheapest plan, DeepSeek | cheapest plan, target busy |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        r.date,
        r.machine.cpu,
        r.machine.cores,
        limits.join(", ")
    );
    for x in &r.summaries {
        let opt = |v: Option<f64>, pct: bool| {
            v.map_or("-".to_string(), |v| {
                if pct {
                    format!("{:.0} %", 100.0 * v)
                } else {
                    format!("{v:.3}")
                }
            })
        };
        let class = |name: &str| {
            opt(
                x.cheapest.iter().find(|c| c.class == name).map(|c| c.ratio),
                true,
            )
        };
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} % | {} | {} | {} | {:.3} | {} | {} | {} | {} | {} |\n",
            x.kind,
            x.config,
            x.answers,
            100.0 * x.target_share,
            x.tokens_per_call
                .map_or(format!("{:.1}", x.calls_per_100_tokens), |t| format!(
                    "{:.1} ({t:.1} tokens a call)",
                    x.calls_per_100_tokens
                )),
            x.passed
                .map_or("-".into(), |p| format!("{p}/{}", x.answers)),
            x.instructions.map_or("-".into(), |i| format!(
                "{:.1} % / {:.1} %",
                100.0 * i.prompt_level_strict,
                100.0 * i.instruction_level_strict
            )),
            x.nll_per_token,
            opt(x.nll_gap_closed, true),
            opt(x.rouge_l, false),
            x.identical,
            class("DeepSeek"),
            class(BUSY),
        ));
    }
    s
}
