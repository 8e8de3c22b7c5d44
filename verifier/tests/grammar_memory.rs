//! What the grammar compiler holds in memory, on the real draft's vocabulary: its token trie
//! and slices (built once per process, at start-up), and a compiled grammar of a large schema
//! in the cache. Prints resident-memory deltas for deploy/README.md's sizing; asserts only
//! what must hold whatever the machine. Run with
//! `cargo test --release -p approxy-verifier --test grammar_memory -- --ignored --nocapture`.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod common;

use approxy_verifier::grammar::{CACHED_GRAMMAR_TEXT, GrammarSpec, Grammars, JsonLayout};
use serde_json::{Value, json};

/// Resident memory of this process, in MiB (`/proc/self/status`).
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb / 1024.0
}

/// A schema of `n` optional string properties with long names, `i` making it distinct.
fn wide(i: usize, n: usize) -> Value {
    let props: serde_json::Map<String, Value> = (0..n)
        .map(|p| {
            (
                format!("schema_{i}_property_number_{p:05}"),
                json!({"type": "string"}),
            )
        })
        .collect();
    json!({"type": "object", "properties": props, "additionalProperties": false})
}

#[test]
#[ignore = "needs the real draft's tokenizer (approxy setup); a measurement"]
fn the_compiler_and_its_cache_in_memory() {
    let home = common::home();
    let tokenizer = common::tokenizer();
    let meta = common::meta();
    let before = rss_mib();
    let grammars = Grammars::new(
        &tokenizer,
        meta.vocab_size,
        &tokenizer.end_of_sequence_ids(),
    )
    .expect("the compiler builds");
    let compiler = rss_mib() - before;
    println!(
        "grammar compiler ({} tokens, {}): {compiler:.0} MiB resident",
        meta.vocab_size,
        home.draft_onnx_dir().display()
    );
    // Schemas of about 60 KB each, distinct: the cache keeps compiled ones up to its bound.
    let start = rss_mib();
    let mut kept = 0;
    for i in 0..20 {
        let spec = GrammarSpec::JsonSchema(wide(i, 1150));
        if grammars.constraint(&spec, JsonLayout::Compact).is_ok() {
            kept += 1;
        }
    }
    let twenty = rss_mib() - start;
    println!(
        "20 distinct schemas of {} KB ({kept} compiled): {twenty:.0} MiB more resident; cache bound {} KiB of schema text",
        wide(0, 1150).to_string().len() / 1000,
        CACHED_GRAMMAR_TEXT >> 10
    );
    assert!(kept > 0, "wide schemas compile");
}
