//! The target section: its kind, address, prefix style, template, cache and prior rates.

use std::path::PathBuf;
use std::time::Duration;

use approxy_verifier::policy::{
    Abilities, BusyRates, CacheHints, CacheRules, PrefixStyle, TargetKind, kinds_that,
};

use crate::policy::raw::{RawBusyRates, RawCache, RawTarget};
use crate::policy::typed::TargetPolicy;

use super::*;

impl Validator {
    /// The `target` table: its kind first, since what else it may set depends on the kind.
    pub(super) fn target(&mut self, t: RawTarget) -> TargetPolicy {
        let kind = TargetKind::parse(&t.kind).unwrap_or_else(|e| {
            self.err(format!("target.kind: {e}"));
            TargetKind::LlamaCpp
        });
        let can = kind.abilities();
        let prefix_style = self.prefix_style(t.prefix_style.as_deref(), can);
        let chat_template = self.chat_template(t.chat_template.as_deref(), can);
        let (cache_hints, cache_rules) = self.cache(t.cache.unwrap_or_default(), can);
        self.base_url(&t.base_url);
        let target = TargetPolicy {
            kind,
            base_url: t.base_url,
            api_key_env: t.api_key_env,
            timeout: self.duration(
                "target.timeout",
                t.timeout,
                Duration::from_secs(120),
                LEAST_DEADLINE,
            ),
            retries: t.retries.unwrap_or(2),
            backoff: self.duration_or_zero("target.backoff", t.backoff, Duration::from_millis(200)),
            ca_file: t.ca_file.as_deref().map(|p| self.path(p)),
            model: t.model,
            chat_template,
            prefix_style,
            cache_hints,
            use_env_proxy: t.use_env_proxy.unwrap_or(false),
            cache_rules,
            context_length: t.context_length,
            busy_prior: self.busy_prior(t.busy_prior),
        };
        if target.context_length == Some(0) {
            self.err("target.context_length: at least 1");
        }
        if let Some(ca) = &target.ca_file {
            if let Err(e) = approxy_verifier::infer::transport::load_ca_file(ca) {
                self.err(format!("target.ca_file: {e}"));
            }
            if !target.base_url.starts_with("https://") {
                self.err("target.ca_file: set, but target.base_url is not https://");
            }
        }
        if target.retries > 10 {
            self.err("target.retries: at most 10");
        }
        target
    }

    pub(super) fn busy_prior(&mut self, raw: Option<RawBusyRates>) -> BusyRates {
        let d = BusyRates::default();
        let Some(r) = raw else { return d };
        let rates = BusyRates {
            prefill_ms: r.prefill_ms.unwrap_or(d.prefill_ms),
            generate_ms: r.generate_ms.unwrap_or(d.generate_ms),
            call_ms: r.call_ms.unwrap_or(d.call_ms),
        };
        if !rates.valid() {
            self.err("target.busy_prior: every rate finite and >= 0, and generate_ms above 0");
            return d;
        }
        rates
    }

    pub(super) fn prefix_style(&mut self, name: Option<&str>, can: Abilities) -> PrefixStyle {
        match name {
            None => PrefixStyle::default(),
            Some(_) if !can.chat_prefix => {
                self.err(format!(
                    "target.prefix_style: only a {} target has one",
                    kinds_that(|a| a.chat_prefix)
                ));
                PrefixStyle::default()
            }
            Some(name) => PrefixStyle::parse(name).unwrap_or_else(|e| {
                self.err(format!("target.prefix_style: {e}"));
                PrefixStyle::default()
            }),
        }
    }

    pub(super) fn chat_template(&mut self, path: Option<&str>, can: Abilities) -> Option<PathBuf> {
        match path {
            None => None,
            Some(_) if !can.chat_template => {
                self.err(format!(
                    "target.chat_template: only an {} target is sent a rendered prompt",
                    kinds_that(|a| a.chat_template)
                ));
                None
            }
            Some(p) => {
                let path = self.path(p);
                if let Err(e) = approxy_verifier::request::ChatTemplate::from_file(&path) {
                    self.err(format!("target.chat_template: {e}"));
                }
                Some(path)
            }
        }
    }

    pub(super) fn cache(&mut self, cache: RawCache, can: Abilities) -> (CacheHints, CacheRules) {
        // Per kind, as its abilities say: the text-level kinds talk to hosted APIs, whose caches
        // key on `prompt_cache_key`; each kind's cache serves prefixes in its own blocks.
        let cache_hints = CacheHints {
            key: cache.key.unwrap_or(can.text_level),
            affinity_header: cache.affinity_header,
            slots: cache.slots.unwrap_or(false),
            warm: cache.warm.unwrap_or(false),
        };
        if cache_hints.slots && !can.names_slots {
            self.err("target.cache.slots: llama_cpp targets only (llama-server's `id_slot`)");
        }
        if cache_hints.warm && !cache_hints.slots {
            // The warmed cache must be the one the answer's calls read: a slot it names.
            self.err("target.cache.warm: needs target.cache.slots = true");
        }
        let cache_rules = CacheRules {
            min_tokens: cache.min_tokens.unwrap_or(0),
            block: cache.block.unwrap_or(can.cache_block),
        };
        if cache_rules.block == 0 {
            self.err("target.cache.block: at least 1");
        }
        if let Some(h) = &cache_hints.affinity_header
            && reqwest::header::HeaderName::from_bytes(h.as_bytes()).is_err()
        {
            self.err(format!(
                "target.cache.affinity_header: {h:?} is not a header name"
            ));
        }
        (cache_hints, cache_rules)
    }

    pub(super) fn base_url(&mut self, base_url: &str) {
        match reqwest::Url::parse(base_url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            Ok(u) => self.err(format!(
                "target.base_url: scheme {:?} cannot be served; approxy speaks http:// and https:// (TLS by rustls)",
                u.scheme()
            )),
            Err(e) => self.err(format!("target.base_url: {base_url:?} is not a URL: {e}")),
        }
        if base_url.contains('@') {
            self.err("target.base_url: put credentials in the environment variable named by target.api_key_env, not in the URL");
        }
    }
}
