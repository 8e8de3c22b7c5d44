//! Which kind of prompt a request is, code or chat, so that a policy can set its dial per kind:
//! the draft agrees with the target far more often on code than on chat, and the calibration
//! measures each kind's accept and false-accept curves apart. A word and shape heuristic over
//! the request's text: cheap enough for every request, and checked against the training
//! corpus's labels and everyday examples in the tests below.

use super::Prompt;
pub use crate::policy::PromptKind;

/// Words that make a request about code. Words as common in everyday chat are left out
/// ("class", "method", "program", "library", "string", "shell", "swift", "bug": "the scientific
/// method" and "the Apollo program" are chat); a few kept ones still misfire ("rust" on a bike,
/// "dress code"), which costs such a request the code dial, not its answer.
const CODE_WORDS: &[&str] = &[
    "code",
    "coding",
    "function",
    "functions",
    "implement",
    "implementation",
    "script",
    "python",
    "perl",
    "rust",
    "javascript",
    "typescript",
    "js",
    "java",
    "golang",
    "kotlin",
    "c++",
    "c#",
    "cpp",
    "sql",
    "regex",
    "debug",
    "debugging",
    "compile",
    "compiler",
    "pytest",
    "unittest",
    "refactor",
    "api",
    "algorithm",
    "json",
    "yaml",
    "html",
    "css",
    "bash",
    "docstring",
    "stacktrace",
    "traceback",
    "segfault",
    "dataframe",
    "numpy",
    "pandas",
    "git",
    "dockerfile",
    "npm",
];

/// The kind of a request's prompt: of all its user and assistant messages (a follow-up such as
/// "now make it faster" belongs to the code conversation it continues; a system prompt is an
/// app's boilerplate, the same for all its requests, so it is not read), or of a completion
/// prompt's text. A prompt given as token ids is classified on its decoded text, which the
/// caller passes.
pub fn detect(prompt: &Prompt, decoded: Option<&str>) -> PromptKind {
    match prompt {
        Prompt::Chat(messages) => {
            if messages
                .iter()
                .filter(|m| m.role != "system")
                .any(|m| detect_text(&m.content) == PromptKind::Code)
            {
                PromptKind::Code
            } else {
                PromptKind::Chat
            }
        }
        Prompt::Text(t) => detect_text(t),
        Prompt::Tokens(_) => decoded.map_or(PromptKind::Chat, detect_text),
    }
}

/// The kind of one text.
pub fn detect_text(text: &str) -> PromptKind {
    let code_word = || {
        text.split(|c: char| !(c.is_alphanumeric() || c == '+' || c == '#'))
            .any(|w| !w.is_empty() && CODE_WORDS.iter().any(|c| c.eq_ignore_ascii_case(w)))
    };
    if text.contains("```") || text.lines().any(looks_like_code) || code_word() {
        PromptKind::Code
    } else {
        PromptKind::Chat
    }
}

/// Words that open a statement only when a code shape follows them: each also opens prose
/// ("Let me know...", "Public speaking...", "Return policy...").
const SHAPED_STATEMENT_WORDS: &[&str] = &[
    "function ",
    "const ",
    "let ",
    "var ",
    "public ",
    "private ",
    "return ",
    "@",
];

/// Line endings prose rarely has.
const CODE_ENDINGS: &[&str] = &["{", ");", "):", "};"];

/// What a shaped statement may end with, when it holds no `(` or `=`.
const SHAPE_ENDINGS: [char; 2] = [';', '{'];

/// A line that reads as source code: a statement with a code shape after it, or an ending
/// prose rarely has. Statement words alone are not enough ("Public speaking...", "Return
/// policy...", "Import duties...", "Let me know..." are prose).
fn looks_like_code(line: &str) -> bool {
    let l = line.trim();
    if l.len() < 4 {
        return false;
    }
    is_statement(l) || CODE_ENDINGS.iter().any(|e| l.ends_with(e))
}

/// A trimmed line that starts with a statement word and has the shape that word's statement
/// takes.
fn is_statement(l: &str) -> bool {
    // Every line of every message passes here: nothing is allocated unless a statement word
    // starts the line.
    let starts = |w: &str| l.get(..w.len()).is_some_and(|p| p.eq_ignore_ascii_case(w));
    let has = |w: &str| l.to_lowercase().contains(w);
    if starts("def ") || starts("fn ") || starts("pub fn ") {
        l.contains('(')
    } else if starts("#include") || starts("#!/") {
        true
    } else if starts("import ") {
        l.split_whitespace().count() <= 4 && !l.ends_with('?')
    } else if starts("from ") {
        has(" import ")
    } else if starts("select ") {
        has(" from ")
    } else if starts("class ") {
        is_shaped(l) || l.ends_with(':')
    } else if SHAPED_STATEMENT_WORDS.iter().any(|w| starts(w)) {
        is_shaped(l)
    } else {
        false
    }
}

