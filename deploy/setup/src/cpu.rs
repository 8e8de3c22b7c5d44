//! The CPU's instruction sets, read from `/proc/cpuinfo`, and the llama.cpp build that follows
//! from them. These machines differ from one session to the next (an Intel Xeon with AVX-512
//! and AMX that a process may not use, an AMD EPYC with AVX-512, an AMD EPYC with AVX2 only),
//! so a build with fixed ISA flags dies with "Illegal instruction" on some of them. The
//! selection is a pure function of the cpuinfo text, tested on fixtures of each kind.
//!
//! Why flags chosen per CPU rather than llama.cpp's runtime-dispatched `GGML_CPU_ALL_VARIANTS`:
//! that builds the CPU backend once per variant (about eight times, on two cores) and needs
//! shared libraries beside the binary; choosing the flags once keeps the build at one backend
//! and gives the fastest code this CPU can run. The price is a rebuild when a cache meets a
//! CPU that lacks a feature it was built for, which `approxy setup` detects and does.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// What one CPU offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuFeatures {
    /// `model name`, for messages.
    pub model: String,
    /// The kernel's feature flags (already cleared by Linux for what the OS does not enable).
    pub flags: BTreeSet<String>,
}

impl CpuFeatures {
    /// Parses `/proc/cpuinfo` text: the first processor's `model name` and `flags`.
    pub fn parse(cpuinfo: &str) -> Self {
        let field = |name: &str| {
            cpuinfo.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().to_string())
            })
        };
        Self {
            model: field("model name").unwrap_or_else(|| "unknown CPU".to_string()),
            flags: field("flags")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect(),
        }
    }

    /// The CPU this process runs on, from `/proc/cpuinfo` (never the file
    /// `APPROXY_SETUP_CPUINFO` names): what measurements report.
    pub fn this_machine() -> Self {
        Self::parse(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default())
    }

    /// The CPU to build for: this machine's, or the one described by the cpuinfo file named in
    /// `APPROXY_SETUP_CPUINFO`. That builds a cache for another, smaller CPU (an AVX2-only fleet
    /// prepared on an AVX-512 machine); each part is still run here before it is accepted, so
    /// the file must describe a CPU whose features this one has.
    pub fn current() -> anyhow::Result<Self> {
        let path =
            std::env::var_os("APPROXY_SETUP_CPUINFO").unwrap_or_else(|| "/proc/cpuinfo".into());
        let text = std::fs::read_to_string(&path).map_err(|e| {
            anyhow::anyhow!(
                "cannot read {} to choose build flags: {e}",
                std::path::Path::new(&path).display()
            )
        })?;
        Ok(Self::parse(&text))
    }

    /// The features in `required` this CPU lacks.
    pub fn missing<'a>(&self, required: &'a [String]) -> Vec<&'a str> {
        required
            .iter()
            .filter(|f| !self.flags.contains(f.as_str()))
            .map(String::as_str)
            .collect()
    }

    /// The SIMD-relevant flags, for messages (the full list is long).
    pub fn simd_summary(&self) -> String {
        let shown: Vec<&str> = self
            .flags
            .iter()
            .map(String::as_str)
            .filter(|f| {
                f.starts_with("avx")
                    || f.starts_with("amx")
                    || matches!(*f, "sse4_2" | "fma" | "f16c" | "bmi2")
            })
            .collect();
        if shown.is_empty() {
            "no AVX or SSE4.2".to_string()
        } else {
            shown.join(" ")
        }
    }
}

/// What a native asset was built for, recorded in the manifest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BuiltFor {
    /// How the asset uses the instruction set, in words.
    pub isa: String,
    /// cpuinfo flags the asset needs; a CPU lacking any of them must not run it.
    pub requires: Vec<String>,
    /// The CPU it was built for: this machine's, or the one `APPROXY_SETUP_CPUINFO` described
    /// (the run checks still ran on this machine).
    pub verified_on: String,
}

/// One ggml ISA option and the cpuinfo flags it compiles in. Each list includes what the
/// option builds on (AVX2 code is also AVX code), so one check answers "may this be ON".
struct IsaOption {
    cmake: &'static str,
    needs: &'static [&'static str],
}

