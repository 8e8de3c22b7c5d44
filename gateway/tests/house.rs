//! The shape of the house, read from the source of every crate in the workspace as text
//! (comments, string and character literals and `#[cfg(test)]` items left out); the crates are
//! the workspace manifest's members:
//!
//! - no circle of imports: within a crate, the files that import one another (by `use
//!   crate::…`, `use super::…` or a `crate::…` path in the code) form no loop. A loop is how a
//!   leaf starts reaching back up, and a change then touches both ends. Module paths map to
//!   files as rustc maps them (`a/b.rs` or `a/b/mod.rs` is `a::b`);
//! - no function of [`LONGEST_FUNCTION`] lines or more outside tests: a function that long does
//!   several things, which are easier to read, test and change as functions of their own;
//! - no `unsafe` outside [`UNSAFE_HOME`]: the workspace denies `unsafe_code`, and the one call
//!   that needs it (an allocator option) allows it there, where a reader looks for it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[path = "support/workspace.rs"]
mod workspace;

use workspace::{root as workspace_root, rust_files, source_folders};

/// A file's module path within its crate: `[]` for the crate root.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
}

/// The one file whose code may hold `unsafe`, from the workspace root.
const UNSAFE_HOME: &str = "gateway/cli/src/allocator.rs";

/// The lines of `code` (as [`code_of`] leaves it) that use the word `unsafe`.
fn unsafe_lines(code: &str) -> Vec<usize> {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    code.lines()
        .enumerate()
        .filter(|(_, l)| {
            l.match_indices("unsafe").any(|(at, _)| {
                !l[..at].ends_with(word) && !l[at + "unsafe".len()..].starts_with(word)
            })
        })
        .map(|(i, _)| i + 1)
        .collect()
}

/// Lines a function outside tests may not reach.
const LONGEST_FUNCTION: usize = 81;

/// Lines a file's code (before its first `#[cfg(test)]`) may not reach.
const LONGEST_FILE: usize = 801;

/// The source with comments and the insides of string and character literals blanked (lines
/// kept), so that neither a `//` in a URL nor a brace in a literal is read as code.
fn blanked(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, part: &[char]| {
        out.extend(part.iter().map(|&ch| if ch == '\n' { '\n' } else { ' ' }));
    };
    let ident = |ch: Option<&char>| ch.is_some_and(|c| c.is_alphanumeric() || *c == '_');
    let mut i = 0;
    while i < c.len() {
        let end = match (c[i], c.get(i + 1)) {
            ('/', Some('/')) => c[i..]
                .iter()
                .position(|&x| x == '\n')
                .map_or(c.len(), |p| i + p),
            ('/', Some('*')) => (i + 2..c.len().saturating_sub(1))
                .find(|&k| c[k] == '*' && c[k + 1] == '/')
                .map_or(c.len(), |k| k + 2),
            ('r', Some('"' | '#')) if !ident(i.checked_sub(1).and_then(|p| c.get(p))) => {
                let hashes = c[i + 1..].iter().take_while(|&&x| x == '#').count();
                let open = i + 1 + hashes;
                if c.get(open) != Some(&'"') {
                    out.push(c[i]);
                    i += 1;
                    continue;
                }
                let closes =
                    |k: usize| c[k] == '"' && (1..=hashes).all(|h| c.get(k + h) == Some(&'#'));
                (open + 1..c.len())
                    .find(|&k| closes(k))
                    .map_or(c.len(), |k| k + 1 + hashes)
            }
            ('"', _) => {
                let mut k = i + 1;
                while k < c.len() && c[k] != '"' {
                    k += if c[k] == '\\' { 2 } else { 1 };
                }
                (k + 1).min(c.len())
            }
            ('\'', Some('\\')) => (i + 3..c.len())
                .find(|&k| c[k] == '\'')
                .map_or(c.len(), |k| k + 1),
            ('\'', Some(_)) if c.get(i + 2) == Some(&'\'') => i + 3,
            _ => {
                out.push(c[i]);
                i += 1;
                continue;
            }
        };
        blank(&mut out, &c[i..end]);
        i = end;
    }
    out
}

