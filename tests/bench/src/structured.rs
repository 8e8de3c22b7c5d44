//! `approxy bench structured`: structured output on the hand-written sample in
//! `tests/bench/structured/` (extraction and classification under JSON Schemas, JSON mode,
//! tool calls), through the shipped policy and through target-only (llama-server constraining
//! its own answer to the same `response_format`, or parsing its own tool calls), one
//! llama-server, cores pinned. Every prompt is also answered by the target under approxy's
//! grammar (threshold 1: the target writes every token the grammar leaves free): for tool
//! prompts the target's own rate with the same rendering, and for schema prompts what the
//! grammar's layout alone changes against target-only. Per answer: valid JSON, valid for its schema (the
//! `jsonschema` crate, not the grammar engine that wrote it), the right tools called with
//! valid arguments, fields that agree with target-only's, and who wrote the tokens (the
//! grammar, the draft, the target). Then what compiling a schema costs: each of the sample's
//! schemas and synthetic ones of 10 to 50 properties, compiled afresh and from the cache
//! against the draft's vocabulary.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use approxy_gateway::policy::Policy;
use approxy_setup::Home;
use approxy_verifier::Tokenizer;
use approxy_verifier::grammar::{GrammarSpec, Grammars, JsonStyle};

use super::calls::{self, CallConfig};
use super::servers::{self, Layout};
use super::stats::quantile;

/// Options for `approxy bench structured`.
#[derive(Debug, Clone, clap::Args)]
pub struct StructuredOptions {
    /// The sample (one JSON object a line: id, kind, messages, response_format).
    #[arg(long, default_value = "tests/bench/structured/prompts.jsonl")]
    pub sample: PathBuf,
    /// Prompts (0: all).
    #[arg(long, default_value_t = 0)]
    pub prompts: usize,
    /// Output limit per answer.
    #[arg(long, default_value_t = 300)]
    pub max_tokens: u32,
    /// Results directory.
    #[arg(long, default_value = "tests/bench/results/structured")]
    pub out: PathBuf,
    /// Policy whose "*" model is approxy's configuration.
    #[arg(long, default_value = "policies/default.toml")]
    pub base_policy: PathBuf,
    /// An earlier run's `structured.json` whose target-only answers are taken instead of asked
    /// again: for comparing approxy's configurations against the same answers, on the machine
    /// that wrote them. The target under approxy's grammar is approxy's own decoding, so it is
    /// always asked; so is target-only a second time, where it then measures how far
    /// target-only moves between runs.
    #[arg(long)]
    pub reuse_target: Option<PathBuf>,
}

/// One prompt of the sample.
#[derive(Debug, Clone, Deserialize)]
struct Prompt {
    id: String,
    kind: String,
    messages: Value,
    #[serde(default)]
    response_format: Value,
    /// Tool prompts: the tools, `tool_choice`, `parallel_tool_calls`, and the tools the right
    /// answer calls (empty: text).
    #[serde(default)]
    tools: Value,
    #[serde(default)]
    tool_choice: Value,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    expected_tools: Option<Vec<String>>,
}

impl Prompt {
    /// The schema an answer is checked against (`{"type": "object"}` for JSON mode).
    fn schema(&self) -> Value {
        self.response_format
            .pointer("/json_schema/schema")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}))
    }

    fn is_tools(&self) -> bool {
        self.expected_tools.is_some()
    }

    /// A tool's parameters' schema, by name.
    fn tool_schema(&self, name: &str) -> Option<Value> {
        self.tools.as_array()?.iter().find_map(|t| {
            (t.pointer("/function/name")?.as_str()? == name)
                .then(|| t.pointer("/function/parameters").cloned())
                .flatten()
        })
    }

    /// Whether a call is asked for whatever the model thinks (`required` or a named tool).
    fn call_required(&self) -> bool {
        self.tool_choice.is_object() || self.tool_choice == "required"
    }
}

