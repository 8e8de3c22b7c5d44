//! The kinds of target a policy can name, and what each can do: the one table every other
//! site asks. Adding a kind is its client's file plus, here, one variant, its row of
//! [`Abilities`] and the arm of [`TargetKind::abilities`] that names the row; its policy name
//! comes from the variant (strum), never from a match of names elsewhere.

use std::sync::Arc;

use strum::{EnumString, IntoStaticStr, VariantArray, VariantNames};

use super::transport::join;
use super::{
    ChatOnlyTarget, ChatPrefixTarget, LlamaCppTarget, OpenAiCompletionsTarget, OpenAiTextTarget,
    PrefixStyle, SglangTarget, TargetClient, TargetConfig,
};
use crate::error::TargetError;
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;

/// The kinds a policy can name, by their snake_case names.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, EnumString, IntoStaticStr, VariantNames, VariantArray,
)]
#[strum(serialize_all = "snake_case")]
pub enum TargetKind {
    /// llama.cpp `llama-server`.
    LlamaCpp,
    /// `/v1/completions` with token-id prompts and `return_token_ids`: vLLM, and servers that
    /// accept token ids the same way (SGLang, Fireworks). Policies may also say `"openai"`,
    /// its earlier name.
    #[strum(to_string = "vllm", serialize = "openai")]
    Vllm,
    /// SGLang's native `/generate` with token ids, at the server root: its radix cache serves
    /// a window call's prefix, where vLLM's prefix cache skips a call that asks for prompt
    /// log-probabilities.
    Sglang,
    /// OpenAI-compatible `/v1/completions` with a *text* prompt (Together, OpenRouter,
    /// DeepSeek's beta completions, TGI, llama-server): approxy sends the rendered prompt and
    /// the answer so far as text and re-tokenizes what comes back. No tokenizer in common with
    /// the draft is needed.
    OpenaiText,
    /// Chat completions whose last message is the partial assistant answer, marked as
    /// [`PrefixStyle`] says (DeepSeek and Mistral `prefix: true`, vLLM
    /// `continue_final_message`, llama-server's assistant prefill). Text level, like
    /// `openai_text`, and the provider applies its own chat template.
    ChatPrefix,
    /// An OpenAI-compatible chat API that cannot continue a partial assistant answer (OpenAI's
    /// current chat models, current Claude models): passthrough only.
    #[strum(serialize = "openai_chat")]
    OpenAiChat,
}

/// Builds a kind's client from the connection settings, the draft's tokenizer (text-level
/// kinds re-tokenize with it) and the text settings.
pub type Connect =
    fn(TargetConfig, &Tokenizer, &TextSettings) -> Result<Arc<dyn TargetClient>, TargetError>;

/// What one kind of target can do.
#[derive(Clone, Copy)]
pub struct Abilities {
    /// Continues an exact prefix, which approximate mode needs (a chat-only API cannot).
    pub continues: bool,
    /// Sent text rather than token ids: it needs no tokenizer in common with the draft
    /// (nothing to check), its answers are re-tokenized, and it is a hosted API whose cache
    /// keys on `prompt_cache_key` (sent by default).
    pub text_level: bool,
    /// Continues a chat answer, marked in a [`PrefixStyle`]: it needs the chat messages, so a
    /// completions request cannot be continued by it.
    pub chat_prefix: bool,
    /// Takes a chat template of its own (it is sent a rendered prompt).
    pub chat_template: bool,
    /// Scores a window of draft tokens in one call (it returns prompt log-probabilities).
    pub scores_windows: bool,
    /// The block its prompt cache serves re-sent prefixes in, by default (vLLM caches whole
    /// 16-token blocks; llama.cpp any common prefix).
    pub cache_block: u64,
    /// Writes until its context is full when `max_tokens` asks for more than is left, rather
    /// than refusing the request.
    pub fills_context: bool,
    /// Can keep an answer's calls on one of its slots when the policy asks
    /// (`target.cache.slots`; llama-server's `id_slot`).
    pub names_slots: bool,
    /// Goes on generating after approxy closes a stream before its end, until it notices at
    /// its next write (llama-server: [`crate::cost::TOKENS_IN_FLIGHT_AT_CLOSE`], measured;
    /// vLLM aborts at once). A span's calls then ask by default for only the tokens that
    /// could end it ([`crate::SpanAsk::Fewest`]), which its prompt cache makes cheap, unless
    /// the model gives a price list. Not said of hosted APIs, where each call re-sends the
    /// prefix at the input price.
    pub writes_after_close: bool,
    /// What its base URL needs to name its OpenAI-compatible API (passthrough's base).
    pub openai_suffix: &'static str,
    /// Where its server's own counters are, from its base URL (`/metrics` in a format
    /// [`super::counters::TargetCounters`] reads); `None`: there are none approxy reads.
    pub counters: fn(&str) -> Option<String>,
    /// Its client.
    pub connect: Connect,
}

