//! The server build (`--no-default-features`, as the container image builds it) links no tool
//! crate: what serves must not carry the installer's archive readers, plotting, progress bars
//! or the trainer. Read from cargo's own dependency graph for this lockfile.

use std::process::Command;

/// Crates only the tools need: the workspace's own tool crates and what they alone bring.
const TOOL_CRATES: [&str; 8] = [
    "approxy-setup",
    "approxy-training",
    "approxy-bench",
    "plotters",
    "zip",
    "tar",
    "indicatif",
    "safetensors",
];

/// The crates a build of `approxy` links, by name.
fn linked(features: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "-p",
            "approxy",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--locked",
            "--offline",
        ])
        .args(features)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => unreachable!("cargo tree failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => unreachable!("cargo tree did not run: {e}"),
    };
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_server_build_links_no_tool_crate() {
    let server = linked(&["--no-default-features"]);
    assert!(server.iter().any(|c| c == "approxy-gateway"), "{server:?}");
    let tools: Vec<&&str> = TOOL_CRATES
        .iter()
        .filter(|t| server.iter().any(|c| c == **t))
        .collect();
    assert!(tools.is_empty(), "the server build links {tools:?}");
    // The check itself can fail: the default build has every one of them.
    let full = linked(&[]);
    for t in TOOL_CRATES {
        assert!(
            full.iter().any(|c| c == t),
            "{t} is not in the default build either"
        );
    }
}