/// Whether a line has a call, an assignment or a statement's ending.
fn is_shaped(l: &str) -> bool {
    l.contains('(') || l.contains('=') || l.ends_with(SHAPE_ENDINGS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use approxy_verifier::request::ChatMessage;

    fn kind(s: &str) -> &'static str {
        detect_text(s).name()
    }

    #[test]
    fn everyday_requests() {
        for code in [
            "How do I reverse a list in Python?",
            "Why does this segfault?\n```c\nint *p = 0; *p = 1;\n```",
            "def add(a, b):\n    \"\"\"Return the sum.\"\"\"\n",
            "Write a regex that matches dates like 2024-01-31.",
            "My Rust build fails with a borrow checker error, what does E0502 mean in this code?",
            "Convert this JSON to YAML: {\"a\": 1}",
            "SELECT name FROM users WHERE id = 3; why is it slow?",
            "Write a C++ class for a ring buffer.",
            "fix my bash script that loops over files",
            "import numpy as np\nx = np.zeros(3)",
        ] {
            assert_eq!(kind(code), "code", "{code:?}");
        }
        for chat in [
            "What is the capital of France?",
            "Write a haiku about autumn.",
            "Explain the scientific method to a ten-year-old.",
            "Summarize the history of the Apollo program in a few sentences.",
            "From what I read, tea has less caffeine than coffee. Is that true?",
            "Let me know three facts about honeybees.",
            "Public speaking makes me nervous. Any tips?",
            "Which class of ships sank the most in World War II?",
            "Return policy question: can I return shoes after 30 days?",
            "Import duties on cars from Japan: how do they work?",
        ] {
            assert_eq!(kind(chat), "chat", "{chat:?}");
        }
    }

    #[test]
    fn a_conversation_is_code_when_any_message_is() {
        let msg = |role: &str, content: &str| ChatMessage::new(role.into(), content.into());
        let follow_up = Prompt::Chat(vec![
            msg(
                "user",
                "Write a Python function that sorts a list of tuples.",
            ),
            msg("assistant", "def f(xs):\n    return sorted(xs)"),
            msg("user", "Now make it faster."),
        ]);
        assert_eq!(detect(&follow_up, None), PromptKind::Code);
        let chat = Prompt::Chat(vec![msg("system", "You are helpful."), msg("user", "Hi!")]);
        assert_eq!(detect(&chat, None), PromptKind::Chat);
        // A system prompt about code is the app's, not the request's.
        let coding_app = Prompt::Chat(vec![
            msg("system", "You help with code. Format code as ```blocks```."),
            msg("user", "What should I cook tonight?"),
        ]);
        assert_eq!(detect(&coding_app, None), PromptKind::Chat);
        assert_eq!(
            detect(&Prompt::Tokens(vec![1, 2]), Some("import os\n")),
            PromptKind::Code
        );
        assert_eq!(detect(&Prompt::Tokens(vec![1, 2]), None), PromptKind::Chat);
    }

    /// On the training corpus (whose kinds are labelled) nearly every prompt is classed as
    /// labelled, on each kind and on each source; two sources are templated and the FAQ ones
    /// are people's questions (the FAQs' "(Python)" and "(Perl)", added where a question does
    /// not say it, is what a user of a general assistant writes), so this bounds the
    /// heuristic's mistakes on prompts like those, not on all traffic.
    #[test]
    fn agrees_with_the_corpus_labels() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../training/data/prompts.jsonl");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
        // label or label/source -> (right, of)
        let mut tally: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
        let mut wrong = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}"));
            let (label, source, prompt) = (
                v["kind"].as_str().unwrap_or(""),
                v["source"].as_str().unwrap_or(""),
                v["prompt"].as_str().unwrap_or(""),
            );
            let right = kind(prompt) == label;
            if !right && wrong.len() < 5 {
                wrong.push(format!("{label}: {prompt}"));
            }
            for key in [label.to_string(), format!("{label}/{source}")] {
                let t = tally.entry(key).or_default();
                t.0 += usize::from(right);
                t.1 += 1;
            }
        }
        assert!(tally.len() >= 8, "kinds and sources: {tally:?}");
        for (key, (right, of)) in &tally {
            let acc = *right as f64 / *of as f64;
            eprintln!("{key}: {right} of {of} classed as labelled ({acc:.4})");
            let floor = if key.contains('/') { 0.8 } else { 0.97 };
            assert!(
                acc >= floor,
                "{key}: {acc:.3} of {of} right; e.g. {wrong:#?}"
            );
        }
    }
}
