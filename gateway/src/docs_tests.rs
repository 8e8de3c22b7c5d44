//! Docs that cannot drift, checked against the code on every test run: the committed JSON
//! Schema of policy files is the one the policy types make; every policy key the parser
//! accepts is in the policy reference and every key it names is accepted; every metric the
//! gateway and the engine emit is described and in the gateway reference, and so is every
//! error code; every target kind has its row in the policy reference; every relative link and
//! anchor between the Markdown references resolves; the gateway reference's source layout lists
//! every source file of every crate, and no file that is gone. Each
//! checker is also tried on a text that breaks it, so none passes by finding nothing.

// Tests fail by panicking.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

/// The Markdown files whose links are checked.
const DOCS: [&str; 7] = [
    "README.md",
    "ARCHITECTURE.md",
    "policies/README.md",
    "gateway/README.md",
    "deploy/README.md",
    "training/README.md",
    "tests/README.md",
];

// Shared with the house test, so both read the crates the workspace manifest names.
#[path = "../tests/support/workspace.rs"]
mod workspace;

use workspace::root;

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The text in backticks (inline code spans) of a Markdown text.
fn code_spans(md: &str) -> BTreeSet<String> {
    md.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Every key path a schema allows: `target.timeout`, `models.<id>.correction.max_span` (a map's
/// key is `<id>`). A value with alternative forms (a number or a per-kind table) is one key.
fn key_paths(schema: &Value) -> BTreeSet<String> {
    fn walk(root: &Value, node: &Value, prefix: &str, out: &mut BTreeSet<String>) {
        let node = match node["$ref"].as_str() {
            Some(r) => &root["$defs"][r.trim_start_matches("#/$defs/")],
            None => node,
        };
        for alternatives in ["anyOf", "oneOf"] {
            if let Some(branches) = node[alternatives].as_array() {
                // `Option<T>`: T's keys. A choice of forms (`price = "busy"` or a table): the
                // keys of the forms that are tables.
                for b in branches.iter().filter(|b| b["type"] != "null") {
                    walk(root, b, prefix, out);
                }
                return;
            }
        }
        let join = |k: &str| {
            if prefix.is_empty() {
                k.to_string()
            } else {
                format!("{prefix}.{k}")
            }
        };
        if let Some(props) = node["properties"].as_object() {
            for (k, v) in props {
                let path = join(k);
                out.insert(path.clone());
                walk(root, v, &path, out);
            }
        }
        if node["additionalProperties"].is_object() {
            let path = join("<id>");
            out.insert(path.clone());
            walk(root, &node["additionalProperties"], &path, out);
        }
    }
    let mut out = BTreeSet::new();
    walk(schema, schema, "", &mut out);
    out
}

/// The keys that hold a value, not a table (the reference names tables by their keys).
fn leaf_keys(keys: &BTreeSet<String>) -> BTreeSet<String> {
    keys.iter()
        .filter(|k| !keys.iter().any(|o| o.starts_with(&format!("{k}."))))
        .cloned()
        .collect()
}

/// Keys the reference does not name in backticks.
fn undocumented<'a>(keys: &'a BTreeSet<String>, md: &str) -> Vec<&'a str> {
    let spans = code_spans(md);
    keys.iter()
        .filter(|k| !spans.contains(*k))
        .map(String::as_str)
        .collect()
}

/// Dotted paths in backticks, under a policy table, that the parser does not accept.
fn unknown_keys(keys: &BTreeSet<String>, md: &str) -> Vec<String> {
    let tables = [
        "target.",
        "gateway.",
        "draft.",
        "passthrough.",
        "models.<id>.",
    ];
    code_spans(md)
        .into_iter()
        .filter(|s| tables.iter().any(|t| s.starts_with(t)))
        .filter(|s| {
            s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._<>".contains(c))
        })
        .filter(|s| !keys.contains(s))
        .collect()
}