/// The code without `#[cfg(test)]` items (a test module may import anything it tests, and
/// holds tests, whose length is theirs to choose).
fn code_of(text: &str) -> String {
    let text = blanked(text);
    let mut out = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        out.push('\n');
        // Skip the item: to its `;` when it has no body, else to its closing brace.
        let mut depth = 0i32;
        let mut opened = false;
        for l in lines.by_ref() {
            out.push('\n');
            depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
            opened |= l.contains('{');
            if (opened && depth <= 0) || (!opened && l.trim_end().ends_with(';')) {
                break;
            }
        }
    }
    out
}

/// Expands one `use` tree (`a::{b, c::d}`) into its paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or("").trim().to_string()];
    };
    let head = tree[..open].trim_end_matches("::").trim();
    let close = tree.rfind('}').filter(|&c| c > open).unwrap_or(tree.len());
    let inner = &tree[open + 1..close];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|p| match p.as_str() {
            "self" => head.to_string(),
            _ => format!("{head}::{p}"),
        })
        .collect()
}

/// The paths a file's code names: its `use` declarations expanded, and `crate::…` and
/// `super::…` paths written inline.
fn paths_named(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    // A `use` declaration starts a line (after its visibility) and runs to its `;`.
    let mut lines = code.lines();
    while let Some(line) = lines.next() {
        let l = line.trim_start();
        let l = ["pub(crate) ", "pub(super) ", "pub "]
            .iter()
            .find_map(|v| l.strip_prefix(v))
            .unwrap_or(l);
        let Some(tree) = l.strip_prefix("use ") else {
            continue;
        };
        let mut decl = tree.to_string();
        while !decl.contains(';') {
            match lines.next() {
                Some(more) => decl.push_str(more),
                None => break,
            }
        }
        paths.extend(expand(decl.split(';').next().unwrap_or("")));
    }
    for root in ["crate::", "super::"] {
        paths.extend(inline_paths(code, root));
    }
    paths
}

/// The paths written inline in some code that start with `head` (`crate::`), each where `head`
/// starts a path rather than ends a longer name.
fn inline_paths(code: &str, head: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(head) {
        let before = rest[..at].chars().last();
        let path: String = rest[at..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        rest = &rest[at + head.len()..];
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            paths.push(path.trim_end_matches(':').to_string());
        }
    }
    paths
}

/// The module a path names, resolved from module `at`: the longest prefix that is a file. A
/// path may start at the crate (`crate::`, or the crate's own name, `own`), at the parent
/// (`super::`), here (`self::`) or at a child of this module (`child::`, as a module file's
/// `use` of its own children reads).
fn target_of(
    path: &str,
    at: &[String],
    modules: &BTreeSet<Vec<String>>,
    own: &str,
) -> Option<Vec<String>> {
    let mut segs = path.split("::").filter(|s| !s.is_empty()).peekable();
    let first = segs.peek()?.to_string();
    let child = [at, std::slice::from_ref(&first)].concat();
    let mut base: Vec<String> = match first.as_str() {
        "crate" => Vec::new(),
        "super" => at[..at.len().saturating_sub(1)].to_vec(),
        "self" => at.to_vec(),
        _ if first == own => Vec::new(),
        _ if modules.contains(&child) => at.to_vec(),
        _ => return None,
    };
    if matches!(first.as_str(), "crate" | "super" | "self") || first == own {
        segs.next();
    }
    // `super::Item` names the parent's own file.
    let mut found = modules.contains(&base).then(|| base.clone());
    for s in segs {
        if s == "super" {
            base.pop();
            continue;
        }
        base.push(s.to_string());
        if modules.contains(&base) {
            found = Some(base.clone());
        }
    }
    found
}