impl std::fmt::Debug for Abilities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Abilities")
            .field("continues", &self.continues)
            .field("text_level", &self.text_level)
            .field("chat_prefix", &self.chat_prefix)
            .field("scores_windows", &self.scores_windows)
            .finish_non_exhaustive()
    }
}

impl TargetKind {
    /// What this kind can do: its row of the table.
    pub fn abilities(self) -> Abilities {
        match self {
            TargetKind::LlamaCpp => LLAMA_CPP,
            TargetKind::Vllm => VLLM,
            TargetKind::Sglang => SGLANG,
            TargetKind::OpenaiText => OPENAI_TEXT,
            TargetKind::ChatPrefix => CHAT_PREFIX,
            TargetKind::OpenAiChat => OPENAI_CHAT,
        }
    }

    /// Whether the target can continue an exact prefix, which approximate mode needs.
    pub fn can_continue(self) -> bool {
        self.abilities().continues
    }

    /// Whether the target is sent text rather than token ids: it then needs no tokenizer in
    /// common with the draft (nothing to check), and its answers are re-tokenized.
    pub fn is_text_level(self) -> bool {
        self.abilities().text_level
    }

    /// Whether it needs the chat messages (a completions request cannot be continued by it).
    pub fn needs_messages(self) -> bool {
        self.abilities().chat_prefix
    }

    /// The name policies use.
    pub fn policy_name(self) -> &'static str {
        self.into()
    }

    /// Every kind.
    pub const ALL: &'static [TargetKind] = <Self as VariantArray>::VARIANTS;

    /// Their policy names, in the same order.
    pub const NAMES: &'static [&'static str] = <Self as VariantNames>::VARIANTS;

    /// The kind a policy names (one of [`TargetKind::NAMES`], or an alias).
    pub fn parse(name: &str) -> Result<Self, String> {
        name.parse()
            .map_err(|_| format!("{name:?} is not one of {}", quoted(Self::NAMES)))
    }
}

// The table's rows. Each is written out whole, so that a new field or a new kind is decided
// for each kind rather than inherited.

/// [`TargetKind::LlamaCpp`].
const LLAMA_CPP: Abilities = Abilities {
    continues: true,
    text_level: false,
    chat_prefix: false,
    chat_template: false,
    scores_windows: false,
    cache_block: 1,
    fills_context: true,
    names_slots: true,
    writes_after_close: true,
    openai_suffix: "/v1",
    // With `--metrics` (the run command starts it so).
    counters: |base| Some(join(base, "/metrics")),
    connect: |cfg, _, _| Ok(Arc::new(LlamaCppTarget::new(cfg)?)),
};

/// [`TargetKind::Vllm`].
const VLLM: Abilities = Abilities {
    continues: true,
    text_level: false,
    chat_prefix: false,
    chat_template: false,
    scores_windows: true,
    cache_block: 16,
    fills_context: false,
    names_slots: false,
    // It generated nothing after approxy closed a stream (policies/README.md, "Busy
    // pricing").
    writes_after_close: false,
    openai_suffix: "",
    // At the server root, beside the `/v1` the base URL names.
    counters: |base| {
        let root = base.trim_end_matches('/').trim_end_matches("/v1");
        Some(join(root, "/metrics"))
    },
    connect: |cfg, _, _| Ok(Arc::new(OpenAiCompletionsTarget::new(cfg)?)),
};

/// [`TargetKind::Sglang`].
const SGLANG: Abilities = Abilities {
    continues: true,
    text_level: false,
    chat_prefix: false,
    chat_template: false,
    scores_windows: true,
    // The radix cache serves any common prefix at its default page size of 1 (a larger
    // `--page-size` is the policy's `cache.block`).
    cache_block: 1,
    // It refuses a request whose prompt and `max_new_tokens` exceed the context.
    fills_context: false,
    names_slots: false,
    writes_after_close: false,
    // The base URL is the server root; its OpenAI API is under `/v1`.
    openai_suffix: "/v1",
    // Its `--enable-metrics` counters are named otherwise and give no compute time.
    counters: |_| None,
    connect: |cfg, _, _| Ok(Arc::new(SglangTarget::new(cfg)?)),
};

