//! JSON laid out on lines, as the chat models write it when nothing constrains them: each
//! object's members on lines of their own, indented two spaces a level, and arrays either on
//! one line (`["a", "b"]`) or one item a line, as the model picks at the `[`.
//!
//! The compact layout (`", "` and `": "` on one line) keeps every separator forced but puts
//! the model in text it rarely writes, and that moves its values: on the structured sample the
//! target itself, writing every free token under the compact grammar, kept clearly fewer of
//! its own unconstrained answers' fields than it keeps when simply asked twice (see
//! tests/README.md, "Structured output"). Free whitespace gives
//! the layout back but leaves every line break to the draft's choice. Here the layout is fixed
//! by the depth, so the separators, line breaks and indentation stay forced.
//!
//! llguidance's JSON compiler has one item separator for every depth, so the objects and
//! arrays are written here in its Lark, and every other part of the schema (strings, numbers,
//! enums, `anyOf`, maps, bounded arrays) stays llguidance's JSON, compact, embedded with
//! `%json`: its validity is llguidance's. An object's members are the ones the schema names,
//! in its order; members it does not name are not written even where the schema would allow
//! them, which keeps every answer valid. A schema this does not lay out (its root is not such
//! an object, its references cycle) is compiled compact as before.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::compact::compact;

/// How a JSON answer is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonLayout {
    /// On one line, `", "` between items and `": "` after keys.
    Compact,
    /// On lines, indented by depth (this module).
    Indented,
}

impl JsonLayout {
    /// The policy's name for it.
    pub fn name(self) -> &'static str {
        match self {
            JsonLayout::Compact => "compact",
            JsonLayout::Indented => "indented",
        }
    }

    /// From the policy's name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "compact" => Some(JsonLayout::Compact),
            "indented" => Some(JsonLayout::Indented),
            _ => None,
        }
    }
}

/// Deepest level laid out on lines; deeper values are compact.
const MAX_DEPTH: usize = 8;

/// Most `$ref`s followed while inlining a schema's definitions.
const MAX_REFS: usize = 256;

/// Keys an object node may carry and still be laid out here; any other keyword (a
/// `patternProperties`, a `minProperties`, an `anyOf` beside the properties) leaves the node to
/// llguidance.
const OBJECT_KEYS: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "title",
    "description",
];

/// A container's brackets.
const OBJECT: (char, char) = ('{', '}');
const ARRAY: (char, char) = ('[', ']');

/// Keys an array node may carry and still be laid out here.
const ARRAY_KEYS: &[&str] = &["type", "items", "title", "description"];

/// The indented grammar of an answer that is `schema`, in llguidance's Lark; `None` where
/// the schema's root is not an object this lays out.
pub fn schema_lark(schema: &Value) -> Option<String> {
    let schema = inline_refs(schema)?;
    let mut g = Lark::default();
    let root = g.object(&schema, 0)?;
    Some(g.finish(&root))
}

/// The indented grammar of any JSON object (JSON mode).
pub fn any_object_lark() -> String {
    let mut g = Lark::default();
    let root = g.any_object(0);
    g.finish(&root)
}

/// The node's keywords, where it is of `kind` with no keyword but `keys`, above [`MAX_DEPTH`].
fn laid_out<'a>(
    schema: &'a Value,
    depth: usize,
    kind: &str,
    keys: &[&str],
) -> Option<&'a Map<String, Value>> {
    let m = schema.as_object()?;
    let fits = depth < MAX_DEPTH
        && m.get("type").and_then(Value::as_str) == Some(kind)
        && m.keys().all(|k| keys.contains(&k.as_str()));
    fits.then_some(m)
}