/// Whether a module file is a face: it only declares its children and re-exports them (and
/// carries attributes). Its re-exports are what the module shows, not ties of its own.
fn is_face(code: &str) -> bool {
    let mut statements = String::new();
    for line in code.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with("#[") || l.starts_with("#![") {
            continue;
        }
        statements.push_str(l);
        statements.push(' ');
    }
    statements
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .all(|s| {
            let s = ["pub(crate) ", "pub(super) ", "pub "]
                .iter()
                .find_map(|v| s.strip_prefix(v))
                .unwrap_or(s);
            (s.starts_with("mod ") && !s.contains('{')) || s.starts_with("use ")
        })
        && code.contains("mod ")
}

/// The modules directly below `at`, by their last name.
fn children_of(at: &[String], modules: &BTreeSet<Vec<String>>) -> Vec<String> {
    modules
        .iter()
        .filter(|m| m.len() == at.len() + 1 && m.starts_with(at))
        .filter_map(|m| m.last().cloned())
        .collect()
}

/// Paths written inline that start at a child module (`run::Run::new(..)` in a module file),
/// which [`paths_named`] does not read.
fn child_paths(code: &str, children: &[String]) -> Vec<String> {
    children
        .iter()
        .flat_map(|child| inline_paths(code, &format!("{child}::")))
        .collect()
}

/// The crate's own name, as its code may write it (`approxy_verifier`), from the manifest
/// next to its source folder.
fn crate_name(src: &Path) -> String {
    let manifest = std::fs::read_to_string(src.join("../Cargo.toml")).unwrap_or_default();
    manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("name = \""))
        .and_then(|l| l.strip_suffix('"'))
        .unwrap_or("")
        .replace('-', "_")
}

/// A function item's name, when the line starts one.
fn fn_name(line: &str) -> Option<String> {
    let mut words = line.split_whitespace().peekable();
    while words
        .peek()
        .is_some_and(|w| w.starts_with("pub") || ["async", "const", "unsafe", "extern"].contains(w))
    {
        words.next();
    }
    if words.next()? != "fn" {
        return None;
    }
    let name: String = words
        .next()?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The functions of some code with their lengths: (first line, name, lines), from the line
/// that names it to its closing brace. A declaration without a body has none.
fn functions(code: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else {
            continue;
        };
        let (mut depth, mut nesting, mut opened, mut end) = (0i32, 0i32, false, None);
        'scan: for (m, l) in lines[n..].iter().enumerate() {
            for ch in l.chars() {
                match ch {
                    '(' | '[' => nesting += 1,
                    ')' | ']' => nesting -= 1,
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => {
                        depth -= 1;
                        if opened && depth == 0 {
                            end = Some(n + m);
                            break 'scan;
                        }
                    }
                    ';' if !opened && nesting == 0 => break 'scan,
                    _ => {}
                }
            }
        }
        if let Some(e) = end {
            found.push((n + 1, name, e - n + 1));
        }
    }
    found
}

/// The functions of a crate outside tests, as `file:line name: n lines`, with their lengths.
fn crate_functions(src: &Path) -> Vec<(String, usize)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files
        .iter()
        .filter(|f| !f.to_string_lossy().ends_with("_tests.rs"))
        .flat_map(|f| {
            let code = code_of(&std::fs::read_to_string(f).unwrap_or_default());
            functions(&code)
                .into_iter()
                .map(|(line, name, n)| (format!("{}:{line} {name}: {n} lines", f.display()), n))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The files of one crate and the files each imports.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let files: Vec<PathBuf> = files
        .into_iter()
        .filter(|f| !f.to_string_lossy().ends_with("_tests.rs"))
        .collect();
    let modules: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|f| (module_of(src, f), f.display().to_string()))
        .collect();
    let known: BTreeSet<Vec<String>> = modules.keys().cloned().collect();
    let own = crate_name(src);
    let mut edges = BTreeMap::new();
    for (module, file) in &modules {
        let code = code_of(&std::fs::read_to_string(file).unwrap_or_default());
        if is_face(&code) {
            edges.insert(file.clone(), BTreeSet::new());
            continue;
        }
        let mut named = paths_named(&code);
        named.extend(child_paths(&code, &children_of(module, &known)));
        let to: BTreeSet<String> = named
            .iter()
            .filter_map(|p| target_of(p, module, &known, &own))
            .filter(|m| m != module)
            .filter_map(|m| modules.get(&m).cloned())
            .collect();
        edges.insert(file.clone(), to);
    }
    edges
}

