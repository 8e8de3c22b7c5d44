//! What approxy's target calls would cost on a GPU-hosted target: a projection from a measured
//! table (`tests/bench/gpu/window_cost.json`, one H200; see tests/bench/gpu/README.md), not a
//! measurement of approxy on a GPU. The table times one forward pass of B sequences each appending K tokens to a cached
//! context of L tokens, in decode steps (t(B, K) / t(B, 1)) and in milliseconds.
//!
//! A call that reads `cached` tokens from the prefix cache, prefills `prefilled` new ones and
//! generates `generated` costs one pass over the prefilled tokens (the first generated token
//! comes from that pass's last logits), then one decode step per further generated token. A
//! window scoring call (at most one token back) is the pass alone. Between measured K the pass
//! is interpolated linearly; beyond the largest (64) it is extrapolated from the last two
//! points, and every such call is counted, because a passthrough prompt of hundreds of tokens
//! lands there and the extrapolation is the weakest number here.
//!
//! Only L = 1,024 (every model) and 4,096 (32B) were measured, so a shape's context picks the
//! nearest measured L, and every call of the shape is priced at that L whatever its own
//! context: the output says the L is the table's.
//!
//! Use, once the engine reports per-call records:
//!
//! ```ignore
//! let table = Table::load(Path::new(TABLE_FILE))?;
//! let one = compare(&table, SHAPES[0], &approxy_calls, &passthrough_calls)?; // .ratio()
//! let md = markdown(&table, &SHAPES, &[Run { label, approxy: approxy_calls, passthrough }])?;
//! ```
//!
//! where a passthrough answer is `ProjectedCall::passthrough(prompt_tokens, answer_tokens)`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

/// The table's place, from the repository root.
pub const TABLE_FILE: &str = "tests/bench/gpu/window_cost.json";

/// What the numbers are, in every heading and caption: the table's file, machine and date.
pub const SOURCE: &str =
    "projection from a measured table (tests/bench/gpu/window_cost.json, H200, 2026-11-26)";

/// The shapes the Markdown shows: the 32B and 7B targets alone and in a batch of 8, and the 32B
/// at the longer measured context.
pub const SHAPES: [Shape; 5] = [
    Shape::new("qwen2.5-32b", 1, 1024),
    Shape::new("qwen2.5-32b", 8, 1024),
    Shape::new("qwen2.5-7b", 1, 1024),
    Shape::new("qwen2.5-7b", 8, 1024),
    Shape::new("qwen2.5-32b", 1, 4096),
];

/// A target on the GPU: the model's shape, how many sequences share each pass, and the context
/// the caller has in mind (priced at the nearest measured one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// The table's model name, e.g. `qwen2.5-32b`.
    pub model: &'static str,
    /// Sequences in each pass, every one appending as many tokens as this call.
    pub batch: u32,
    /// Cached context in tokens.
    pub context: u32,
}

impl Shape {
    /// A shape.
    pub const fn new(model: &'static str, batch: u32, context: u32) -> Self {
        Shape {
            model,
            batch,
            context,
        }
    }
}

/// One target call as the engine records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProjectedCall {
    /// Prompt tokens read from the target's prefix cache.
    pub cached: u64,
    /// Prompt tokens the target computed (not served from its cache).
    pub prefilled: u64,
    /// Tokens the target generated.
    pub generated: u64,
}

impl ProjectedCall {
    /// Passthrough's one call for an answer: the whole prompt prefilled, the answer generated.
    pub fn passthrough(prompt: u64, answer: u64) -> Self {
        ProjectedCall {
            cached: 0,
            prefilled: prompt,
            generated: answer,
        }
    }
}

#[derive(Deserialize)]
struct Row {
    model: String,
    #[serde(rename = "B")]
    batch: u32,
    #[serde(rename = "K")]
    k: u32,
    #[serde(rename = "L")]
    context: u32,
    ms: f64,
    decode_steps: f64,
}

/// The script writes bare rows; the committed file wraps two runs' rows with what was measured.
#[derive(Deserialize)]
#[serde(untagged)]
enum TableFile {
    Wrapped {
        measured: Option<String>,
        rows: Vec<Row>,
    },
    Bare(Vec<Row>),
}

/// A curve's key: model, batch B, context L.
type CurveKey = (String, u32, u32);

/// A measured point as read: K, decode steps, ms.
type Point = (u32, f64, f64);