/// Metric names in the sources: `(emitted, described)`. Emitted means a `metrics::` macro call
/// with a literal name; described, a `describe_` one.
fn metric_names(sources: &[String]) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut emitted, mut described) = (BTreeSet::new(), BTreeSet::new());
    for text in sources {
        for kind in ["counter!(", "gauge!(", "histogram!("] {
            for (i, _) in text.match_indices(kind) {
                let before = &text[..i];
                let set = if before.ends_with("describe_") {
                    &mut described
                } else if before.ends_with("metrics::") {
                    &mut emitted
                } else {
                    continue;
                };
                let rest = text[i + kind.len()..].trim_start();
                if let Some(name) = rest.strip_prefix('"').and_then(|r| r.split('"').next()) {
                    set.insert(name.to_string());
                }
            }
        }
    }
    (emitted, described)
}

/// The Rust sources of the gateway and the engine.
fn sources() -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root().join("gateway/src"), root().join("verifier/src")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    assert!(out.len() > 20, "sources not found");
    out
}

/// The error codes `ApiError` answers with (`Some("code")` in its `parts`).
fn error_codes(error_rs: &str) -> BTreeSet<String> {
    let parts = error_rs
        .split_once("fn parts(")
        .map(|(_, p)| p)
        .and_then(|p| p.split_once("\n    }\n"))
        .map(|(p, _)| p)
        .unwrap_or_default();
    parts
        .split("Some(\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .map(str::to_string)
        .collect()
}

/// The lines of a Markdown text outside its fenced code blocks.
fn prose_lines(md: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    md.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// GitHub's anchor for each heading of a Markdown text, outside code blocks (lower case;
/// letters, digits, `-` and `_` kept, spaces made `-`; a repeated one gets `-1`, `-2`, ...).
fn anchors(md: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in prose_lines(md) {
        let Some(text) = line.strip_prefix('#') else {
            continue;
        };
        if !(text.starts_with('#') || text.starts_with(' ')) {
            continue;
        }
        let slug: String = text
            .trim_start_matches('#')
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut candidate = slug.clone();
        let mut n = 0;
        while out.contains(&candidate) {
            n += 1;
            candidate = format!("{slug}-{n}");
        }
        out.insert(candidate);
    }
    out
}

/// Relative link targets in a Markdown text, outside code blocks and code spans.
fn links(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose_lines(md) {
        // Code spans are the odd pieces between backticks.
        for (i, piece) in line.split('`').enumerate() {
            if i % 2 == 1 {
                continue;
            }
            for (_, after) in piece
                .match_indices("](")
                .map(|(j, _)| piece.split_at(j + 2))
            {
                let target = after.split(')').next().unwrap_or_default().trim();
                let target = target.split_whitespace().next().unwrap_or_default();
                let external = ["http://", "https://", "mailto:"]
                    .iter()
                    .any(|s| target.starts_with(s));
                if !target.is_empty() && !external {
                    out.push(target.to_string());
                }
            }
        }
    }
    out
}

/// How the link checker sees files: their text, and whether they exist.
struct Files<'a> {
    read: &'a dyn Fn(&Path) -> Option<String>,
    exists: &'a dyn Fn(&Path) -> bool,
}

/// The links of `doc` (a path from the root) that do not resolve, with why.
fn broken_links(doc: &str, files: &Files<'_>) -> Vec<String> {
    let read = files.read;
    let Some(md) = read(&root().join(doc)) else {
        return vec![format!("{doc} is missing")];
    };
    let dir = Path::new(doc).parent().unwrap_or(Path::new(""));
    let mut broken = Vec::new();
    for link in links(&md) {
        let (path, anchor) = link.split_once('#').unwrap_or((link.as_str(), ""));
        let file = if path.is_empty() {
            root().join(doc)
        } else {
            root().join(dir).join(path)
        };
        if !(files.exists)(&file) {
            broken.push(format!("{doc}: {link}: no such file"));
            continue;
        }
        if !anchor.is_empty() && file.extension().is_some_and(|x| x == "md") {
            let target = read(&file).unwrap_or_default();
            if !anchors(&target).contains(anchor) {
                broken.push(format!("{doc}: {link}: no such heading"));
            }
        }
    }
    broken
}

#[test]
fn the_committed_policy_schema_is_the_one_the_types_make() {
    let committed: Value = serde_json::from_str(&read(crate::policy::SCHEMA_PATH))
        .unwrap_or_else(|e| panic!("{}: {e}", crate::policy::SCHEMA_PATH));
    assert!(
        committed == crate::policy::json_schema(),
        "{} is stale: run `approxy schema > {}`",
        crate::policy::SCHEMA_PATH,
        crate::policy::SCHEMA_PATH
    );
}

#[test]
fn every_policy_key_is_in_the_policy_reference_and_only_those() {
    let keys = key_paths(&crate::policy::json_schema());
    for k in [
        "target.timeout",
        "target.cache.min_tokens",
        "gateway.max_body_bytes",
        "models.<id>.correction.max_span",
        "target.busy_prior.call_ms",
    ] {
        assert!(keys.contains(k), "{k} not among {keys:?}");
    }
    let md = read("policies/README.md");
    let leaves = leaf_keys(&keys);
    let missing = undocumented(&leaves, &md);
    assert!(missing.is_empty(), "policies/README.md lacks {missing:?}");
    let unknown = unknown_keys(&keys, &md);
    assert!(
        unknown.is_empty(),
        "policies/README.md names keys the parser refuses: {unknown:?}"
    );
}

#[test]
fn every_metric_is_described_and_in_the_gateway_reference() {
    let (emitted, described) = metric_names(&sources());
    assert!(emitted.len() > 20, "{emitted:?}");
    let undescribed: Vec<_> = emitted.difference(&described).collect();
    let stale: Vec<_> = described.difference(&emitted).collect();
    assert!(
        undescribed.is_empty(),
        "emitted without a description: {undescribed:?}"
    );
    assert!(stale.is_empty(), "described but never emitted: {stale:?}");
    let md = read("gateway/README.md");
    let missing = undocumented(&emitted, &md);
    assert!(
        missing.is_empty(),
        "gateway/README.md lacks the metrics {missing:?}"
    );
    // Names in the reference that nothing emits (series suffixes aside).
    let gone: Vec<String> = code_spans(&md)
        .into_iter()
        .filter(|s| {
            s.starts_with("approxy_") && s.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
        .filter(|s| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|x| s.strip_suffix(x))
                .unwrap_or(s);
            !emitted.contains(s) && !emitted.contains(base)
        })
        .collect();
    assert!(
        gone.is_empty(),
        "gateway/README.md names metrics nothing emits: {gone:?}"
    );
}

#[test]
fn every_error_code_is_in_the_gateway_reference() {
    let codes = error_codes(&read("gateway/src/error.rs"));
    assert!(
        codes.len() >= 10 && codes.contains("invalid_api_key"),
        "{codes:?}"
    );
    let missing = undocumented(&codes, &read("gateway/README.md"));
    assert!(
        missing.is_empty(),
        "gateway/README.md lacks the error codes {missing:?}"
    );
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let files = Files {
        read: &|p| std::fs::read_to_string(p).ok(),
        exists: &|p| p.exists(),
    };
    let broken: Vec<String> = DOCS.iter().flat_map(|d| broken_links(d, &files)).collect();
    assert!(broken.is_empty(), "{broken:#?}");
}

/// The kinds of the policy reference's table of target kinds that have no row there.
fn kinds_without_a_row<'a>(names: &[&'a str], md: &str) -> Vec<&'a str> {
    let table = md
        .split("### Target kinds")
        .nth(1)
        .and_then(|s| s.split("\n#").next())
        .unwrap_or("");
    names
        .iter()
        .copied()
        .filter(|k| !table.lines().any(|l| l.starts_with(&format!("| {k} |"))))
        .collect()
}