/// One answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Answer {
    content: String,
    finish_reason: String,
    mode: String,
    passthrough_reason: Option<String>,
    completion_tokens: u64,
    forced_tokens: u64,
    draft_tokens: u64,
    target_tokens: u64,
    target_calls: u64,
    grammar_refusals: u64,
    /// Positions the target wrote in a call of one token kept to what the grammar allowed.
    #[serde(default)]
    grammar_picks: u64,
    seconds: f64,
    /// Parses as JSON.
    json: bool,
    /// Valid for the prompt's schema; tool prompts: every call names a tool and its arguments
    /// are valid for that tool's schema, and a call came where one was required.
    valid: bool,
    /// Tool prompts: the calls, as `{"name", "arguments"}` with the arguments parsed.
    #[serde(default)]
    calls: Vec<Value>,
    /// Tool prompts: the expected tools called (as a multiset), with valid arguments.
    #[serde(default)]
    right_tools: Option<bool>,
}

/// One prompt's answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Row {
    id: String,
    kind: String,
    target_only: Answer,
    approxy: Answer,
    /// The target writing every free token under approxy's grammar (threshold 1).
    #[serde(default)]
    target_grammar: Option<Answer>,
    /// Of target-only's leaf fields (tool prompts: the target's calls under the grammar), the
    /// share approxy's answer has with the same value.
    field_agreement: Option<f64>,
    /// Of the leaf fields of the target's answer under approxy's grammar, the share approxy's
    /// answer has: what the verifier loses, with the layout the same.
    #[serde(default)]
    grammar_agreement: Option<f64>,
    /// Schema prompts: of target-only's leaf fields, the share the target's own answer under
    /// approxy's grammar has: what the grammar's layout alone loses.
    #[serde(default)]
    layout_agreement: Option<f64>,
    /// Schema prompts: target-only asked again, after the other answers (the server's cache
    /// and slots then hold other work, as a busy server's do).
    #[serde(default)]
    target_only_again: Option<Answer>,
    /// Of target-only's leaf fields, the share its second answer has: how far the reference
    /// itself moves at temperature 0, so how close any answer can be expected to come.
    #[serde(default)]
    repeat_agreement: Option<f64>,
}

/// Compile times, milliseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CompileTimes {
    /// Building the compiler for the draft's vocabulary (once per process).
    vocabulary_ms: f64,
    /// Each of the sample's schemas, first time (p50, p99, max).
    sample_ms: [f64; 3],
    /// Synthetic schemas of this many string properties, first time: (properties, ms).
    by_properties: Vec<(usize, f64)>,
    /// The same schema again, from the cache (p99 over the sample).
    cached_p99_ms: f64,
}

/// The whole result.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Report {
    finished_at: String,
    machine: String,
    policy: String,
    /// The earlier run whose target answers were taken, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reused_target: Option<String>,
    rows: Vec<Row>,
    compile: CompileTimes,
}

/// Leaf values of a JSON value by path (`/people/0/name`).
fn leaves(v: &Value, path: String, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) => m
            .iter()
            .for_each(|(k, x)| leaves(x, format!("{path}/{k}"), out)),
        Value::Array(a) if !a.is_empty() => a
            .iter()
            .enumerate()
            .for_each(|(i, x)| leaves(x, format!("{path}/{i}"), out)),
        _ => {
            out.insert(path, v.clone());
        }
    }
}

/// Of `reference`'s leaf fields, the share `other` has with the same value; `None` when either
/// is not JSON or the reference has no fields.
fn agreement(reference: &str, other: &str) -> Option<f64> {
    let (a, b): (Value, Value) = (
        serde_json::from_str(reference).ok()?,
        serde_json::from_str(other).ok()?,
    );
    let (mut la, mut lb) = (BTreeMap::new(), BTreeMap::new());
    leaves(&a, String::new(), &mut la);
    leaves(&b, String::new(), &mut lb);
    (!la.is_empty())
        .then(|| la.iter().filter(|(k, v)| lb.get(*k) == Some(v)).count() as f64 / la.len() as f64)
}