/// One measured curve: passes of K new tokens for one model, batch and context.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// The measured context L.
    pub context: u32,
    /// One decode step, t(B, 1), in ms.
    pub step_ms: f64,
    /// (K, decode steps), K ascending from 1.
    points: Vec<(u32, f64)>,
}

/// A pass's price in decode steps, and whether it lay beyond the measured K.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pass {
    /// t(B, k) / t(B, 1).
    pub steps: f64,
    /// k was above the largest measured K: extrapolated.
    pub beyond_table: bool,
}

impl Curve {
    fn new(context: u32, mut rows: Vec<Point>) -> Result<Self> {
        rows.sort_by_key(|r| r.0);
        if rows.windows(2).any(|w| w[0].0 == w[1].0) {
            bail!("a K measured twice");
        }
        let Some(&(1, _, step_ms)) = rows.first() else {
            bail!("no K = 1 row (the decode step the others are priced in)");
        };
        if rows.len() < 2 || step_ms <= 0.0 {
            bail!("fewer than two K, or a decode step of {step_ms} ms");
        }
        let points = rows.iter().map(|&(k, steps, _)| (k, steps)).collect();
        Ok(Curve {
            context,
            step_ms,
            points,
        })
    }

    /// The largest measured K.
    pub fn largest_k(&self) -> u32 {
        self.points.last().map_or(1, |p| p.0)
    }

    /// A pass of `k` new tokens (at least one: an engine computes the last prompt token to get
    /// logits even when the rest came from its cache).
    pub fn pass(&self, k: u64) -> Pass {
        let k = k.max(1) as f64;
        if let Some(&(_, steps)) = self.points.iter().find(|p| f64::from(p.0) == k) {
            return Pass {
                steps,
                beyond_table: false,
            };
        }
        let segment = self
            .points
            .windows(2)
            .find(|w| k <= f64::from(w[1].0))
            .or_else(|| self.points.windows(2).last());
        let Some(&[(k0, s0), (k1, s1)]) = segment else {
            return Pass {
                steps: 1.0,
                beyond_table: false,
            };
        };
        let (k0, k1) = (f64::from(k0), f64::from(k1));
        Pass {
            steps: s0 + (k - k0) * (s1 - s0) / (k1 - k0),
            beyond_table: k > k1,
        }
    }

    /// A call's price: its prefill pass, then a decode step per generated token after the first.
    /// A call that neither prefills nor generates costs nothing.
    pub fn call(&self, c: ProjectedCall) -> Pass {
        if c.prefilled == 0 && c.generated == 0 {
            return Pass {
                steps: 0.0,
                beyond_table: false,
            };
        }
        let pass = self.pass(c.prefilled);
        Pass {
            steps: pass.steps + c.generated.saturating_sub(1) as f64,
            ..pass
        }
    }
}

/// The measured table, a curve per model, batch and context.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// When and where it was measured, as the file says (absent in the script's bare output).
    pub measured: Option<String>,
    curves: BTreeMap<CurveKey, Curve>,
}

impl Table {
    /// Reads the table from its JSON: the script's bare rows or the committed wrapped form.
    pub fn parse(json: &str) -> Result<Table> {
        let (measured, rows) = match serde_json::from_str(json)? {
            TableFile::Wrapped { measured, rows } => (measured, rows),
            TableFile::Bare(rows) => (None, rows),
        };
        let mut grouped: BTreeMap<CurveKey, Vec<Point>> = BTreeMap::new();
        for r in rows {
            let key = (r.model, r.batch, r.context);
            grouped
                .entry(key)
                .or_default()
                .push((r.k, r.decode_steps, r.ms));
        }
        let mut curves = BTreeMap::new();
        for ((model, batch, context), rows) in grouped {
            let curve = Curve::new(context, rows)
                .with_context(|| format!("{model}, B {batch}, L {context}"))?;
            curves.insert((model, batch, context), curve);
        }
        Ok(Table { measured, curves })
    }

    /// Reads the table from a file.
    pub fn load(path: &Path) -> Result<Table> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Table::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// The curve a shape is priced on: its model and batch at the measured context nearest the
    /// shape's (the longer one on a tie, which costs more).
    pub fn curve(&self, shape: Shape) -> Result<&Curve> {
        self.curves
            .iter()
            .filter(|((m, b, _), _)| m == shape.model && *b == shape.batch)
            .map(|(_, c)| c)
            .min_by_key(|c| (c.context.abs_diff(shape.context), u32::MAX - c.context))
            .ok_or_else(|| {
                anyhow!(
                    "{} at batch {} is not in the table",
                    shape.model,
                    shape.batch
                )
            })
    }
}

