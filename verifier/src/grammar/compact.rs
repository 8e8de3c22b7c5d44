//! What every grammar shares however it is built: JSON written on one line, and the largest
//! schema compiled.

use serde_json::{Value, json};

/// Largest schema text compiled; a larger one is refused as unsupported.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// JSON on one line under a grammar: no free whitespace, and the separators the chat models
/// write on one line (and `json.dumps` does). Free whitespace would leave every separator to
/// the draft's choice; fixed, the grammar forces it and no verifier or target sees it. Tool
/// calls' arguments are written so (the chat template writes them on one line), and so are
/// the parts of a schema [`JsonLayout::Indented`] leaves to llguidance.
pub(super) fn compact(mut schema: Value) -> Value {
    if let Value::Object(m) = &mut schema {
        m.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}
