//! Where in a JSON answer the next token goes: at a value's start or a container's end, or
//! inside a string value's text.
//!
//! The two differ in what a wrong token costs. A value's first token (which enum member, which
//! number, whether an array goes on) decides a field; a string's later tokens mostly word it.
//! On the structured sample the draft's confident mistakes were of the first kind (`"low"` for
//! `"high"`, 2 nights for 3, an array closed early), so a policy may judge the two at different
//! thresholds (`structured_threshold`). The grammar already keeps the answer valid; this only
//! reads the text emitted so far.

/// The kind of position the next token starts at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Outside any JSON value: text before or after it (a tool call's tags, a text answer).
    Outside,
    /// Inside a JSON value where the token decides something: a value's first token, a
    /// number's digits, a literal, a key, or whether a container goes on or ends.
    Value,
    /// Inside a string value, after its first character.
    Text,
}

/// A scanner over the answer's text that knows the [`Place`] of the next token.
#[derive(Debug, Clone, Default)]
pub struct JsonPlace {
    /// Open containers, innermost last: `true` for an object.
    stack: Vec<bool>,
    /// Inside a string: whether it is a key, and whether any of its text has come yet.
    string: Option<StringState>,
    /// The previous character in a string was an unescaped backslash.
    escaped: bool,
    /// In an object, the next string is a key (after `{` or `,`).
    expect_key: bool,
}

#[derive(Debug, Clone, Copy)]
struct StringState {
    key: bool,
    started: bool,
}

impl JsonPlace {
    /// A scanner at the start of an answer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Where the next token starts.
    pub fn place(&self) -> Place {
        match self.string {
            Some(StringState {
                key: false,
                started: true,
            }) => Place::Text,
            Some(_) => Place::Value,
            None if self.stack.is_empty() => Place::Outside,
            None => Place::Value,
        }
    }

    /// Where a token with this text goes: as [`JsonPlace::place`], except that a token that
    /// ends a string value decides whatever follows it in the same token (`",` goes on with
    /// the array, `"]` ends it), so it is a [`Place::Value`].
    pub fn place_of(&self, token: &str) -> Place {
        let place = self.place();
        if place != Place::Text {
            return place;
        }
        let mut escaped = self.escaped;
        if token.chars().any(|c| closes_string(&mut escaped, c)) {
            Place::Value
        } else {
            Place::Text
        }
    }

    /// Reads emitted text.
    pub fn push(&mut self, text: &str) {
        for c in text.chars() {
            self.push_char(c);
        }
    }

    fn push_char(&mut self, c: char) {
        if let Some(s) = &mut self.string {
            if closes_string(&mut self.escaped, c) {
                self.string = None;
            } else {
                s.started = true;
            }
            return;
        }
        match c {
            '{' => {
                self.stack.push(true);
                self.expect_key = true;
            }
            '[' => {
                self.stack.push(false);
                self.expect_key = false;
            }
            '}' | ']' => {
                self.stack.pop();
                self.expect_key = false;
            }
            ',' => self.expect_key = self.stack.last() == Some(&true),
            ':' => self.expect_key = false,
            // A string outside any container is text, not JSON (a tool answer's prose).
            '"' if !self.stack.is_empty() => {
                self.string = Some(StringState {
                    key: std::mem::take(&mut self.expect_key),
                    started: false,
                });
            }
            _ => {}
        }
    }
}

/// Whether `c`, read inside a string after a backslash or not (`escaped`, updated), is the
/// quote that closes it.
fn closes_string(escaped: &mut bool, c: char) -> bool {
    if std::mem::take(escaped) {
        false
    } else {
        *escaped = c == '\\';
        c == '"'
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The place before each of `tokens`, fed in turn.
    fn places(tokens: &[&str]) -> Vec<Place> {
        let mut p = JsonPlace::new();
        tokens
            .iter()
            .map(|t| {
                let before = p.place();
                p.push(t);
                before
            })
            .collect()
    }

    #[test]
    fn a_values_first_token_decides_and_its_later_ones_word_it() {
        use Place::*;
        let tokens = [
            "{\"",
            "reason",
            "\":",
            " \"",
            "The",
            " review",
            "\",",
            " \"",
            "confidence",
            "\": \"",
            "high",
            "\",",
            " \"n",
            "ights",
            "\": ",
            "3",
            ",",
            " \"items",
            "\": [\"",
            "latte",
            "\",",
            " \"",
            "cro",
            "issant",
            "\"]",
            "}",
        ];
        assert_eq!(
            places(&tokens),
            [
                Outside, Value, Value, Value, Value, Text, Text, Value, Value, Value, Value, Text,
                Value, Value, Value, Value, Value, Value, Value, Value, Text, Value, Value, Text,
                Text, Value,
            ]
        );
        let mut done = JsonPlace::new();
        done.push(&tokens.concat());
        assert_eq!(done.place(), Outside);
    }

    #[test]
    fn a_token_that_ends_a_string_value_decides() {
        let mut p = JsonPlace::new();
        p.push(r#"{"items": ["latte"#);
        assert_eq!(p.place_of(" and"), Place::Text);
        assert_eq!(p.place_of("\","), Place::Value);
        assert_eq!(p.place_of("\"]"), Place::Value);
        p.push("\\");
        assert_eq!(p.place_of("\" x"), Place::Text);
        p.push("\"");
        assert_eq!(p.place_of("\""), Place::Value);
        let mut key = JsonPlace::new();
        key.push("{\"na");
        assert_eq!(key.place_of("me\":"), Place::Value);
    }

    #[test]
    fn escapes_and_braces_inside_strings_are_text() {
        let mut p = JsonPlace::new();
        p.push(r#"{"a": "say \"}\" and ["#);
        assert_eq!(p.place(), Place::Text);
        p.push(r#"\\"#);
        assert_eq!(p.place(), Place::Text);
        p.push(r#"", "b": {"c": [1, "#);
        assert_eq!(p.place(), Place::Value);
        p.push("2]}}");
        assert_eq!(p.place(), Place::Outside);
    }

    #[test]
    fn tool_call_tags_and_prose_are_outside() {
        let mut p = JsonPlace::new();
        p.push("I will call \"the\" tool.\n<tool_call>\n");
        assert_eq!(p.place(), Place::Outside);
        p.push(r#"{"name": "get_weather", "arguments": {"city": "Pa"#);
        assert_eq!(p.place(), Place::Text);
        p.push("ris\"}}\n</tool_call>");
        assert_eq!(p.place(), Place::Outside);
    }
}