/// A list of calls priced on one shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Projection {
    /// The shape asked for.
    pub shape: Shape,
    /// The measured L every call was priced at (the table's, not the calls').
    pub table_context: u32,
    /// Calls priced.
    pub calls: usize,
    /// Calls whose pass lay beyond the measured K (extrapolated).
    pub beyond_table: usize,
    /// The longest context a call had (cached + prefilled), against the table's L.
    pub largest_context: u64,
    /// Total, in decode steps of this shape.
    pub steps: f64,
    /// Total, in ms.
    pub ms: f64,
}

/// Prices `calls` on `shape`.
pub fn project(table: &Table, shape: Shape, calls: &[ProjectedCall]) -> Result<Projection> {
    let curve = table.curve(shape)?;
    let priced: Vec<Pass> = calls.iter().map(|&c| curve.call(c)).collect();
    let steps: f64 = priced.iter().map(|p| p.steps).sum();
    Ok(Projection {
        shape,
        table_context: curve.context,
        calls: calls.len(),
        beyond_table: priced.iter().filter(|p| p.beyond_table).count(),
        largest_context: calls
            .iter()
            .map(|c| c.cached + c.prefilled)
            .max()
            .unwrap_or(0),
        steps,
        // decode_steps is t(B, K) / t(B, 1), so this is the measured ms at measured K
        // (to the table's rounding).
        ms: steps * curve.step_ms,
    })
}

/// approxy's calls and passthrough's for the same answers, on one shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// approxy's calls.
    pub approxy: Projection,
    /// One call per answer.
    pub passthrough: Projection,
}

impl Comparison {
    /// approxy's time over passthrough's (the same in ms and in steps); `None` when passthrough
    /// costs nothing.
    pub fn ratio(&self) -> Option<f64> {
        (self.passthrough.ms > 0.0).then(|| self.approxy.ms / self.passthrough.ms)
    }
}

/// Prices approxy's calls and passthrough's on `shape`.
pub fn compare(
    table: &Table,
    shape: Shape,
    approxy: &[ProjectedCall],
    passthrough: &[ProjectedCall],
) -> Result<Comparison> {
    Ok(Comparison {
        approxy: project(table, shape, approxy)?,
        passthrough: project(table, shape, passthrough)?,
    })
}

/// One benchmark run's calls, for the Markdown.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Run {
    /// What ran (configuration, sample).
    pub label: String,
    /// approxy's calls over the run's answers.
    pub approxy: Vec<ProjectedCall>,
    /// Passthrough's: one call per answer (`ProjectedCall::passthrough`).
    pub passthrough: Vec<ProjectedCall>,
}

/// A Markdown section: a caption, then per run a table of `shapes`.
pub fn markdown(table: &Table, shapes: &[Shape], runs: &[Run]) -> Result<String> {
    let mut s = format!(
        "## GPU time of the target's calls: {SOURCE}\n\n{}",
        caption()
    );
    for run in runs {
        let rows = shapes
            .iter()
            .map(|&shape| compare(table, shape, &run.approxy, &run.passthrough))
            .collect::<Result<Vec<_>>>()?;
        s.push_str(&run_section(&run.label, &rows));
    }
    Ok(s)
}

fn caption() -> String {
    format!(
        "A {SOURCE}, not a measurement of approxy on a GPU. Each call is one forward pass over \
         the tokens it prefills (interpolated linearly in K between measured K; beyond K = 64 \
         extrapolated from K = 32 and 64, and counted under \"calls beyond the table\"), then one \
         decode step per generated token after the first. L is the table's measured context \
         nearest the shape's, not each call's own. Batch B: B sequences share every pass, all \
         alike; the B > 1 rows are upper bounds (PyTorch SDPA, slower with several sequences \
         than a serving engine's paged kernels). Time in ms, decode steps in brackets.\n"
    )
}