/// The loops of a graph, each as one path around it (depth-first, colouring).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
        found: &mut Vec<Vec<String>>,
    ) {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                0 => visit(m, edges, state, stack, found),
                1 => {
                    let from = stack.iter().position(|s| s == m).unwrap_or(0);
                    found.push(stack[from..].to_vec());
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
    }
    let mut state = BTreeMap::new();
    let mut found = Vec::new();
    for n in edges.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            visit(n, edges, &mut state, &mut Vec::new(), &mut found);
        }
    }
    found
}

#[test]
fn no_crate_has_an_import_circle() {
    let root = workspace_root();
    let folders = source_folders();
    assert!(
        folders.len() > 3,
        "crates read from the manifest: {folders:?}"
    );
    let mut all = Vec::new();
    for c in folders {
        let g = graph(&root.join(&c));
        assert!(g.len() > 3, "{c}: too few files read ({})", g.len());
        all.extend(circles(&g));
    }
    assert!(all.is_empty(), "import circles: {all:#?}");
}

/// The engine's faces: all the gateway may name of it (see `verifier/src/lib.rs`).
const ENGINE_FACES: &[&str] = &["infer", "request", "policy"];

/// The engine paths some code names (`approxy_verifier::…`, in `use` or inline) that go
/// around its faces, by the name they reach past them with.
fn past_the_faces(code: &str) -> Vec<String> {
    let head = "approxy_verifier::";
    let mut named: Vec<String> = paths_named(code)
        .into_iter()
        .filter(|p| p.starts_with(head))
        .collect();
    // Inline, a `use` of a brace group reads as the bare crate name: its paths come above.
    named.extend(
        inline_paths(code, head)
            .into_iter()
            .filter(|p| p.len() > head.len()),
    );
    let past: BTreeSet<String> = named
        .into_iter()
        .filter(|p| {
            let face = p[head.len()..].split("::").next().unwrap_or("");
            !ENGINE_FACES.contains(&face)
        })
        .collect();
    past.into_iter().collect()
}

/// The gateway builds, runs and configures the engine through its faces alone, as TGI's
/// router sees its backend only through `Infer` and a validated request.
#[test]
fn the_gateway_names_only_the_engines_faces() {
    let mut files = Vec::new();
    rust_files(&workspace_root().join("gateway/src"), &mut files);
    let mut seen = 0;
    let mut past = Vec::new();
    for f in files
        .iter()
        .filter(|f| !f.to_string_lossy().ends_with("_tests.rs"))
    {
        let code = code_of(&std::fs::read_to_string(f).unwrap_or_default());
        seen += code.matches("approxy_verifier::").count();
        past.extend(
            past_the_faces(&code)
                .into_iter()
                .map(|p| format!("{}: {p}", f.display())),
        );
    }
    assert!(seen > 20, "only {seen} engine paths read");
    assert!(past.is_empty(), "{past:#?}");
}

/// The face check catches a `use` and an inline path past the faces, and lets the faces by.
#[test]
fn the_face_check_sees_uses_and_inline_paths() {
    let code = "use approxy_verifier::infer::{Engine, transport::Verdict};\n\
                use approxy_verifier::{policy::Pricing, cost::Unit};\n\
                fn f() { approxy_verifier::targets::retry::current_deadline(); \
                approxy_verifier::request::Tokenizer::new(); }\n";
    assert_eq!(
        past_the_faces(code),
        [
            "approxy_verifier::cost::Unit",
            "approxy_verifier::targets::retry::current_deadline"
        ]
    );
}