const AVX512_BASE: &[&str] = &[
    "avx", "avx2", "avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw",
];

/// ggml's x86 options (vendor/llama.cpp/ggml/src/ggml-cpu/CMakeLists.txt maps each to its
/// `-m` flags), in the order ggml lists them.
const LLAMA_ISA: &[IsaOption] = &[
    IsaOption {
        cmake: "GGML_SSE42",
        needs: &["sse4_2"],
    },
    IsaOption {
        cmake: "GGML_AVX",
        needs: &["avx"],
    },
    IsaOption {
        cmake: "GGML_F16C",
        needs: &["avx", "f16c"],
    },
    IsaOption {
        cmake: "GGML_FMA",
        needs: &["avx", "fma"],
    },
    IsaOption {
        cmake: "GGML_BMI2",
        needs: &["bmi2"],
    },
    IsaOption {
        cmake: "GGML_AVX2",
        needs: &["avx", "avx2"],
    },
    IsaOption {
        cmake: "GGML_AVX_VNNI",
        needs: &["avx", "avx2", "avx_vnni"],
    },
    IsaOption {
        cmake: "GGML_AVX512",
        needs: AVX512_BASE,
    },
    IsaOption {
        cmake: "GGML_AVX512_VBMI",
        needs: &[
            "avx",
            "avx2",
            "avx512f",
            "avx512cd",
            "avx512vl",
            "avx512dq",
            "avx512bw",
            "avx512vbmi",
        ],
    },
    IsaOption {
        cmake: "GGML_AVX512_VNNI",
        needs: &[
            "avx",
            "avx2",
            "avx512f",
            "avx512cd",
            "avx512vl",
            "avx512dq",
            "avx512bw",
            "avx512_vnni",
        ],
    },
    IsaOption {
        cmake: "GGML_AVX512_BF16",
        needs: &[
            "avx",
            "avx2",
            "avx512f",
            "avx512cd",
            "avx512vl",
            "avx512dq",
            "avx512bw",
            "avx512_bf16",
        ],
    },
];

/// Always OFF: these CPUs advertise AMX, but the kernel does not let a process use it
/// (`GGML_NATIVE=ON` picks it up and the binary dies).
const NEVER: &[&str] = &["GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"];

/// The ISA part of a llama.cpp build for one CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlamaIsa {
    /// `-DGGML_…=ON|OFF` for every x86 option, explicitly (never `GGML_NATIVE`).
    pub cmake_flags: Vec<String>,
    /// The options turned ON.
    pub enabled: Vec<&'static str>,
    /// The cpuinfo flags the result needs.
    pub requires: Vec<String>,
}