/// A Lark string literal (JSON's escapes are Lark's).
fn literal(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

fn indent(depth: usize) -> String {
    "  ".repeat(depth)
}

/// The rules written so far, with the leaves shared by their schema.
#[derive(Default)]
struct Lark {
    rules: Vec<String>,
    leaves: HashMap<String, String>,
    /// Any object (`false`) or any value (`true`) at a depth.
    any: HashMap<(bool, usize), String>,
}

impl Lark {
    fn finish(mut self, root: &str) -> String {
        self.rules.insert(0, format!("start: {root}"));
        self.rules.join("\n") + "\n"
    }

    fn rule(&mut self, body: String) -> String {
        let name = format!("r{}", self.rules.len());
        self.rules.push(format!("{name}: {body}"));
        name
    }

    /// A value llguidance writes, compact, under `schema`.
    fn leaf(&mut self, schema: &Value) -> String {
        let text = compact(schema.clone()).to_string();
        if let Some(name) = self.leaves.get(&text) {
            return name.clone();
        }
        let name = self.rule(format!("%json {text}"));
        self.leaves.insert(text, name.clone());
        name
    }

    /// A value at `depth`: laid out here if it is an object or array this lays out, else a
    /// leaf.
    fn value(&mut self, schema: &Value, depth: usize) -> String {
        if let Some(o) = self.object(schema, depth) {
            return o;
        }
        if let Some(a) = self.array(schema, depth) {
            return a;
        }
        self.leaf(schema)
    }

    /// An object with named members, each on a line.
    fn object(&mut self, schema: &Value, depth: usize) -> Option<String> {
        let m = laid_out(schema, depth, "object", OBJECT_KEYS)?;
        let props = m.get("properties").and_then(Value::as_object);
        let extra = m.get("additionalProperties");
        let Some(props) = props.filter(|p| !p.is_empty()) else {
            // No named members: any object, where the schema says nothing of the others.
            return match extra {
                None | Some(Value::Bool(true)) => Some(self.any_object(depth)),
                _ => None,
            };
        };
        if !matches!(extra, None | Some(Value::Bool(_))) {
            return None;
        }
        let required: Vec<&str> = match m.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r.iter().map(Value::as_str).collect::<Option<_>>()?,
            Some(_) => return None,
        };
        if required.iter().any(|r| !props.contains_key(*r)) {
            return None;
        }
        let pad = indent(depth + 1);
        let mut members = Vec::with_capacity(props.len());
        for (key, sub) in props {
            let head = literal(&format!("{pad}{}: ", Value::String(key.clone())));
            let value = self.value(sub, depth + 1);
            members.push((format!("{head} {value}"), required.contains(&key.as_str())));
        }
        let close = literal(&format!("\n{}}}", indent(depth)));
        let body = members_rules(self, &members);
        let some = format!("\"{{\\n\" {} {close}", body.nonempty);
        Some(self.rule(if body.may_be_empty {
            format!("\"{{}}\" | {some}")
        } else {
            some
        }))
    }

    /// An array of one item schema: items one a line, or all on one line where the items are
    /// not containers laid out here.
    fn array(&mut self, schema: &Value, depth: usize) -> Option<String> {
        let m = laid_out(schema, depth, "array", ARRAY_KEYS)?;
        let items = m.get("items").cloned().unwrap_or(json!({}));
        if !items.is_object() {
            return None;
        }
        let block_item = self.value(&items, depth + 1);
        let container = matches!(items.get("type"), Some(t) if t == "object" || t == "array");
        let inline = (!container).then(|| self.leaf(&items));
        Some(self.block(ARRAY, &block_item, inline.as_deref(), depth))
    }

    /// A container at `depth` of any number of `item`s: empty, one an indented line, or (where
    /// `inline` is given) `inline` items on one line.
    fn block(
        &mut self,
        (open, close): (char, char),
        item: &str,
        inline: Option<&str>,
        depth: usize,
    ) -> String {
        let pad = literal(&format!("\n{}", indent(depth + 1)));
        let sep = literal(&format!(",\n{}", indent(depth + 1)));
        let end = literal(&format!("\n{}{close}", indent(depth)));
        let inline = inline.map_or(String::new(), |i| {
            format!(" | \"{open}\" {i} (\", \" {i})* \"{close}\"")
        });
        self.rule(format!(
            "\"{open}{close}\"{inline} | \"{open}\" {pad} {item} ({sep} {item})* {end}"
        ))
    }

    /// Any JSON object at `depth`, its members on lines, down to [`MAX_DEPTH`].
    fn any_object(&mut self, depth: usize) -> String {
        if let Some(name) = self.any.get(&(false, depth)) {
            return name.clone();
        }
        if depth >= MAX_DEPTH {
            return self.leaf(&json!({"type": "object"}));
        }
        let key = self.leaf(&json!({"type": "string"}));
        let value = self.any_value(depth + 1);
        let name = self.block(OBJECT, &format!("{key} \": \" {value}"), None, depth);
        self.any.insert((false, depth), name.clone());
        name
    }

    /// Any JSON value at `depth`.
    fn any_value(&mut self, depth: usize) -> String {
        if let Some(name) = self.any.get(&(true, depth)) {
            return name.clone();
        }
        if depth >= MAX_DEPTH {
            return self.leaf(&json!({}));
        }
        let scalar = self.leaf(&json!({"type": ["string", "number", "boolean", "null"]}));
        let object = self.any_object(depth);
        let item = self.any_value(depth + 1);
        let array = self.block(ARRAY, &item, Some(&scalar), depth);
        let name = self.rule(format!("{scalar} | {object} | {array}"));
        self.any.insert((true, depth), name.clone());
        name
    }
}