/// [`TargetKind::OpenaiText`].
const OPENAI_TEXT: Abilities = Abilities {
    continues: true,
    text_level: true,
    chat_prefix: false,
    chat_template: true,
    scores_windows: false,
    cache_block: 1,
    fills_context: false,
    names_slots: false,
    writes_after_close: false,
    openai_suffix: "",
    counters: |_| None,
    connect: |cfg, tok, text| {
        Ok(Arc::new(
            OpenAiTextTarget::new(cfg, tok.clone())?.with_template(text.chat_template.clone()),
        ))
    },
};

/// [`TargetKind::ChatPrefix`].
const CHAT_PREFIX: Abilities = Abilities {
    continues: true,
    text_level: true,
    chat_prefix: true,
    chat_template: false,
    scores_windows: false,
    cache_block: 1,
    fills_context: false,
    names_slots: false,
    writes_after_close: false,
    openai_suffix: "",
    counters: |_| None,
    connect: |cfg, tok, text| {
        Ok(Arc::new(ChatPrefixTarget::new(
            cfg,
            tok.clone(),
            text.prefix_style,
        )?))
    },
};

/// [`TargetKind::OpenAiChat`].
const OPENAI_CHAT: Abilities = Abilities {
    continues: false,
    text_level: false,
    chat_prefix: false,
    chat_template: false,
    scores_windows: false,
    cache_block: 1,
    fills_context: false,
    names_slots: false,
    writes_after_close: false,
    openai_suffix: "",
    counters: |_| None,
    connect: |cfg, _, _| Ok(Arc::new(ChatOnlyTarget::new(cfg)?)),
};

/// The names of the kinds that have an ability, for an error message ("vllm", "a or b").
pub fn kinds_that(has: impl Fn(&Abilities) -> bool) -> String {
    TargetKind::ALL
        .iter()
        .filter(|k| has(&k.abilities()))
        .map(|k| k.policy_name())
        .collect::<Vec<_>>()
        .join(" or ")
}

/// `"a", "b", "c"`: the names a choice may take, for an error message.
pub fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the text-level kinds need beyond the connection.
#[derive(Debug, Clone, Default)]
pub struct TextSettings {
    /// How a `chat_prefix` target is told to continue.
    pub prefix_style: PrefixStyle,
    /// The target's own chat template, for an `openai_text` target of another model family
    /// (otherwise the prompt is the draft's rendering).
    pub chat_template: Option<Arc<ChatTemplate>>,
}

/// Builds a client of the given kind. Text-level kinds re-tokenize with the draft's
/// `tokenizer`.
pub fn build(
    kind: TargetKind,
    cfg: TargetConfig,
    tokenizer: &Tokenizer,
    text: &TextSettings,
) -> Result<Arc<dyn TargetClient>, TargetError> {
    (kind.abilities().connect)(cfg, tokenizer, text)
}

#[cfg(test)]
mod abilities_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_parses_by_its_own_name_and_vllm_by_its_earlier_one() {
        for &k in TargetKind::NAMES {
            assert_eq!(TargetKind::parse(k).map(TargetKind::policy_name), Ok(k));
        }
        assert_eq!(TargetKind::ALL.len(), TargetKind::NAMES.len());
        assert_eq!(
            TargetKind::NAMES,
            [
                "llama_cpp",
                "vllm",
                "sglang",
                "openai_text",
                "chat_prefix",
                "openai_chat"
            ]
        );
        assert_eq!(TargetKind::parse("openai"), Ok(TargetKind::Vllm));
        assert!(TargetKind::parse("grpc").is_err_and(|e| e.contains("\"llama_cpp\", \"vllm\"")));
    }

    #[test]
    fn a_kind_that_cannot_continue_has_nothing_else() {
        for &k in TargetKind::ALL {
            let a = k.abilities();
            assert!(a.continues || !(a.text_level || a.chat_prefix || a.scores_windows));
            assert!(!a.chat_prefix || a.text_level);
        }
    }
}