/// Chooses llama.cpp's ISA options for `cpu`: each option ON exactly when the CPU has every
/// flag it compiles in, AMX never, native detection off.
pub fn llama_cpp_isa(cpu: &CpuFeatures) -> LlamaIsa {
    let mut cmake_flags = vec!["-DGGML_NATIVE=OFF".to_string()];
    let mut enabled = Vec::new();
    let mut requires = BTreeSet::new();
    for opt in LLAMA_ISA {
        let on = opt.needs.iter().all(|f| cpu.flags.contains(*f));
        cmake_flags.push(format!("-D{}={}", opt.cmake, if on { "ON" } else { "OFF" }));
        if on {
            enabled.push(opt.cmake);
            requires.extend(opt.needs.iter().map(|f| f.to_string()));
        }
    }
    cmake_flags.extend(NEVER.iter().map(|o| format!("-D{o}=OFF")));
    LlamaIsa {
        cmake_flags,
        enabled,
        requires: requires.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> CpuFeatures {
        let text = match name {
            "amd-avx2" => include_str!("cpuinfo/amd-epyc-avx2.txt"),
            "amd-avx512" => include_str!("cpuinfo/amd-epyc-avx512.txt"),
            "xeon-amx" => include_str!("cpuinfo/intel-xeon-avx512-amx.txt"),
            _ => include_str!("cpuinfo/plain-x86-64.txt"),
        };
        CpuFeatures::parse(text)
    }

    fn is_on(isa: &LlamaIsa, opt: &str) -> bool {
        isa.cmake_flags.contains(&format!("-D{opt}=ON"))
    }

    fn assert_never_native_or_amx(isa: &LlamaIsa) {
        assert!(isa.cmake_flags.contains(&"-DGGML_NATIVE=OFF".to_string()));
        for o in NEVER {
            assert!(
                isa.cmake_flags.contains(&format!("-D{o}=OFF")),
                "{o} must be OFF"
            );
        }
        assert!(!isa.requires.iter().any(|f| f.starts_with("amx")));
    }

    #[test]
    fn avx2_only_amd_gets_no_avx512() {
        let cpu = fixture("amd-avx2");
        assert_eq!(cpu.model, "AMD EPYC 7B13");
        let isa = llama_cpp_isa(&cpu);
        for o in [
            "GGML_SSE42",
            "GGML_AVX",
            "GGML_F16C",
            "GGML_FMA",
            "GGML_BMI2",
            "GGML_AVX2",
        ] {
            assert!(is_on(&isa, o), "{o} should be ON: {:?}", isa.cmake_flags);
        }
        for o in [
            "GGML_AVX_VNNI",
            "GGML_AVX512",
            "GGML_AVX512_VBMI",
            "GGML_AVX512_VNNI",
            "GGML_AVX512_BF16",
        ] {
            assert!(!is_on(&isa, o), "{o} must be OFF on an AVX2-only CPU");
        }
        assert_never_native_or_amx(&isa);
        assert!(cpu.missing(&isa.requires).is_empty());
    }

    #[test]
    fn xeon_gets_avx512_but_never_amx() {
        let cpu = fixture("xeon-amx");
        assert!(cpu.flags.contains("amx_tile"), "fixture advertises AMX");
        let isa = llama_cpp_isa(&cpu);
        for o in [
            "GGML_AVX2",
            "GGML_AVX_VNNI",
            "GGML_AVX512",
            "GGML_AVX512_VBMI",
            "GGML_AVX512_VNNI",
            "GGML_AVX512_BF16",
        ] {
            assert!(is_on(&isa, o), "{o} should be ON: {:?}", isa.cmake_flags);
        }
        assert_never_native_or_amx(&isa);
    }

    #[test]
    fn amd_with_avx512_gets_avx512() {
        let isa = llama_cpp_isa(&fixture("amd-avx512"));
        assert!(is_on(&isa, "GGML_AVX512") && is_on(&isa, "GGML_AVX512_BF16"));
        assert_never_native_or_amx(&isa);
    }

    #[test]
    fn plain_x86_64_gets_baseline_only() {
        let cpu = fixture("plain");
        let isa = llama_cpp_isa(&cpu);
        assert!(isa.enabled.is_empty(), "{:?}", isa.enabled);
        assert!(isa.requires.is_empty());
        assert_never_native_or_amx(&isa);
        assert_eq!(cpu.simd_summary(), "no AVX or SSE4.2");
    }

    #[test]
    fn a_cache_built_on_the_xeon_does_not_fit_the_avx2_amd() {
        let built = llama_cpp_isa(&fixture("xeon-amx"));
        let missing = fixture("amd-avx2").missing(&built.requires);
        assert!(missing.contains(&"avx512f"), "{missing:?}");
        // ... but a build for the AVX2 machine runs on every AVX-512 machine.
        let avx2 = llama_cpp_isa(&fixture("amd-avx2"));
        assert!(fixture("xeon-amx").missing(&avx2.requires).is_empty());
        assert!(fixture("amd-avx512").missing(&avx2.requires).is_empty());
        assert!(!fixture("plain").missing(&avx2.requires).is_empty());
    }

    #[test]
    fn every_option_is_set_explicitly() {
        // An option left to ggml's default would follow GGML_NATIVE's default instead of this CPU.
        for name in ["amd-avx2", "xeon-amx", "plain"] {
            let isa = llama_cpp_isa(&fixture(name));
            assert_eq!(isa.cmake_flags.len(), 1 + LLAMA_ISA.len() + NEVER.len());
        }
    }
}
