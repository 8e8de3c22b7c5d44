//! Where approxy's cached assets live: `$APPROXY_HOME`, default `$XDG_CACHE_HOME/approxy`
//! (`~/.cache/approxy` when that is not set). Shared
//! by `approxy setup` (which fills it), the gateway and the tests (which read it).

use std::path::PathBuf;

/// File name of the target GGUF under `models/`.
pub const TARGET_GGUF_NAME: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
/// File name of the draft GGUF under `models/`.
pub const DRAFT_GGUF_NAME: &str = "qwen2.5-coder-0.5b-instruct.gguf";
/// sha256 of the pinned draft GGUF: the draft's identity, which learned verifier artifacts
/// name so that one trained for another draft is refused.
pub const DRAFT_GGUF_SHA256: &str =
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32";
/// File name of the ONNX Runtime library under `lib/`.
pub const ONNXRUNTIME_LIB_NAME: &str = "libonnxruntime.so.1.31.1";

/// Well-known paths inside `$APPROXY_HOME`.
#[derive(Debug, Clone)]
pub struct Home {
    /// The root.
    pub root: PathBuf,
}

impl Home {
    /// `$APPROXY_HOME`, else `$XDG_CACHE_HOME/approxy`, else `~/.cache/approxy`.
    pub fn from_env() -> anyhow::Result<Self> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        root(var("APPROXY_HOME"), var("XDG_CACHE_HOME"), var("HOME"))
            .map(|root| Self { root })
            .ok_or_else(|| anyhow::anyhow!("neither APPROXY_HOME nor HOME is set"))
    }

    /// The target GGUF.
    pub fn target_gguf(&self) -> PathBuf {
        self.root.join("models").join(TARGET_GGUF_NAME)
    }
    /// A small model with another tokenizer (SmolLM2-135M-Instruct): the test target for
    /// text-level kinds in front of a model that does not share the draft's vocabulary.
    pub fn other_tokenizer_gguf(&self) -> PathBuf {
        self.root
            .join("models")
            .join("smollm2-135m-instruct-q4_1.gguf")
    }
    /// The draft GGUF.
    pub fn draft_gguf(&self) -> PathBuf {
        self.root.join("models").join(DRAFT_GGUF_NAME)
    }
    /// Directory with the draft ONNX model, tokenizer.json and chat template.
    pub fn draft_onnx_dir(&self) -> PathBuf {
        self.root.join("models").join("draft-onnx")
    }
    /// Another conversion of the draft, by name (`approxy setup --draft-variants`, compared by
    /// `approxy bench draft-fidelity`).
    pub fn draft_variant_dir(&self, name: &str) -> PathBuf {
        self.root.join("models").join("draft-variants").join(name)
    }
    /// The draft as a float32 Hugging Face checkpoint, served by the vLLM test target.
    pub fn draft_hf_dir(&self) -> PathBuf {
        self.root.join("models").join("draft-hf")
    }
    /// The 1.5B target dequantised to float32 safetensors, for a vLLM target (`approxy setup
    /// --vllm`).
    pub fn target_hf_dir(&self) -> PathBuf {
        self.root.join("models").join("target-hf")
    }
    /// The venv with vLLM's CPU build.
    pub fn vllm_venv(&self) -> PathBuf {
        self.root.join("venv").join("vllm")
    }
    /// The `llama-server` binary.
    pub fn llama_server(&self) -> PathBuf {
        self.root.join("bin").join("llama-server")
    }
    /// The `oha` HTTP load generator (for `approxy bench overhead`).
    pub fn oha(&self) -> PathBuf {
        self.root.join("bin").join("oha")
    }
    /// The ONNX Runtime shared library.
    pub fn onnxruntime_lib(&self) -> PathBuf {
        self.root.join("lib").join(ONNXRUNTIME_LIB_NAME)
    }
    /// HumanEval problems (gzipped JSONL), the evaluation set.
    pub fn human_eval(&self) -> PathBuf {
        self.root.join("data").join("HumanEval.jsonl.gz")
    }
    /// Where step logs go.
    pub fn log(&self, step: &str) -> PathBuf {
        self.root.join("logs").join(format!("{step}.log"))
    }
    /// Scratch space for downloads and builds, removed by each step when it succeeds.
    pub fn work(&self, step: &str) -> PathBuf {
        self.root.join("work").join(step)
    }
}

/// The cache root from `APPROXY_HOME`, `XDG_CACHE_HOME` and `HOME`. A relative
/// `XDG_CACHE_HOME` is ignored, as the XDG base directory specification says.
fn root(
    approxy_home: Option<std::ffi::OsString>,
    xdg_cache_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    if let Some(p) = approxy_home {
        return Some(PathBuf::from(p));
    }
    let xdg = xdg_cache_home
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    xdg.or_else(|| home.map(|h| PathBuf::from(h).join(".cache")))
        .map(|cache| cache.join("approxy"))
}

#[cfg(test)]
mod root_tests {
    use super::root;
    use std::path::PathBuf;

    #[test]
    fn approxy_home_then_xdg_cache_home_then_home() {
        let s = |v: &str| Some(std::ffi::OsString::from(v));
        assert_eq!(root(s("/a"), s("/x"), s("/h")), Some(PathBuf::from("/a")));
        assert_eq!(
            root(None, s("/x"), s("/h")),
            Some(PathBuf::from("/x/approxy"))
        );
        assert_eq!(
            root(None, s("rel"), s("/h")),
            Some(PathBuf::from("/h/.cache/approxy"))
        );
        assert_eq!(
            root(None, None, s("/h")),
            Some(PathBuf::from("/h/.cache/approxy"))
        );
        assert_eq!(root(None, None, None), None);
    }
}