#[test]
fn no_function_outside_tests_is_too_long() {
    let root = workspace_root();
    let all: Vec<(String, usize)> = source_folders()
        .iter()
        .flat_map(|c| crate_functions(&root.join(c)))
        .collect();
    assert!(all.len() > 1000, "only {} functions read", all.len());
    let long: Vec<&String> = all
        .iter()
        .filter(|(_, n)| *n >= LONGEST_FUNCTION)
        .map(|(f, _)| f)
        .collect();
    assert!(long.is_empty(), "{long:#?}");
}

/// The lines of a file before its first `#[cfg(test)]` line: its code, whose tests follow.
fn code_lines(text: &str) -> usize {
    text.lines()
        .position(|l| l.trim() == "#[cfg(test)]")
        .unwrap_or_else(|| text.lines().count())
}

#[test]
fn no_file_outside_tests_is_too_long() {
    let root = workspace_root();
    let mut long = Vec::new();
    let mut read = 0;
    for c in source_folders() {
        let mut files = Vec::new();
        rust_files(&root.join(&c), &mut files);
        for f in files
            .iter()
            .filter(|f| !f.to_string_lossy().ends_with("_tests.rs"))
        {
            read += 1;
            let n = code_lines(&std::fs::read_to_string(f).unwrap_or_default());
            if n >= LONGEST_FILE {
                long.push(format!("{}: {n} lines", f.display()));
            }
        }
    }
    assert!(read > 100, "only {read} files read");
    assert!(long.is_empty(), "{long:#?}");
}

/// The file check counts a file's code and not the tests after it.
#[test]
fn the_file_check_counts_code_before_its_tests() {
    let text = format!(
        "{}#[cfg(test)]\nmod tests {{\n{}}}\n",
        "fn f() {}\n".repeat(LONGEST_FILE),
        "    fn t() {}\n".repeat(3 * LONGEST_FILE)
    );
    assert_eq!(code_lines(&text), LONGEST_FILE);
    assert_eq!(code_lines("fn f() {}\nfn g() {}\n"), 2);
}

#[test]
fn unsafe_code_is_only_here() {
    let root = workspace_root();
    let mut found = Vec::new();
    let mut read = 0;
    for c in source_folders() {
        let mut files = Vec::new();
        rust_files(&root.join(&c), &mut files);
        for f in files {
            let rel = f
                .strip_prefix(&root)
                .unwrap_or(&f)
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            read += 1;
            let lines = unsafe_lines(&code_of(&text));
            if rel == UNSAFE_HOME {
                assert!(
                    !lines.is_empty(),
                    "{UNSAFE_HOME} holds no unsafe: move UNSAFE_HOME"
                );
            } else if !lines.is_empty() {
                found.push((rel, lines));
            }
        }
    }
    assert!(read > 100, "only {read} files read");
    assert!(found.is_empty(), "unsafe outside {UNSAFE_HOME}: {found:?}");
}

/// The unsafe check sees the keyword and nothing that merely contains it.
#[test]
fn the_unsafe_check_sees_the_keyword() {
    let text = "fn unsafe_path() {}\nlet s = \"unsafe\"; // unsafe\n\
                #[allow(unsafe_code)]\nfn f() { unsafe { g() } }\nunsafe fn h() {}\n";
    assert_eq!(unsafe_lines(&code_of(text)), [4, 5]);
}