/// The chat request for prompt `p`, greedy, with whichever of the structured-output fields
/// (response format, tools, tool choice, parallel calls) the prompt sets.
fn request_body(p: &Prompt, model: &str, max_tokens: u32) -> Value {
    let mut body = json!({
        "model": model,
        "messages": p.messages,
        "max_tokens": max_tokens,
        "temperature": 0,
    });
    for (k, v) in [
        ("response_format", &p.response_format),
        ("tools", &p.tools),
        ("tool_choice", &p.tool_choice),
    ] {
        if !v.is_null() {
            body[k] = v.clone();
        }
    }
    if let Some(parallel) = p.parallel_tool_calls {
        body["parallel_tool_calls"] = json!(parallel);
    }
    body
}

/// Asks the gateway for one answer as `model`, at `threshold` when given.
async fn ask(
    http: &reqwest::Client,
    url: &str,
    model: &str,
    p: &Prompt,
    max_tokens: u32,
    threshold: Option<f32>,
) -> anyhow::Result<Answer> {
    let body = request_body(p, model, max_tokens);
    let t = Instant::now();
    let mut req = http.post(format!("{url}/v1/chat/completions")).json(&body);
    if let Some(th) = threshold {
        req = req.header("x-approxy-threshold", th.to_string());
    }
    let resp = req.send().await?;
    let header = |k: &str| {
        resp.headers()
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (mode, reason) = (
        header("x-approxy-mode").unwrap_or_default(),
        header("x-approxy-passthrough-reason"),
    );
    let status = resp.status();
    let v: Value = resp.json().await?;
    anyhow::ensure!(status.is_success(), "{} on {}: {v}", status, p.id);
    let seconds = t.elapsed().as_secs_f64();
    let choice = &v["choices"][0];
    let content = choice["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let u = &v["usage"];
    let a = &u["approxy"];
    let n = |x: &Value| x.as_u64().unwrap_or(0);
    let parsed: Option<Value> = serde_json::from_str(&content).ok();
    let (calls, valid, right_tools) = if p.is_tools() {
        tool_answer(p, &choice["message"])
    } else {
        let valid = parsed
            .as_ref()
            .is_some_and(|x| jsonschema::is_valid(&p.schema(), x));
        (Vec::new(), valid, None)
    };
    Ok(Answer {
        calls,
        right_tools,
        finish_reason: choice["finish_reason"].as_str().unwrap_or_default().into(),
        mode,
        passthrough_reason: reason,
        completion_tokens: n(&u["completion_tokens"]),
        forced_tokens: n(&a["forced_tokens"]),
        draft_tokens: n(&a["draft_tokens"]),
        target_tokens: n(&a["target_tokens"]),
        target_calls: n(&a["target_calls"]),
        grammar_refusals: n(&a["grammar_refusals"]),
        grammar_picks: n(&a["grammar_picks"]),
        seconds,
        json: parsed.is_some(),
        valid,
        content,
    })
}

/// A tool prompt's answer: its calls (arguments parsed), whether they are valid (each names a
/// tool and its arguments are valid for it; one came where one was required), and whether the
/// expected tools were called with valid arguments.
fn tool_answer(p: &Prompt, message: &Value) -> (Vec<Value>, bool, Option<bool>) {
    let raw = message["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut valid = !(raw.is_empty() && p.call_required());
    let mut calls = Vec::new();
    for c in &raw {
        let name = c
            .pointer("/function/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let args: Option<Value> = c
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .and_then(|a| serde_json::from_str(a).ok());
        let ok = match (p.tool_schema(name), &args) {
            (Some(schema), Some(a)) => jsonschema::is_valid(&schema, a),
            _ => false,
        };
        valid &= ok;
        calls.push(json!({"name": name, "arguments": args.unwrap_or(Value::Null)}));
    }
    let mut called: Vec<&str> = calls.iter().filter_map(|c| c["name"].as_str()).collect();
    called.sort_unstable();
    let mut expected: Vec<&str> = p
        .expected_tools
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    expected.sort_unstable();
    let right = valid && called == expected;
    (calls, valid, Some(right))
}

/// Of the reference answer's leaf fields (its JSON, or its calls), the share the other has.
fn row_agreement(reference: &Answer, other: &Answer) -> Option<f64> {
    if !reference.valid {
        return None;
    }
    if reference.calls.is_empty() {
        return agreement(&reference.content, &other.content);
    }
    agreement(
        &Value::Array(reference.calls.clone()).to_string(),
        &Value::Array(other.calls.clone()).to_string(),
    )
}

/// A schema of `n` required string properties.
fn wide_schema(n: usize) -> Value {
    let props: Map<String, Value> = (0..n)
        .map(|i| (format!("field_{i}"), json!({"type": "string"})))
        .collect();
    let required: Vec<String> = props.keys().cloned().collect();
    json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Compile times against the draft's vocabulary: a new compiler for every schema, so each is
/// compiled afresh.
fn compile_times(
    home: &Home,
    prompts: &[Prompt],
    style: JsonStyle,
) -> anyhow::Result<CompileTimes> {
    let tok = Tokenizer::from_file(&home.draft_onnx_dir().join("tokenizer.json"))?;
    let meta = approxy_verifier::DraftMeta::load(&home.draft_onnx_dir())?;
    let eos = tok.end_of_sequence_ids();
    let t = Instant::now();
    let grammars = Grammars::new(&tok, meta.vocab_size, &eos)?;
    let vocabulary_ms = ms(t.elapsed());
    let spec = |p: &Prompt| match p.response_format["type"].as_str() {
        Some("json_object") => GrammarSpec::JsonObject,
        _ => GrammarSpec::JsonSchema(p.schema()),
    };
    let (mut first, mut again) = (Vec::new(), Vec::new());
    for p in prompts.iter().filter(|p| !p.is_tools()) {
        let fresh = Grammars::new(&tok, meta.vocab_size, &eos)?;
        let t = Instant::now();
        fresh
            .constraint(&spec(p), style)
            .map_err(|e| anyhow::anyhow!("{}: {e}", p.id))?;
        first.push(ms(t.elapsed()));
        let t = Instant::now();
        let _ = fresh.constraint(&spec(p), style);
        again.push(ms(t.elapsed()));
    }
    let mut by_properties = Vec::new();
    for n in [10, 25, 50] {
        let t = Instant::now();
        grammars
            .constraint(&GrammarSpec::JsonSchema(wide_schema(n)), style)
            .map_err(|e| anyhow::anyhow!("{n} properties: {e}"))?;
        by_properties.push((n, ms(t.elapsed())));
    }
    let q = |xs: &[f64], p: f64| quantile(xs, p).unwrap_or(0.0);
    Ok(CompileTimes {
        vocabulary_ms,
        sample_ms: [q(&first, 0.5), q(&first, 0.99), q(&first, 1.0)],
        by_properties,
        cached_p99_ms: q(&again, 0.99),
    })
}

/// Runs the benchmark: answers, then compile times; writes `structured.json` and
/// `structured.md` under `--out`.
pub async fn run(opts: &StructuredOptions) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let text = std::fs::read_to_string(&opts.sample)
        .with_context(|| format!("reading {}", opts.sample.display()))?;
    let mut prompts: Vec<Prompt> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    if opts.prompts > 0 {
        prompts.truncate(opts.prompts);
    }
    let base = Policy::load(&opts.base_policy)?;
    let base_model = base
        .models
        .get("*")
        .ok_or_else(|| anyhow::anyhow!("the base policy has no \"*\" model"))?;
    let layout = Layout::Pinned;
    let logs = home.log("bench-structured").with_extension("d");
    std::fs::create_dir_all(&logs)?;
    std::fs::create_dir_all(home.work("bench"))?;
    let target = servers::start_llama(&home, layout, false, &logs).await?;
    let configs = [CallConfig::TargetOnly, CallConfig::Default];
    let mut policy = calls::raw_policy(&target.url, false, layout, base_model, &configs);
    // Threshold 1 on request: the target under approxy's grammar, for tool prompts.
    if let Some(m) = policy
        .models
        .get_mut(calls::model_name(CallConfig::Default))
    {
        m.threshold_override = Some([0.0, 1.0]);
    }
    let path = home.work("bench").join("structured.toml");
    std::fs::write(
        &path,
        format!(
            "# Written by `approxy bench structured`.\n{}",
            toml::to_string(&policy)?
        ),
    )?;
    let exe = std::env::current_exe()?;
    let gateway = servers::start_gateway(&exe, &path, layout, &logs).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(900))
        .build()?;
    let reused = reused_rows(opts.reuse_target.as_deref())?;
    let mut rows = Vec::new();
    for p in &prompts {
        rows.push(answer(&http, &gateway.url, p, opts.max_tokens, reused.get(&p.id)).await?);
    }
    drop(gateway);
    drop(target);
    let style = JsonStyle {
        layout: base_model.json_layout,
        fence: base_model.json_fence,
    };
    let compile = compile_times(&home, &prompts, style)?;
    let report = Report {
        finished_at: super::machine::utc_now(),
        machine: super::machine::Machine::read().line(),
        policy: opts.base_policy.display().to_string(),
        reused_target: opts.reuse_target.as_ref().map(|p| p.display().to_string()),
        rows,
        compile,
    };
    std::fs::create_dir_all(&opts.out)?;
    std::fs::write(
        opts.out.join("structured.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let md = markdown(&report);
    std::fs::write(opts.out.join("structured.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// An earlier run's rows by prompt id (none without a path).
fn reused_rows(path: Option<&std::path::Path>) -> anyhow::Result<HashMap<String, Row>> {
    let Some(path) = path else {
        return Ok(HashMap::new());
    };
    let earlier: Report = serde_json::from_slice(
        &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    )?;
    Ok(earlier
        .rows
        .into_iter()
        .map(|r| (r.id.clone(), r))
        .collect())
}

/// One prompt's row: target-only (taken from `earlier` where given), approxy, the target under
/// approxy's grammar and target-only again, and how their fields agree.
async fn answer(
    http: &reqwest::Client,
    url: &str,
    p: &Prompt,
    max_tokens: u32,
    earlier: Option<&Row>,
) -> anyhow::Result<Row> {
    let (target_only, approxy) = (
        calls::model_name(CallConfig::TargetOnly),
        calls::model_name(CallConfig::Default),
    );
    let t = match earlier {
        Some(r) => r.target_only.clone(),
        None => ask(http, url, target_only, p, max_tokens, None).await?,
    };
    let a = ask(http, url, approxy, p, max_tokens, None).await?;
    let g = ask(http, url, approxy, p, max_tokens, Some(1.0)).await?;
    let again = if p.is_tools() {
        None
    } else {
        Some(ask(http, url, target_only, p, max_tokens, None).await?)
    };
    // Tool prompts are compared with the target's own calls under the same rendering:
    // llama-server's tool calling writes its calls its own way (or as text).
    let field_agreement = row_agreement(if p.is_tools() { &g } else { &t }, &a);
    let grammar_agreement = row_agreement(&g, &a);
    let layout_agreement = (!p.is_tools()).then(|| row_agreement(&t, &g)).flatten();
    let repeat_agreement = again.as_ref().and_then(|x| row_agreement(&t, x));
    eprintln!(
        "{}: target-only valid {}, approxy {} valid {} (forced {}, draft {}, target {} of {}), fields {:?}",
        p.id,
        t.valid,
        a.mode,
        a.valid,
        a.forced_tokens,
        a.draft_tokens,
        a.target_tokens,
        a.completion_tokens,
        field_agreement
    );
    Ok(Row {
        id: p.id.clone(),
        kind: p.kind.clone(),
        target_only: t,
        approxy: a,
        target_grammar: Some(g),
        field_agreement,
        grammar_agreement,
        layout_agreement,
        target_only_again: again,
        repeat_agreement,
    })
}

/// Share as "12/40 (30 %)".
fn share(k: usize, n: usize) -> String {
    format!("{k}/{n} ({:.0} %)", 100.0 * k as f64 / n.max(1) as f64)
}

/// The results as a Markdown section.
fn markdown(r: &Report) -> String {
    let mut s = format!(
        "{} prompts of `tests/bench/structured/` (extraction and classification under JSON Schemas, JSON mode, tool calls), \
         `{}` against target-only (llama-server constraining its own answer, or calling tools its own way), temperature 0, cores pinned; {}, finished {}. \
         Fields agreeing: of target-only's leaf fields, the share approxy's answer has with the same value; on tool prompts, of the calls the target writes under approxy's grammar (threshold 1), their names and arguments. \
         The next two columns split the difference: approxy against the target writing every free token under approxy's grammar (the same layout, so what the verifier loses), and that answer of the target's against target-only (what the grammar's layout, the policy's `json_layout`, loses with no draft at all). \
         The column after them is target-only asked the same again, after the other answers: how far the reference itself moves at temperature 0.\n\n",
        r.rows.len(),
        r.policy,
        r.machine,
        r.finished_at
    );
    if let Some(earlier) = &r.reused_target {
        s.push_str(&format!(
            "Target-only's answers taken from the earlier run `{earlier}`; the second target-only answer, asked in this run, therefore says how far target-only moves between runs.\n\n"
        ));
    }
    s.push_str("| kind | prompts | valid: target-only | valid: approxy | approximate | fields agreeing | approxy vs target under its grammar | target under the grammar vs target-only | target-only again vs target-only | forced | draft (free) | target |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for kind in table_kinds(r) {
        s.push_str(&kind_row(r, kind));
    }
    s.push_str(&tool_table(r));
    s.push_str(&time_and_compile(r));
    s
}

/// Whether a row is a tool prompt's.
fn is_tool(x: &Row) -> bool {
    x.kind.starts_with("tool")
}

/// The table's rows: each schema kind, then all of them, and where there are tool prompts each
/// tool kind, all tool prompts, and everything.
fn table_kinds(r: &Report) -> Vec<&str> {
    let mut kinds: Vec<&str> = r
        .rows
        .iter()
        .filter(|x| !is_tool(x))
        .map(|x| x.kind.as_str())
        .collect();
    kinds.dedup();
    kinds.push("schemas and JSON mode");
    let mut tool_kinds: Vec<&str> = r
        .rows
        .iter()
        .filter(|x| is_tool(x))
        .map(|x| x.kind.as_str())
        .collect();
    tool_kinds.dedup();
    if !tool_kinds.is_empty() {
        kinds.extend(tool_kinds.iter().copied());
        kinds.push("tools");
        kinds.push("all");
    }
    kinds
}

/// The table's row for `kind` (one of [`table_kinds`]).
fn kind_row(r: &Report, kind: &str) -> String {
    let rows: Vec<&Row> = r
        .rows
        .iter()
        .filter(|x| match kind {
            "all" => true,
            "schemas and JSON mode" => !is_tool(x),
            "tools" => is_tool(x),
            k => x.kind == k,
        })
        .collect();
    let n = rows.len();
    let mean = |f: fn(&Row) -> Option<f64>| {
        let v: Vec<f64> = rows.iter().filter_map(|x| f(x)).collect();
        if v.is_empty() {
            "n/a".to_string()
        } else {
            format!(
                "{:.1} % (of {} answers)",
                100.0 * v.iter().sum::<f64>() / v.len() as f64,
                v.len()
            )
        }
    };
    let sum = |f: fn(&Answer) -> u64| rows.iter().map(|x| f(&x.approxy)).sum::<u64>();
    let total = sum(|a| a.completion_tokens).max(1) as f64;
    let forced = sum(|a| a.forced_tokens) as f64;
    let draft = sum(|a| a.draft_tokens) as f64 - forced;
    let target = sum(|a| a.target_tokens) as f64;
    format!(
        "| {kind} | {n} | {} | {} | {} | {} | {} | {} | {} | {:.0} % | {:.0} % | {:.0} % |\n",
        share(rows.iter().filter(|x| x.target_only.valid).count(), n),
        share(rows.iter().filter(|x| x.approxy.valid).count(), n),
        share(
            rows.iter()
                .filter(|x| x.approxy.mode == "approximate")
                .count(),
            n
        ),
        mean(|x| x.field_agreement),
        mean(|x| x.grammar_agreement),
        mean(|x| x.layout_agreement),
        mean(|x| x.repeat_agreement),
        100.0 * forced / total,
        100.0 * draft / total,
        100.0 * target / total,
    )
}

/// Wall times, target calls and cut answers over every prompt, and the schema compiler's times.
fn time_and_compile(r: &Report) -> String {
    let mut s = String::new();
    let secs = |f: fn(&Row) -> f64| r.rows.iter().map(f).sum::<f64>();
    let calls = |f: fn(&Answer) -> u64| r.rows.iter().map(|x| f(&x.approxy)).sum::<u64>();
    s.push_str(&format!(
        "\nWall time for all answers: target-only {:.0} s, approxy {:.0} s. approxy's target calls: {}, {} of them picks (one token, kept to the few the grammar allowed). Answers cut by the token limit (not valid by construction): target-only {}, approxy {}.\n",
        secs(|x| x.target_only.seconds),
        secs(|x| x.approxy.seconds),
        calls(|a| a.target_calls),
        calls(|a| a.grammar_picks),
        r.rows.iter().filter(|x| x.target_only.finish_reason == "length").count(),
        r.rows.iter().filter(|x| x.approxy.finish_reason == "length").count(),
    ));
    let c = &r.compile;
    s.push_str(&format!(
        "\nCompiling a schema against the draft's vocabulary (llguidance): the sample's schemas p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {}; again from the cache p99 {:.2} ms. The compiler itself, once per process: {:.0} ms.\n",
        c.sample_ms[0],
        c.sample_ms[1],
        c.sample_ms[2],
        c.by_properties
            .iter()
            .map(|(n, t)| format!("{n} string properties {t:.1} ms"))
            .collect::<Vec<_>>()
            .join(", "),
        c.cached_p99_ms,
        c.vocabulary_ms,
    ));
    s
}

/// The tool prompts: the right tools called with valid arguments, by each of target-only
/// (llama-server's own tool calling), the target under approxy's grammar and approxy.
fn tool_table(r: &Report) -> String {
    let rows: Vec<&Row> = r
        .rows
        .iter()
        .filter(|x| x.kind.starts_with("tool"))
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\nTool prompts: the expected tools called, with arguments valid for their schemas (text where no tool applies); valid: every call names a tool with valid arguments, and one came where `tool_choice` required it.\n\n\
         | kind | prompts | right: target-only (llama-server) | right: target under approxy's grammar | right: approxy | valid: target-only | valid: target under grammar | valid: approxy |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut kinds: Vec<&str> = rows.iter().map(|x| x.kind.as_str()).collect();
    kinds.dedup();
    kinds.push("all");
    for kind in kinds {
        let rs: Vec<&&Row> = rows
            .iter()
            .filter(|x| kind == "all" || x.kind == kind)
            .collect();
        let n = rs.len();
        let count = |f: &dyn Fn(&Row) -> bool| rs.iter().filter(|x| f(x)).count();
        let right = |a: Option<&Answer>| a.and_then(|a| a.right_tools).unwrap_or(false);
        s.push_str(&format!(
            "| {kind} | {n} | {} | {} | {} | {} | {} | {} |\n",
            share(count(&|x| right(Some(&x.target_only))), n),
            share(count(&|x| right(x.target_grammar.as_ref())), n),
            share(count(&|x| right(Some(&x.approxy))), n),
            share(count(&|x| x.target_only.valid), n),
            share(
                count(&|x| x.target_grammar.as_ref().is_some_and(|a| a.valid)),
                n
            ),
            share(count(&|x| x.approxy.valid), n),
        ));
    }
    s
}

/// The saved section, for the README's results.
pub fn load_markdown(dir: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(dir.join("structured.md")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_counts_the_references_leaf_fields() {
        let t = r#"{"name": "Alice", "tags": ["a", "b"], "n": {"x": 1}}"#;
        assert_eq!(agreement(t, t), Some(1.0));
        let a = r#"{"name": "Alice", "tags": ["a", "c"], "n": {"x": 2}, "extra": 1}"#;
        assert_eq!(agreement(t, a), Some(0.5));
        assert_eq!(agreement(t, "not json"), None);
    }
}