fn run_section(label: &str, rows: &[Comparison]) -> String {
    let mut s = format!(
        "\n### {label}: {SOURCE}\n\n| shape | approxy ms | passthrough ms | ratio | calls beyond the table |\n|---|---|---|---|---|\n"
    );
    for c in rows {
        let _ = writeln!(s, "{}", row(c));
    }
    let longest = rows
        .iter()
        .map(|c| c.approxy.largest_context.max(c.passthrough.largest_context))
        .max()
        .unwrap_or(0);
    let _ = writeln!(
        s,
        "\nThe calls' own contexts reached {longest} tokens; every call is priced at the \
         table's L in the shape column."
    );
    s
}

fn row(c: &Comparison) -> String {
    let (a, p) = (&c.approxy, &c.passthrough);
    let ratio = c.ratio().map_or("–".to_string(), |r| format!("{r:.2}x"));
    format!(
        "| {}, B {}, L {} (table's) | {:.1} ({:.1}) | {:.1} ({:.1}) | {ratio} | approxy {} of {}, passthrough {} of {} |",
        a.shape.model,
        a.shape.batch,
        a.table_context,
        a.ms,
        a.steps,
        p.ms,
        p.steps,
        a.beyond_table,
        a.calls,
        p.beyond_table,
        p.calls,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed() -> Table {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(TABLE_FILE);
        Table::load(&path).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    const B1: Shape = Shape::new("qwen2.5-32b", 1, 1024);

    #[test]
    fn measured_points_are_returned_exactly() {
        let t = committed();
        let c = t.curve(B1).unwrap();
        for (k, steps) in [(1, 1.0), (2, 1.016), (16, 1.022), (32, 1.037), (64, 1.174)] {
            assert_eq!(
                c.pass(k),
                Pass {
                    steps,
                    beyond_table: false
                },
                "K = {k}"
            );
        }
        let b8 = t.curve(Shape::new("qwen2.5-32b", 8, 1024)).unwrap();
        assert_eq!(b8.pass(64).steps, 3.357);
        assert_eq!(b8.step_ms, 19.224);
    }

    #[test]
    fn between_measured_points_it_interpolates_linearly_in_k() {
        let t = committed();
        let c = t.curve(Shape::new("qwen2.5-7b", 8, 1024)).unwrap();
        // K = 16: 1.471, K = 32: 1.878.
        assert!(close(c.pass(24).steps, (1.471 + 1.878) / 2.0));
        assert!(close(
            c.pass(20).steps,
            1.471 + 4.0 * (1.878 - 1.471) / 16.0
        ));
        assert!(!c.pass(20).beyond_table);
        // K = 1: 1.0, K = 2: 1.33; nothing prefilled still computes one token.
        assert_eq!(c.pass(0).steps, 1.0);
    }

    #[test]
    fn beyond_k_64_it_extrapolates_from_the_last_two_points_and_says_so() {
        let t = committed();
        let c = t.curve(B1).unwrap();
        assert_eq!(c.largest_k(), 64);
        let p = c.pass(96);
        assert!(p.beyond_table);
        assert!(close(p.steps, 1.174 + 32.0 * (1.174 - 1.037) / 32.0));
        let calls = [
            ProjectedCall::passthrough(150, 100),
            ProjectedCall::passthrough(64, 100),
        ];
        assert_eq!(project(&t, B1, &calls).unwrap().beyond_table, 1);
    }

    /// 32B, batch 1, L 1,024, worked by hand from the table's rows.
    #[test]
    fn a_window_call_and_a_passthrough_worked_by_hand() {
        let t = committed();
        // A window of 16 drafted tokens, one token back: the pass alone, 1.022 steps.
        let window = ProjectedCall {
            cached: 300,
            prefilled: 16,
            generated: 1,
        };
        let w = project(&t, B1, &[window]).unwrap();
        assert!(
            close(w.steps, 1.022) && close(w.ms, 1.022 * 18.233),
            "{w:?}"
        );
        assert_eq!((w.beyond_table, w.largest_context), (0, 316));
        // Passthrough of a 150-token prompt and a 100-token answer: a pass of 150 extrapolated
        // (1.174 + 86 * 0.137 / 32 = 1.542188), then 99 decode steps.
        let p = project(&t, B1, &[ProjectedCall::passthrough(150, 100)]).unwrap();
        assert!(close(p.steps, 1.542_187_5 + 99.0), "{p:?}");
        assert_eq!(p.beyond_table, 1);
        let c = compare(&t, B1, &[window], &[ProjectedCall::passthrough(150, 100)]).unwrap();
        assert!(close(c.ratio().unwrap(), 1.022 / 100.542_187_5));
        // Generating nothing is the pass; a call that does neither costs nothing.
        let g0 = ProjectedCall {
            generated: 0,
            ..window
        };
        assert!(close(project(&t, B1, &[g0]).unwrap().steps, 1.022));
        let empty = project(&t, B1, &[ProjectedCall::default()]).unwrap();
        assert_eq!(empty.steps, 0.0);
        assert_eq!(compare(&t, B1, &[], &[]).unwrap().ratio(), None);
    }

    #[test]
    fn the_nearest_measured_context_prices_a_shape() {
        let t = committed();
        let at = |model, context| t.curve(Shape::new(model, 1, context)).unwrap().context;
        assert_eq!(at("qwen2.5-32b", 2000), 1024);
        assert_eq!(at("qwen2.5-32b", 3000), 4096);
        assert_eq!(at("qwen2.5-32b", 2560), 4096, "a tie takes the longer");
        assert_eq!(
            at("qwen2.5-7b", 4096),
            1024,
            "7B was measured at 1,024 only"
        );
        assert!(t.curve(Shape::new("qwen2.5-70b", 1, 1024)).is_err());
        assert!(t.curve(Shape::new("qwen2.5-32b", 4, 1024)).is_err());
    }

    #[test]
    fn the_committed_table_parses_and_has_every_shape_the_markdown_uses() {
        let t = committed();
        let measured = t.measured.clone().unwrap_or_default();
        assert!(
            measured.starts_with("2026-11-26") && measured.contains("H200"),
            "SOURCE names the date and machine the file records: {measured}"
        );
        for shape in SHAPES {
            let c = t.curve(shape).unwrap();
            assert_eq!(c.context, shape.context, "{shape:?} measured as asked");
            assert_eq!(c.largest_k(), 64);
        }
        assert_eq!(
            t.curves.len(),
            4 * 3 + 3,
            "4 models x 3 batches at 1,024, 32B at 4,096"
        );
    }

    #[test]
    fn the_scripts_bare_rows_parse_and_bad_tables_are_refused() {
        let row = |k: u32, steps: f64| {
            format!(
                r#"{{"model":"m","B":1,"K":{k},"L":512,"ms":{},"decode_steps":{steps}}}"#,
                2.0 * steps
            )
        };
        let bare = format!("[{},{}]", row(1, 1.0), row(4, 1.5));
        let t = Table::parse(&bare).unwrap();
        assert_eq!(t.measured, None);
        let c = t.curve(Shape::new("m", 1, 512)).unwrap();
        assert!(close(c.pass(2).steps, 1.0 + 0.5 / 3.0));
        assert_eq!(c.step_ms, 2.0);
        assert!(
            Table::parse(&format!("[{}]", row(1, 1.0))).is_err(),
            "one K"
        );
        assert!(
            Table::parse(&format!("[{},{}]", row(2, 1.0), row(4, 1.5))).is_err(),
            "no K = 1"
        );
        let twice = format!("[{},{},{}]", row(1, 1.0), row(4, 1.5), row(4, 1.6));
        assert!(Table::parse(&twice).is_err(), "a K twice");
    }

    #[test]
    fn the_markdown_names_its_source_in_every_heading_and_counts_extrapolated_calls() {
        let t = committed();
        let run = Run {
            label: "spans, HumanEval".into(),
            approxy: vec![
                ProjectedCall::passthrough(150, 10),
                ProjectedCall {
                    cached: 160,
                    prefilled: 16,
                    generated: 1,
                },
            ],
            passthrough: vec![ProjectedCall::passthrough(150, 100)],
        };
        let md = markdown(&t, &SHAPES, &[run]).unwrap();
        let headings: Vec<&str> = md.lines().filter(|l| l.starts_with('#')).collect();
        assert_eq!(headings.len(), 2);
        assert!(headings.iter().all(|h| h.contains(SOURCE)), "{md}");
        assert!(md.contains("not a measurement"), "{md}");
        assert_eq!(md.matches("(table's)").count(), SHAPES.len(), "{md}");
        assert!(md.contains("qwen2.5-32b, B 1, L 4096 (table's)"), "{md}");
        assert!(md.contains("approxy 1 of 2, passthrough 1 of 1"), "{md}");
        assert!(md.contains("reached 176 tokens"), "{md}");
    }
}