/// An object's members as rules: each member on its line, `",\n"` between them.
struct Members {
    /// The members when at least one is written.
    nonempty: String,
    /// Whether every member is optional, so that none at all is allowed too.
    may_be_empty: bool,
}

/// Optional members make the separators depend on what came before, as in llguidance's own
/// JSON compiler: after a member, each later one comes with its separator; before any, the
/// first written comes without.
fn members_rules(g: &mut Lark, members: &[(String, bool)]) -> Members {
    let n = members.len();
    // after[i]: the members from i on, some member already written (may be empty).
    let mut after: Vec<Option<String>> = vec![None; n + 1];
    for i in (0..n).rev() {
        let (member, required) = &members[i];
        let own = format!("\",\\n\" {member}");
        let own = if *required { own } else { format!("({own})?") };
        let body = match &after[i + 1] {
            Some(rest) => format!("{own} {rest}"),
            None => own,
        };
        after[i] = Some(g.rule(body));
    }
    // first[i]: the members from i on, none written yet, at least one now.
    let mut first: Option<String> = None;
    for i in (0..n).rev() {
        let (member, required) = &members[i];
        let with = match &after[i + 1] {
            Some(rest) => format!("{member} {rest}"),
            None => member.clone(),
        };
        let body = match (&first, required) {
            (Some(later), false) => format!("{with} | {later}"),
            _ => with,
        };
        first = Some(g.rule(body));
    }
    Members {
        nonempty: first.unwrap_or_default(),
        may_be_empty: members.iter().all(|(_, r)| !r),
    }
}

/// `schema` with every local `$ref` (`#/$defs/...`, `#/definitions/...`) replaced by what it
/// names, and the definitions dropped; `None` where a reference is not local, cycles, or the
/// inlined schema grows past the compiled limit.
fn inline_refs(schema: &Value) -> Option<Value> {
    let mut budget = MAX_REFS;
    let mut trail = Vec::new();
    let mut root = schema.as_object()?.clone();
    root.remove("$defs");
    root.remove("definitions");
    let out = resolve(schema, &Value::Object(root), &mut trail, &mut budget)?;
    (out.to_string().len() <= super::compact::MAX_SCHEMA_BYTES).then_some(out)
}

fn resolve(
    root: &Value,
    node: &Value,
    trail: &mut Vec<String>,
    budget: &mut usize,
) -> Option<Value> {
    match node {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref") {
                let r = r.as_str()?;
                // A reference beside other keywords narrows it; left to llguidance whole.
                if m.keys()
                    .any(|k| !matches!(k.as_str(), "$ref" | "title" | "description"))
                {
                    return None;
                }
                if trail.iter().any(|t| t == r) || *budget == 0 {
                    return None;
                }
                *budget -= 1;
                let target = pointer(root, r)?;
                trail.push(r.to_string());
                let out = resolve(root, target, trail, budget);
                trail.pop();
                return out;
            }
            m.iter()
                .map(|(k, v)| Some((k.clone(), resolve(root, v, trail, budget)?)))
                .collect::<Option<Map<_, _>>>()
                .map(Value::Object)
        }
        Value::Array(a) => a
            .iter()
            .map(|v| resolve(root, v, trail, budget))
            .collect::<Option<Vec<_>>>()
            .map(Value::Array),
        other => Some(other.clone()),
    }
}

/// What a local JSON pointer names.
fn pointer<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    let path = r.strip_prefix('#')?;
    if !(path.starts_with("/$defs/") || path.starts_with("/definitions/")) {
        return None;
    }
    root.pointer(path)
}

#[cfg(test)]
mod tests;
