//! Where in code the next token falls: inside a comment, a string or a docstring, at the start
//! of a line and how deeply indented, inside brackets, naming something being defined, after
//! a dot or an `=`. A difference there is more or less likely to change what the code does (a
//! comment's wording never does; an operator often does), which is what an importance router
//! needs beyond the draft's confidence. A small Python-minded lexer follows the answer's text
//! as it streams; [`Context`](super::context::Context) feeds it, so serving and training read
//! the same values. It never fails: text that is not Python (prose, another language) only
//! gives values that mean less.

/// Names of the syntax values, in the order [`Syntax::values`] returns them.
pub const SYNTAX_NAMES: [&str; 10] = [
    "in_comment",
    "in_string",
    "in_docstring",
    "line_start",
    "indent_levels",
    "bracket_depth",
    "naming_definition",
    "after_dot",
    "in_word",
    "after_assign",
];

/// Number of syntax values.
pub const N_SYNTAX: usize = SYNTAX_NAMES.len();

/// Words after which the next identifier names something new.
const DEFINERS: [&str; 9] = [
    "def", "class", "import", "from", "as", "for", "lambda", "global", "nonlocal",
];

/// An open string literal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Literal {
    quote: char,
    triple: bool,
    /// Closing quotes seen in a row (a triple-quoted literal ends at three).
    closing: u8,
    /// The last character was an unescaped backslash.
    escaped: bool,
    /// Characters seen inside, the closing quotes included.
    chars: u32,
}

/// The lexer's state after the text so far.
#[derive(Debug, Clone, Default)]
pub struct Syntax {
    comment: bool,
    literal: Option<Literal>,
    /// A literal of this quote just opened and closed with nothing between (`''`): a third
    /// quote makes it a triple-quoted one.
    empty_literal: Option<char>,
    /// Only spaces since the last newline.
    line_start: bool,
    /// Leading spaces of the current line (a tab counts as four).
    indent: usize,
    depth: usize,
    word: String,
    last_word: String,
    /// The last character outside spaces, comments and literals.
    last_code: Option<char>,
    /// Identifier characters were the last thing seen.
    in_word: bool,
}

impl Syntax {
    /// The state before any text: the start of a line, outside everything.
    pub fn new() -> Self {
        Self {
            line_start: true,
            ..Self::default()
        }
    }

    /// Follows `text`, appended to the answer.
    pub fn push(&mut self, text: &str) {
        for c in text.chars() {
            self.step(c);
        }
    }

    fn step(&mut self, c: char) {
        if c == '\n' {
            self.newline();
            return;
        }
        if self.line_start {
            match c {
                ' ' => {
                    self.indent += 1;
                    return;
                }
                '\t' => {
                    self.indent += 4;
                    return;
                }
                _ => self.line_start = false,
            }
        }
        if self.comment {
            return;
        }
        if let Some(lit) = self.literal.as_mut() {
            Self::inside_literal(lit, c);
            if lit.triple && lit.closing >= 3 || !lit.triple && lit.closing >= 1 {
                // `''` followed by a third quote is a docstring opening, not two strings.
                let empty = !lit.triple && lit.chars == 1;
                self.literal = None;
                self.empty_literal = empty.then_some(c);
                self.last_code = Some(c);
            }
            return;
        }
        let empty = self.empty_literal.take();
        match c {
            '\'' | '"' => {
                self.end_word();
                if empty == Some(c) {
                    self.literal = Some(Literal {
                        quote: c,
                        triple: true,
                        closing: 0,
                        escaped: false,
                        chars: 0,
                    });
                } else {
                    self.literal = Some(Literal {
                        quote: c,
                        triple: false,
                        closing: 0,
                        escaped: false,
                        chars: 0,
                    });
                }
                self.last_code = Some(c);
            }
            '#' => {
                self.end_word();
                self.comment = true;
            }
            c if c.is_alphanumeric() || c == '_' => {
                self.word.push(c);
                self.in_word = true;
                self.last_code = Some(c);
            }
            c => {
                self.end_word();
                match c {
                    '(' | '[' | '{' => self.depth += 1,
                    ')' | ']' | '}' => self.depth = self.depth.saturating_sub(1),
                    _ => {}
                }
                if !c.is_whitespace() {
                    self.last_code = Some(c);
                }
            }
        }
    }