#[test]
fn every_target_kind_has_a_row_in_the_policy_reference() {
    let names = approxy_verifier::policy::TargetKind::NAMES;
    let md = read("policies/README.md");
    assert!(
        kinds_without_a_row(names, &md).is_empty(),
        "{:?}",
        kinds_without_a_row(names, &md)
    );
    // The check finds a missing row.
    let without = md.replace("| openai_chat |", "| a chat-only API |");
    assert_eq!(kinds_without_a_row(names, &without), ["openai_chat"]);
    // The schema's description of `target.kind` (the policy type's doc comment) names each.
    let schema: Value = serde_json::from_str(&read(crate::policy::SCHEMA_PATH)).unwrap();
    let said = code_spans(
        schema["$defs"]["RawTarget"]["properties"]["kind"]["description"]
            .as_str()
            .unwrap_or(""),
    );
    let unsaid: Vec<&&str> = names.iter().filter(|k| !said.contains(**k)).collect();
    assert!(
        unsaid.is_empty(),
        "the schema's target.kind leaves out {unsaid:?}"
    );
}

/// Each checker finds what it exists to find: an undocumented key, a key the parser refuses,
/// an undescribed metric, an undocumented error code, a broken link or anchor.
#[test]
fn the_checkers_catch_a_deliberate_omission() {
    let keys = leaf_keys(&key_paths(&crate::policy::json_schema()));
    assert!(!keys.contains("target.cache") && keys.contains("target.cache.key"));
    let all: String = keys.iter().map(|k| format!("| `{k}` |\n")).collect();
    assert!(undocumented(&keys, &all).is_empty());
    let without = all.replace("| `gateway.max_body_bytes` |\n", "");
    assert_eq!(undocumented(&keys, &without), ["gateway.max_body_bytes"]);
    assert_eq!(
        unknown_keys(&keys, &format!("{all}| `gateway.max_body_byte` |")),
        ["gateway.max_body_byte"]
    );
    let (emitted, described) = metric_names(&[
        "metrics::counter!(\"approxy_a_total\"); describe_counter!(\"approxy_b_total\", \"x\");"
            .to_string(),
    ]);
    assert_eq!(emitted.into_iter().collect::<Vec<_>>(), ["approxy_a_total"]);
    assert_eq!(
        described.into_iter().collect::<Vec<_>>(),
        ["approxy_b_total"]
    );
    let codes = error_codes(&read("gateway/src/error.rs"));
    let documented: String = codes.iter().map(|c| format!("`{c}` ")).collect();
    assert!(undocumented(&codes, &documented).is_empty());
    assert_eq!(
        undocumented(&codes, &documented.replace("`target_tls_error`", "")),
        ["target_tls_error"]
    );
    let md = "# A title\n## Two words\n[ok](#two-words) [bad](#three-words) `[code](#x)`\n\
              [gone](nowhere.md) [up](gateway/README.md#no-such-heading)\n```\n[fenced](#y)\n```\n";
    let is_readme = |p: &Path| p.file_name().is_some_and(|n| n == "README.md");
    let files = Files {
        read: &|p| is_readme(p).then(|| md.to_string()),
        exists: &is_readme,
    };
    let broken = broken_links("README.md", &files);
    assert_eq!(broken.len(), 3, "{broken:?}");
    assert!(broken[0].contains("#three-words") && broken[1].contains("nowhere.md"));
    assert!(broken[2].contains("no-such-heading"));
    assert_eq!(
        anchors("# Set-up, on any CPU\n## `approxy` set-up\n# Set-up, on any CPU\n"),
        ["approxy-set-up", "set-up-on-any-cpu", "set-up-on-any-cpu-1"]
            .into_iter()
            .map(str::to_string)
            .collect()
    );
}

