//! What a request to the engine is made of, for a server that validates its own requests into
//! these, as TGI's `Validation` returns a valid request: the messages and the chat template
//! that make them a prompt, the tokenizer that counts and cuts it, the sampling settings, the
//! structured-output and tool specs the grammar compiles, the cost guard a request carries,
//! and the [`GenerateRequest`] the facade ([`crate::infer`]) runs on its draft leases.
//!
//! A face: it only names the pieces, which live where they are used.

pub use crate::cost::Guard;
pub use crate::decode::GenerateRequest;
pub use crate::draft::Draft;
pub use crate::grammar::tools::{CALL_CLOSE, CALL_OPEN};
pub use crate::grammar::{
    Constraint, GrammarSpec, JsonStyle, Tool, ToolChoice, ToolsSpec, Unsupported,
};
pub use crate::sampling::SamplingParams;
pub use crate::template::{ChatMessage, ChatTemplate, Segment};
pub use crate::tokenizer::{Tokenizer, TooMany};