    fn inside_literal(lit: &mut Literal, c: char) {
        lit.chars += 1;
        if lit.escaped {
            lit.escaped = false;
            lit.closing = 0;
        } else if c == '\\' {
            lit.escaped = true;
            lit.closing = 0;
        } else if c == lit.quote {
            lit.closing += 1;
        } else {
            lit.closing = 0;
        }
    }

    fn newline(&mut self) {
        self.end_word();
        self.comment = false;
        self.empty_literal = None;
        // A one-line literal left open is an error in Python; start the next line clean.
        if self.literal.is_some_and(|l| !l.triple) {
            self.literal = None;
        }
        if let Some(l) = self.literal.as_mut() {
            l.closing = 0;
        }
        self.line_start = true;
        self.indent = 0;
    }

    fn end_word(&mut self) {
        if self.in_word {
            self.last_word = std::mem::take(&mut self.word);
            self.in_word = false;
        }
    }

    /// The values (in [`SYNTAX_NAMES`] order) for the token at the next position.
    pub fn values(&self) -> [f32; N_SYNTAX] {
        let flag = |b: bool| f32::from(u8::from(b));
        let in_literal = self.literal.is_some();
        let code = !self.comment && !in_literal;
        [
            flag(self.comment),
            flag(self.literal.is_some_and(|l| !l.triple)),
            flag(self.literal.is_some_and(|l| l.triple)),
            flag(self.line_start),
            (self.indent / 4).min(8) as f32 / 8.0,
            self.depth.min(4) as f32 / 4.0,
            flag(code && !self.in_word && DEFINERS.contains(&self.last_word.as_str())),
            flag(code && self.last_code == Some('.')),
            flag(code && self.in_word),
            flag(code && self.last_code == Some('=')),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> [f32; N_SYNTAX] {
        let mut s = Syntax::new();
        s.push(text);
        s.values()
    }

    fn names(v: [f32; N_SYNTAX]) -> Vec<&'static str> {
        SYNTAX_NAMES
            .iter()
            .zip(v)
            .filter(|(n, x)| *x > 0.0 && !n.starts_with("indent") && !n.starts_with("bracket"))
            .map(|(n, _)| *n)
            .collect()
    }

    #[test]
    fn comments_strings_and_docstrings() {
        assert_eq!(names(at("    x = 1  # the count")), ["in_comment"]);
        assert_eq!(names(at("    x = 1  # it's\n")), ["line_start"]);
        assert_eq!(names(at("    s = 'a # b")), ["in_string"]);
        assert_eq!(names(at("    s = \"a \\\" b")), ["in_string"]);
        assert_eq!(names(at("    \"\"\"Returns the")), ["in_docstring"]);
        assert_eq!(names(at("    \"\"\"Returns\n    the")), ["in_docstring"]);
        assert_eq!(names(at("    \"\"\"Returns.\"\"\"\n    ")), ["line_start"]);
        assert_eq!(names(at("    s = ''")), Vec::<&str>::new());
        assert_eq!(names(at("    s = 'a''")), ["in_string"]);
        assert_eq!(names(at("    s = '''x'' ")), ["in_docstring"]);
    }

    #[test]
    fn names_being_defined_used_and_assigned() {
        assert_eq!(names(at("def ")), ["naming_definition"]);
        assert_eq!(names(at("    for ")), ["naming_definition"]);
        assert_eq!(names(at("    for i")), ["in_word"]);
        assert_eq!(names(at("    result.")), ["after_dot"]);
        assert_eq!(names(at("    total = ")), ["after_assign"]);
        assert_eq!(names(at("    total == ")), ["after_assign"]);
        assert_eq!(names(at("    return ")), Vec::<&str>::new());
    }

    #[test]
    fn indentation_and_brackets() {
        let v = at("        if f(a, [b");
        assert_eq!(v[4], 2.0 / 8.0);
        assert_eq!(v[5], 2.0 / 4.0);
        let v = at("        x = (1,\n            ");
        assert_eq!((v[3], v[4], v[5]), (1.0, 3.0 / 8.0, 1.0 / 4.0));
        assert_eq!(at("\tx")[4], 1.0 / 8.0);
    }

    #[test]
    fn text_split_anywhere_gives_the_same_values() {
        let text = "def f(a):\n    \"\"\"Doc 'x'.\"\"\"\n    s = 'a # b'  # c\n    return a.b\n";
        for cut in 0..text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            let mut s = Syntax::new();
            s.push(&text[..cut]);
            s.push(&text[cut..]);
            assert_eq!(s.values(), at(text), "cut at {cut}");
        }
    }
}