/// The `.rs` files of the workspace's crates, as paths from the root.
fn source_files() -> BTreeSet<String> {
    let root = root();
    let mut files = Vec::new();
    for folder in workspace::source_folders() {
        workspace::rust_files(&root.join(folder), &mut files);
    }
    files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(&root).unwrap_or(f);
            rel.to_string_lossy().replace('\\', "/")
        })
        .collect()
}

/// The files the source layout names, as paths from the root. It is the fenced block of the
/// "Source layout" section: a line at the margin naming a source folder (`verifier/src/`)
/// opens it; below it a line indented two spaces a level names a file (`decode.rs`) or a
/// folder (`decode/`) of the level above. Deeper lines continue a description.
fn listed_files(md: &str) -> BTreeSet<String> {
    let section = md.split("\n## Source layout\n").nth(1).unwrap_or("");
    let mut out = BTreeSet::new();
    let mut fenced = false;
    // The open folder: the source folder, then the folders below it.
    let mut path: Vec<String> = Vec::new();
    let folders = workspace::source_folders();
    for line in section.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            if line.starts_with('#') {
                break;
            }
            continue;
        }
        let Some(word) = line.split_whitespace().next() else {
            continue;
        };
        let indent = line.len() - line.trim_start().len();
        if indent == 0 {
            path = folders
                .iter()
                .find(|f| word.strip_suffix('/') == Some(f.as_str()))
                .map(|f| vec![f.clone()])
                .unwrap_or_default();
            continue;
        }
        let depth = indent / 2;
        if path.is_empty() || indent % 2 == 1 || depth > path.len() {
            continue;
        }
        path.truncate(depth);
        if let Some(folder) = word.strip_suffix('/') {
            path.push(folder.to_string());
        } else if word.ends_with(".rs") {
            out.insert(format!("{}/{word}", path.join("/")));
        }
    }
    out
}