/// The length check counts what it should: a long function is found, whatever braces its
/// strings, characters and comments hold, and a long test is not.
#[test]
fn the_length_check_sees_a_long_function() {
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    let text = format!(
        "fn short() {{\n    let s = \"}}}}\"; let c = '}}'; // }}\n}}\n\
         pub(crate) async fn long(a: [u8; 2]) -> Result<(), ()> {{\n{}    Ok(())\n}}\n\
         fn declared(x: u8);\n#[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{}    }}\n}}\n",
        body(LONGEST_FUNCTION),
        body(LONGEST_FUNCTION)
    );
    let found: Vec<(String, usize)> = functions(&code_of(&text))
        .into_iter()
        .map(|(_, name, n)| (name, n))
        .collect();
    assert_eq!(
        found,
        [
            ("short".to_string(), 3),
            ("long".to_string(), LONGEST_FUNCTION + 3)
        ]
    );
}

/// The check finds what it is for: a leaf that reaches back up, written the ways the code
/// imports (a grouped `use`, `super::`, an inline `crate::` path).
#[test]
fn the_check_sees_a_circle() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
    let src = dir.path();
    let write = |name: &str, text: &str| {
        let p = src.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| unreachable!("{e}"));
        }
        std::fs::write(p, text).unwrap_or_else(|e| unreachable!("{e}"));
    };
    write("lib.rs", "pub mod top;\npub mod leaf;\npub mod folder;\n");
    write("top.rs", "use crate::{leaf::Leaf, folder::inner};\n");
    write(
        "leaf.rs",
        "pub struct Leaf;\n#[cfg(test)]\nmod tests {\n    use crate::top::*;\n}\n",
    );
    write("folder/mod.rs", "pub mod inner;\n");
    write("folder/inner.rs", "pub fn f() {}\n");
    assert!(circles(&graph(src)).is_empty());
    write(
        "leaf.rs",
        "pub struct Leaf;\nfn up() { crate::top::x(); }\n",
    );
    assert_eq!(circles(&graph(src)).len(), 1);
    write("leaf.rs", "pub struct Leaf;\n");
    write("folder/inner.rs", "use super::super::top;\n");
    assert_eq!(circles(&graph(src)).len(), 1);
}

/// The check sees a module file and its child that use each other, written as a module file
/// writes it (`use child::…`, an inline `child::` path, the crate's own name), and does not
/// count a face's re-exports as ties.
#[test]
fn the_check_sees_a_module_and_its_child_in_a_loop() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
    let src = dir.path().join("src");
    let write = |name: &str, text: &str| {
        let p = src.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| unreachable!("{e}"));
        }
        std::fs::write(p, text).unwrap_or_else(|e| unreachable!("{e}"));
    };
    std::fs::create_dir_all(&src).unwrap_or_else(|e| unreachable!("{e}"));
    std::fs::write(
        dir.path().join("Cargo.toml"),
        "[package]\nname = \"my-crate\"\n",
    )
    .unwrap_or_else(|e| unreachable!("{e}"));
    write("lib.rs", "pub mod policy;\n");
    // A face: declares its children and re-exports them.
    write(
        "policy/mod.rs",
        "mod raw;\nmod typed;\npub use raw::Raw;\npub use typed::Policy;\n",
    );
    write("policy/typed.rs", "pub struct Policy;\n");
    write(
        "policy/raw.rs",
        "use super::typed::Policy;\npub struct Raw(Policy);\n",
    );
    assert!(circles(&graph(&src)).is_empty());
    // The module file holds code that uses a child, and the child uses the module's own.
    write(
        "policy/mod.rs",
        "mod raw;\nuse raw::Raw;\npub struct Policy;\nfn f(_: Raw) {}\n",
    );
    write(
        "policy/raw.rs",
        "use super::Policy;\npub struct Raw(Policy);\n",
    );
    assert_eq!(circles(&graph(&src)).len(), 1);
    // The same tie as an inline path to the child, and back by the crate's own name.
    write(
        "policy/mod.rs",
        "mod raw;\npub struct Policy;\nfn f() { raw::g(); }\n",
    );
    write(
        "policy/raw.rs",
        "use my_crate::policy::Policy;\npub fn g() {}\nfn h(_: Policy) {}\n",
    );
    assert_eq!(circles(&graph(&src)).len(), 1);
}