/// What the layout should say and does not: the files it lacks, and the files it lists that
/// are gone, as one message naming each (empty when the layout is exact).
fn layout_drift(listed: &BTreeSet<String>, present: &BTreeSet<String>) -> String {
    let missing: Vec<&String> = present.difference(listed).collect();
    let gone: Vec<&String> = listed.difference(present).collect();
    let mut out = String::new();
    if !missing.is_empty() {
        out += "add a line for each of these, under its folder, saying what it holds:\n";
        for f in missing {
            out += &format!("  {f}\n");
        }
    }
    if !gone.is_empty() {
        out += "remove the line of each of these, which no longer exist:\n";
        for f in gone {
            out += &format!("  {f}\n");
        }
    }
    out
}

#[test]
fn the_source_layout_lists_every_source_file_and_only_those() {
    let present = source_files();
    assert!(
        present.contains("verifier/src/decode/run.rs") && present.len() > 100,
        "{present:?}"
    );
    let listed = listed_files(&read("gateway/README.md"));
    let drift = layout_drift(&listed, &present);
    assert!(
        drift.is_empty(),
        "gateway/README.md, \"Source layout\", is out of date:\n{drift}"
    );
}

/// The layout checker finds a file the layout lacks and a listed file that is gone, reads
/// nested folders, and takes neither a description's words nor another folder for a file.
#[test]
fn the_layout_checker_catches_a_missing_and_a_gone_file() {
    let md = "# x\n## Source layout\n\ntext\n```\ngateway/src/     the library\n  \
              lib.rs         its modules\n  policy/        policies\n    mod.rs       \
              the policy\n                 kept.rs spans two lines\n  stack.rs       the \
              stack\ngateway/          not a source folder\n  other.rs\nverifier/src/\n  \
              decode/\n    repeats/\n      loop_tests.rs  tests\n    run.rs     a run\n```\n\
              ## Next\n```\nverifier/src/\n  late.rs\n```\n";
    let listed = listed_files(md);
    let want: BTreeSet<String> = [
        "gateway/src/lib.rs",
        "gateway/src/policy/mod.rs",
        "gateway/src/stack.rs",
        "verifier/src/decode/repeats/loop_tests.rs",
        "verifier/src/decode/run.rs",
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    assert_eq!(listed, want);
    assert_eq!(layout_drift(&want, &want), "");
    let mut present = want.clone();
    present.remove("gateway/src/stack.rs");
    present.insert("gateway/src/new.rs".to_string());
    let drift = layout_drift(&listed, &present);
    assert!(
        drift.contains("add a line") && drift.contains("  gateway/src/new.rs\n"),
        "{drift}"
    );
    assert!(
        drift.contains("no longer exist") && drift.contains("  gateway/src/stack.rs\n"),
        "{drift}"
    );
    assert!(!drift.contains("run.rs"), "{drift}");
}
