//! Collected training rows: at every answer position, the draft's features (the same
//! [`Features`](approxy_verifier::verify::Features) the serving path computes, the answer's
//! context included), the label "the draft's top token equals the target's token", and, where
//! the target gave them, the target's probabilities there (its top-k log-probabilities, from
//! which every [`AcceptanceRule`] label is computed). Stored as safetensors shards, one per
//! batch of prompts, so collection can stop and resume.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use approxy_verifier::DraftMeta;
use approxy_verifier::draft::LEGACY_DRAFT_BUILD;
pub use approxy_verifier::verify::context::N_CONTEXT;
pub use approxy_verifier::verify::syntax::N_SYNTAX;
use approxy_verifier::verify::{AcceptanceRule, Features, TargetProbs};

/// How many of the target's top log-probabilities a row keeps.
pub const TARGET_TOP_K: usize = 20;

/// Number of logit statistics per row (see `approxy_verifier::verify::features::STAT_NAMES`).
pub const N_STATS: usize = 4;

/// [`Rows::tokens`] of a row whose shard did not keep its token.
pub const UNKNOWN_TOKEN: u32 = u32::MAX;

/// [`Rows::importance`] of a row the labels did not judge.
pub const IMPORTANCE_UNKNOWN: u8 = u8::MAX;
/// [`Rows::importance`]: the draft's token is the target's.
pub const AGREES: u8 = 0;
/// [`Rows::importance`]: the draft's token differs, and the tests' verdict does not change.
pub const HARMLESS: u8 = 1;
/// [`Rows::importance`]: the draft's token differs and changes the tests' verdict.
pub const IMPORTANT: u8 = 2;

/// The shard format; shards of an older one (without the context) are refused, not misread.
const FORMAT: &str = "approxy-rows/2";

/// Rows of one or more prompts, column-wise.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rows {
    /// Width of the hidden-state part of a row.
    pub hidden_size: usize,
    /// `[n][N_STATS]` row-major.
    pub stats: Vec<f32>,
    /// `[n][N_CONTEXT]` row-major.
    pub context: Vec<f32>,
    /// `[n][hidden_size]` row-major.
    pub hidden: Vec<f32>,
    /// `[n][N_SYNTAX]` row-major: where in code the token falls (zeros in shards from before
    /// it was kept).
    pub syntax: Vec<f32>,
    /// Per row, what importance labels say of the draft's token there ([`AGREES`],
    /// [`HARMLESS`], [`IMPORTANT`]; [`IMPORTANCE_UNKNOWN`] in rows they did not judge).
    pub importance: Vec<u8>,
    /// 1 when the draft's top token is the target's token.
    pub labels: Vec<u8>,
    /// Prompt id of each row.
    pub prompt_ids: Vec<u32>,
    /// 0 = code, 1 = chat.
    pub kinds: Vec<u8>,
    /// The token each row's features are of (the draft's top-1), so features of the token
    /// itself can be tried on collected rows; [`UNKNOWN_TOKEN`] in shards from before it was
    /// kept.
    pub tokens: Vec<u32>,
    /// `[n][TARGET_TOP_K]` row-major: the target's top tokens at the row's position, most
    /// likely first; [`UNKNOWN_TOKEN`] where the target gave fewer, and in every slot of a row
    /// without the target's probabilities (a target that gives none, or an older shard).
    pub target_top_ids: Vec<u32>,
    /// `[n][TARGET_TOP_K]`: their natural-log probabilities (negative infinity where unknown).
    pub target_top_logprobs: Vec<f32>,
    /// The target's log-probability of the row's token (the draft's top-1); where that token
    /// is outside the target's top-k, the k-th log-probability, an upper bound.
    pub target_token_logprob: Vec<f32>,
    /// 1 where the row's token is outside the target's top-k (its log-probability is a bound).
    pub target_token_outside: Vec<u8>,
    /// The target's entropy in nats, the mass beyond its top-k counted as one outcome (negative
    /// infinity where unknown).
    pub target_entropy: Vec<f32>,
    /// How the draft that produced the rows was converted ([`DraftMeta::build`]).
    pub draft_build: String,
    /// Per row: read from a live-decode shard (known from the shard's name at load, not
    /// stored in it).
    pub live: Vec<bool>,
}

impl Rows {
    /// Empty rows of the given hidden width, from a draft of the legacy build.
    pub fn new(hidden_size: usize) -> Self {
        Self {
            hidden_size,
            draft_build: LEGACY_DRAFT_BUILD.to_string(),
            ..Self::default()
        }
    }

    /// Empty rows for the draft `meta` describes.
    pub fn for_draft(meta: &DraftMeta) -> Self {
        Self {
            draft_build: meta.build(),
            ..Self::new(meta.hidden_size)
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Appends one row: the features of the draft's top-1 at a position, whether the target's
    /// token there is that token, and the target's top log-probabilities there when known.
    pub fn push_with_target(
        &mut self,
        f: &Features,
        label: bool,
        prompt_id: u32,
        kind: u8,
        target: Option<&[(u32, f32)]>,
    ) {
        self.push(f, label, prompt_id, kind);
        let Some(top) = target.filter(|t| !t.is_empty()) else {
            return;
        };
        let at = self.len() - 1;
        let slots = at * TARGET_TOP_K..(at + 1) * TARGET_TOP_K;
        for (slot, &(id, lp)) in slots.clone().zip(top.iter().take(TARGET_TOP_K)) {
            self.target_top_ids[slot] = id;
            self.target_top_logprobs[slot] = lp;
        }
        let probs = TargetProbs {
            top: top.iter().take(TARGET_TOP_K).copied().collect(),
        };
        let (lp, outside) = match probs.logprob(f.token) {
            Some(lp) => (lp, false),
            None => (probs.top.last().map_or(f32::NEG_INFINITY, |t| t.1), true),
        };
        self.target_token_logprob[at] = lp;
        self.target_token_outside[at] = u8::from(outside);
        self.target_entropy[at] = probs.entropy();
    }

    /// The target's probabilities at row `i`, when they were recorded.
    pub fn target_probs(&self, i: usize) -> Option<TargetProbs> {
        let ids = &self.target_top_ids[i * TARGET_TOP_K..(i + 1) * TARGET_TOP_K];
        let lps = &self.target_top_logprobs[i * TARGET_TOP_K..(i + 1) * TARGET_TOP_K];
        let top: Vec<(u32, f32)> = ids
            .iter()
            .zip(lps)
            .take_while(|(id, _)| **id != UNKNOWN_TOKEN)
            .map(|(&id, &lp)| (id, lp))
            .collect();
        (!top.is_empty()).then_some(TargetProbs { top })
    }

    /// Row `i`'s label under `rule` (soft for `sprinter`), when the target's probabilities
    /// were recorded there. The draft's probability of its token is the row's top-1
    /// probability.
    pub fn rule_label(&self, i: usize, rule: &AcceptanceRule) -> Option<f32> {
        let target = self.target_probs(i)?;
        Some(rule.label(self.tokens[i], self.stats_of(i)[0], &target))
    }

    /// Rows that carry the target's probabilities.
    pub fn rows_with_target_probs(&self) -> usize {
        (0..self.len())
            .filter(|&i| self.target_top_ids[i * TARGET_TOP_K] != UNKNOWN_TOKEN)
            .count()
    }

    /// Appends one row: the features of the draft's top-1 at a position, and whether the
    /// target's token there is that token (the target's probabilities unknown).
    pub fn push(&mut self, f: &Features, label: bool, prompt_id: u32, kind: u8) {
        self.stats.extend_from_slice(&f.stats);
        self.context.extend_from_slice(&f.context);
        self.syntax.extend_from_slice(&f.syntax);
        self.importance.push(IMPORTANCE_UNKNOWN);
        self.hidden.extend(f.hidden.iter().take(self.hidden_size));
        self.hidden
            .resize(self.labels.len() * self.hidden_size + self.hidden_size, 0.0);
        self.labels.push(u8::from(label));
        self.prompt_ids.push(prompt_id);
        self.kinds.push(kind);
        self.tokens.push(f.token);
        self.live.push(false);
        self.push_unknown_target(1);
    }

    /// Appends `n` rows' worth of "the target's probabilities are unknown".
    fn push_unknown_target(&mut self, n: usize) {
        let k = n * TARGET_TOP_K;
        self.target_top_ids
            .extend(std::iter::repeat_n(UNKNOWN_TOKEN, k));
        self.target_top_logprobs
            .extend(std::iter::repeat_n(f32::NEG_INFINITY, k));
        self.target_token_logprob
            .extend(std::iter::repeat_n(f32::NEG_INFINITY, n));
        self.target_token_outside.extend(std::iter::repeat_n(0, n));
        self.target_entropy
            .extend(std::iter::repeat_n(f32::NEG_INFINITY, n));
    }

    /// The rows at `idx`, in that order.
    pub fn select(&self, idx: &[usize]) -> Rows {
        fn take<T: Copy>(v: &[T], idx: &[usize], width: usize) -> Vec<T> {
            idx.iter()
                .flat_map(|&i| v[i * width..(i + 1) * width].iter().copied())
                .collect()
        }
        Rows {
            hidden_size: self.hidden_size,
            stats: take(&self.stats, idx, N_STATS),
            context: take(&self.context, idx, N_CONTEXT),
            hidden: take(&self.hidden, idx, self.hidden_size),
            syntax: take(&self.syntax, idx, N_SYNTAX),
            importance: take(&self.importance, idx, 1),
            labels: take(&self.labels, idx, 1),
            prompt_ids: take(&self.prompt_ids, idx, 1),
            kinds: take(&self.kinds, idx, 1),
            tokens: take(&self.tokens, idx, 1),
            target_top_ids: take(&self.target_top_ids, idx, TARGET_TOP_K),
            target_top_logprobs: take(&self.target_top_logprobs, idx, TARGET_TOP_K),
            target_token_logprob: take(&self.target_token_logprob, idx, 1),
            target_token_outside: take(&self.target_token_outside, idx, 1),
            target_entropy: take(&self.target_entropy, idx, 1),
            draft_build: self.draft_build.clone(),
            live: take(&self.live, idx, 1),
        }
    }

    /// The rows labelled by `rule` instead of token identity: for [`AcceptanceRule::Identical`]
    /// all rows as they are (their stored label is that rule's); for any other rule only the
    /// rows that carry the target's probabilities, each labelled with whether the rule accepts
    /// its token (a soft label counts as accepted at 0.5 or more, as
    /// [`AcceptanceRule::accepts`] says). The stored identity label is replaced, so every
    /// figure computed from the result (AUC, false-accept rate, accept rate) is against `rule`.
    pub fn labelled_by(&self, rule: &AcceptanceRule) -> Rows {
        if *rule == AcceptanceRule::Identical {
            return self.clone();
        }
        let (idx, labels): (Vec<usize>, Vec<u8>) = (0..self.len())
            .filter_map(|i| {
                let target = self.target_probs(i)?;
                let q = self.stats_of(i)[0];
                Some((i, u8::from(rule.accepts(self.tokens[i], q, &target))))
            })
            .unzip();
        let mut out = self.select(&idx);
        out.labels = labels;
        out
    }

    /// Appends all rows of `other`.
    pub fn extend(&mut self, other: &Rows) {
        self.stats.extend_from_slice(&other.stats);
        self.context.extend_from_slice(&other.context);
        self.hidden.extend_from_slice(&other.hidden);
        self.syntax.extend_from_slice(&other.syntax);
        self.importance.extend_from_slice(&other.importance);
        self.labels.extend_from_slice(&other.labels);
        self.prompt_ids.extend_from_slice(&other.prompt_ids);
        self.kinds.extend_from_slice(&other.kinds);
        self.tokens.extend_from_slice(&other.tokens);
        self.live.extend_from_slice(&other.live);
        self.target_top_ids.extend_from_slice(&other.target_top_ids);
        self.target_top_logprobs
            .extend_from_slice(&other.target_top_logprobs);
        self.target_token_logprob
            .extend_from_slice(&other.target_token_logprob);
        self.target_token_outside
            .extend_from_slice(&other.target_token_outside);
        self.target_entropy.extend_from_slice(&other.target_entropy);
    }

    /// Row `i`'s statistics.
    pub fn stats_of(&self, i: usize) -> &[f32] {
        &self.stats[i * N_STATS..(i + 1) * N_STATS]
    }

    /// Rows from live-decode shards.
    pub fn live_rows(&self) -> usize {
        self.live.iter().filter(|l| **l).count()
    }

    /// Row `i`'s context values.
    pub fn context_of(&self, i: usize) -> &[f32] {
        &self.context[i * N_CONTEXT..(i + 1) * N_CONTEXT]
    }

    /// Row `i`'s syntax values.
    pub fn syntax_of(&self, i: usize) -> &[f32] {
        &self.syntax[i * N_SYNTAX..(i + 1) * N_SYNTAX]
    }

    /// Row `i`'s hidden state.
    pub fn hidden_of(&self, i: usize) -> &[f32] {
        &self.hidden[i * self.hidden_size..(i + 1) * self.hidden_size]
    }

    /// Row `i` as the features the serving side scores.
    pub fn features_of(&self, i: usize) -> Features {
        let mut stats = [0f32; N_STATS];
        stats.copy_from_slice(self.stats_of(i));
        let mut context = [0f32; N_CONTEXT];
        context.copy_from_slice(self.context_of(i));
        let mut syntax = [0f32; N_SYNTAX];
        syntax.copy_from_slice(self.syntax_of(i));
        let token = self.tokens[i];
        Features {
            top1: token,
            token,
            top1_prob: stats[0],
            stats,
            hidden: self.hidden_of(i).into(),
            context,
            syntax,
        }
    }

    /// Writes a shard atomically.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let n = self.len();
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let stats = f32s(&self.stats);
        let context = f32s(&self.context);
        let hidden = f32s(&self.hidden);
        let syntax = f32s(&self.syntax);
        let u32s = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let ids = u32s(&self.prompt_ids);
        let tokens = u32s(&self.tokens);
        let top_ids = u32s(&self.target_top_ids);
        let top_lps = f32s(&self.target_top_logprobs);
        let token_lp = f32s(&self.target_token_logprob);
        let entropy = f32s(&self.target_entropy);
        let mut views = vec![
            (
                "stats",
                TensorView::new(Dtype::F32, vec![n, N_STATS], &stats)?,
            ),
            (
                "context",
                TensorView::new(Dtype::F32, vec![n, N_CONTEXT], &context)?,
            ),
            (
                "hidden",
                TensorView::new(Dtype::F32, vec![n, self.hidden_size], &hidden)?,
            ),
            ("labels", TensorView::new(Dtype::U8, vec![n], &self.labels)?),
            ("prompt_ids", TensorView::new(Dtype::U32, vec![n], &ids)?),
            ("kinds", TensorView::new(Dtype::U8, vec![n], &self.kinds)?),
            ("tokens", TensorView::new(Dtype::U32, vec![n], &tokens)?),
            (
                "syntax",
                TensorView::new(Dtype::F32, vec![n, N_SYNTAX], &syntax)?,
            ),
        ];
        if self.importance.iter().any(|&x| x != IMPORTANCE_UNKNOWN) {
            views.push((
                "importance",
                TensorView::new(Dtype::U8, vec![n], &self.importance)?,
            ));
        }
        // Only when some row has them: shards of a target that gives none stay as they were.
        if self.rows_with_target_probs() > 0 {
            views.extend([
                (
                    "target_top_ids",
                    TensorView::new(Dtype::U32, vec![n, TARGET_TOP_K], &top_ids)?,
                ),
                (
                    "target_top_logprobs",
                    TensorView::new(Dtype::F32, vec![n, TARGET_TOP_K], &top_lps)?,
                ),
                (
                    "target_token_logprob",
                    TensorView::new(Dtype::F32, vec![n], &token_lp)?,
                ),
                (
                    "target_token_outside",
                    TensorView::new(Dtype::U8, vec![n], &self.target_token_outside)?,
                ),
                (
                    "target_entropy",
                    TensorView::new(Dtype::F32, vec![n], &entropy)?,
                ),
            ]);
        }
        let mut meta = std::collections::HashMap::new();
        meta.insert("format".to_string(), FORMAT.to_string());
        meta.insert("draft_build".to_string(), self.draft_build.clone());
        let bytes = safetensors::tensor::serialize(views, Some(meta))?;
        // A unique name beside the shard, synced before the rename: a crash leaves the old
        // shard or the whole new one, and two collectors never share a temporary file.
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        std::io::Write::write_all(&mut tmp, &bytes)?;
        tmp.as_file().sync_all()?;
        tmp.persist(path)?;
        Ok(())
    }

    /// Reads a shard.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let bytes = std::fs::read(path)?;
        let (_, meta) = SafeTensors::read_metadata(&bytes)?;
        let field = |k: &str| meta.metadata().as_ref().and_then(|m| m.get(k).cloned());
        let format = field("format").unwrap_or_default();
        anyhow::ensure!(
            format == FORMAT,
            "{}: rows of format {format:?}, this build reads {FORMAT:?}: collect again",
            path.display()
        );
        let st = SafeTensors::deserialize(&bytes)?;
        let f32s = |name: &str| words(&st, name, f32::from_le_bytes);
        let u32s = |name: &str| words(&st, name, u32::from_le_bytes);
        let hidden_t = st.tensor("hidden")?;
        let hidden_size = hidden_t.shape().get(1).copied().unwrap_or(0);
        let labels = st.tensor("labels")?.data().to_vec();
        let n = labels.len();
        let mut rows = Self {
            hidden_size,
            stats: f32s("stats")?,
            context: f32s("context")?,
            hidden: f32s("hidden")?,
            live: vec![false; n],
            labels,
            // Shards from before the record were all collected with the legacy build.
            draft_build: field("draft_build").unwrap_or_else(|| LEGACY_DRAFT_BUILD.to_string()),
            prompt_ids: u32s("prompt_ids")?,
            kinds: st.tensor("kinds")?.data().to_vec(),
            syntax: if st.names().contains(&"syntax") {
                f32s("syntax")?
            } else {
                vec![0.0; n * N_SYNTAX]
            },
            importance: if st.names().contains(&"importance") {
                st.tensor("importance")?.data().to_vec()
            } else {
                vec![IMPORTANCE_UNKNOWN; n]
            },
            // Shards from before tokens were kept have none.
            tokens: if st.names().contains(&"tokens") {
                u32s("tokens")?
            } else {
                vec![UNKNOWN_TOKEN; n]
            },
            ..Self::default()
        };
        if st.names().contains(&"target_top_ids") {
            rows.target_top_ids = u32s("target_top_ids")?;
            rows.target_top_logprobs = f32s("target_top_logprobs")?;
            rows.target_token_logprob = f32s("target_token_logprob")?;
            rows.target_token_outside = st.tensor("target_token_outside")?.data().to_vec();
            rows.target_entropy = f32s("target_entropy")?;
            anyhow::ensure!(
                rows.target_top_ids.len() == n * TARGET_TOP_K && rows.target_entropy.len() == n,
                "{}: the target's probabilities do not cover its {n} rows",
                path.display()
            );
        } else {
            rows.push_unknown_target(n);
        }
        Ok(rows)
    }
}

/// Tensor `name` of `st` as little-endian 4-byte values (`f32` or `u32`).
fn words<T>(st: &SafeTensors, name: &str, from: fn([u8; 4]) -> T) -> anyhow::Result<Vec<T>> {
    Ok(st
        .tensor(name)?
        .data()
        .chunks_exact(4)
        .map(|c| from([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Refuses to add rows from a draft converted as `build` to a directory holding rows of another
/// conversion: a resumed collection would skip the old shards and mix the two.
pub fn ensure_draft_build(dir: &Path, build: &str) -> anyhow::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let have = Rows::load(&p)?.draft_build;
            anyhow::ensure!(
                have == build,
                "{} holds rows from a draft converted as {have:?}, and the draft now is {build:?}: collect into another --data directory",
                dir.display()
            );
            return Ok(());
        }
    }
    Ok(())
}

/// Shard file of batch `i` in a data directory.
pub fn shard_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("shard-{i:05}.safetensors"))
}

/// Path of live-decode shard `i` (kept apart from the teacher-forced shards so either mode
/// resumes on its own; [`load_dir`] reads both).
pub fn live_shard_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("live-{i:05}.safetensors"))
}

/// Loads every shard in a directory (teacher-forced and live), in name order.
pub fn load_dir(dir: &Path) -> anyhow::Result<Rows> {
    let mut shards = BTreeMap::new();
    for e in std::fs::read_dir(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))? {
        let p = e?.path();
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if (name.starts_with("shard-") || name.starts_with("live-"))
            && name.ends_with(".safetensors")
        {
            shards.insert(name, p);
        }
    }
    let mut all: Option<Rows> = None;
    for (name, p) in &shards {
        let mut r = Rows::load(p)?;
        if name.starts_with("live-") {
            r.live.fill(true);
        }
        if let Some(a) = &all {
            anyhow::ensure!(
                a.draft_build == r.draft_build,
                "{}: rows from a draft converted as {:?}, the shards before it from one converted as {:?}: keep one draft's rows per directory",
                p.display(),
                r.draft_build,
                a.draft_build
            );
        }
        match &mut all {
            None => all = Some(r),
            Some(a) => a.extend(&r),
        }
    }
    all.ok_or_else(|| anyhow::anyhow!("no shards in {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_round_trip() -> anyhow::Result<()> {
        let row = |stats: [f32; 4], hidden: &[f32], c: f32| Features {
            top1: c.to_bits(),
            token: c.to_bits(),
            top1_prob: stats[0],
            stats,
            hidden: hidden.into(),
            context: [c; N_CONTEXT],
            syntax: [c; N_SYNTAX],
        };
        let mut r = Rows::new(3);
        r.push(
            &row([0.9, 0.5, 0.3, 12.0], &[1.0, 2.0, 3.0], 0.5),
            true,
            7,
            0,
        );
        r.push(&row([0.2, 0.1, 2.3, 8.0], &[4.0, 5.0], -1.0), false, 8, 1);
        let dir = std::env::temp_dir().join(format!("approxy-rows-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        r.save(&shard_path(&dir, 0))?;
        let back = load_dir(&dir)?;
        std::fs::remove_dir_all(&dir)?;
        assert_eq!(
            back,
            Rows {
                hidden: vec![1.0, 2.0, 3.0, 4.0, 5.0, 0.0],
                ..r.clone()
            }
        );
        assert_eq!(back.hidden_of(1), &[4.0, 5.0, 0.0]);
        assert_eq!(back.context_of(1), &[-1.0; N_CONTEXT]);
        assert_eq!(back.live_rows(), 0);
        assert_eq!(back.tokens, [0.5f32.to_bits(), (-1.0f32).to_bits()]);
        assert_eq!(back.features_of(1).token, (-1.0f32).to_bits());
        // A shard from before tokens were kept reads as rows of unknown tokens.
        let old = tempfile::tempdir()?;
        r.save(&shard_path(old.path(), 0))?;
        let bytes = std::fs::read(shard_path(old.path(), 0))?;
        let st = SafeTensors::deserialize(&bytes)?;
        let (_, meta) = SafeTensors::read_metadata(&bytes)?;
        let views: Vec<(String, TensorView)> = st
            .tensors()
            .into_iter()
            .filter(|(n, _)| n != "tokens")
            .collect();
        std::fs::write(
            shard_path(old.path(), 0),
            safetensors::tensor::serialize(views, meta.metadata().clone())?,
        )?;
        assert_eq!(load_dir(old.path())?.tokens, [UNKNOWN_TOKEN; 2]);
        // The same rows in a live shard are live rows.
        let live = tempfile::tempdir()?;
        r.save(&live_shard_path(live.path(), 0))?;
        let back = load_dir(live.path())?;
        assert_eq!((back.live.clone(), back.live_rows()), (vec![true, true], 2));
        // A collection from another draft build is refused, and rows of one do not mix in.
        ensure_draft_build(live.path(), LEGACY_DRAFT_BUILD)?;
        let e = ensure_draft_build(live.path(), "int4 block_size=128")
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("another --data directory")));
        let other = Rows {
            draft_build: "int4 block_size=128".into(),
            ..r.clone()
        };
        other.save(&shard_path(live.path(), 1))?;
        let e = load_dir(live.path())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("keep one draft's rows per directory"), "{e}");
        Ok(())
    }

    /// The target's probabilities survive a shard, the draft token's own log-probability and
    /// entropy are derived at push time, and a row without them stays without them.
    #[test]
    fn target_probabilities_round_trip() -> anyhow::Result<()> {
        let f = |token: u32| Features {
            top1: token,
            token,
            top1_prob: 0.8,
            stats: [0.8, 0.1, 0.5, 3.0],
            hidden: vec![0.0].into(),
            context: [0.0; N_CONTEXT],
            syntax: Default::default(),
        };
        let ln = |p: f64| p.ln() as f32;
        let mut r = Rows::new(1);
        r.push_with_target(&f(5), true, 1, 0, Some(&[(5, ln(0.7)), (6, ln(0.2))]));
        r.push_with_target(&f(9), false, 1, 0, Some(&[(5, ln(0.7)), (6, ln(0.2))]));
        r.push(&f(5), true, 2, 1);
        let dir = tempfile::tempdir()?;
        r.save(&shard_path(dir.path(), 0))?;
        let back = load_dir(dir.path())?;
        assert_eq!(back, r);
        assert_eq!(back.rows_with_target_probs(), 2);
        assert_eq!(back.target_token_logprob[0], ln(0.7));
        // Token 9 is outside the top-k: its log-probability is the last one's, flagged.
        assert_eq!(
            (back.target_token_logprob[1], back.target_token_outside[1]),
            (ln(0.2), 1)
        );
        assert!(
            (back.target_entropy[0] - 0.8018).abs() < 1e-3,
            "{}",
            back.target_entropy[0]
        );
        assert_eq!(back.target_probs(2), None);
        assert_eq!(back.rule_label(0, &AcceptanceRule::Identical), Some(1.0));
        assert_eq!(back.rule_label(1, &AcceptanceRule::Ratio(0.1)), Some(0.0));
        assert_eq!(back.rule_label(2, &AcceptanceRule::Identical), None);
        Ok(())
    }

    /// Relabelling by a rule keeps only rows with the target's probabilities, in order, with
    /// every column carried along, and labels them from those probabilities (worked by hand:
    /// the target gives 0.6 to token 1, 0.3 to token 2; the draft proposes 1, 2, 3 at 0.9).
    #[test]
    fn rows_relabelled_by_a_rule_keep_their_columns_and_take_its_labels() {
        let f = |token: u32, h: f32| Features {
            top1: token,
            token,
            top1_prob: 0.9,
            stats: [0.9, 0.1, 0.5, 3.0],
            hidden: vec![h].into(),
            context: [h; N_CONTEXT],
            syntax: Default::default(),
        };
        let ln = |p: f64| p.ln() as f32;
        let top = [(1, ln(0.6)), (2, ln(0.3))];
        let mut r = Rows::new(1);
        r.push_with_target(&f(1, 1.0), true, 1, 0, Some(&top));
        r.push(&f(1, 2.0), true, 1, 0);
        r.push_with_target(&f(2, 3.0), false, 2, 1, Some(&top));
        r.push_with_target(&f(3, 4.0), false, 3, 1, Some(&top));
        assert_eq!(r.labelled_by(&AcceptanceRule::Identical), r);
        let half = r.labelled_by(&AcceptanceRule::Ratio(0.5));
        // 0.3 >= 0.5 * 0.6: token 2 is accepted; token 3 is outside the top-k.
        assert_eq!(half.labels, [1, 1, 0]);
        assert_eq!(half.hidden, [1.0, 3.0, 4.0]);
        assert_eq!(half.context_of(1), &[3.0; N_CONTEXT]);
        assert_eq!(
            (half.prompt_ids.clone(), half.kinds.clone()),
            (vec![1, 2, 3], vec![0, 1, 1])
        );
        assert_eq!(half.target_probs(1), r.target_probs(2));
        assert_eq!(half.target_token_outside, [0, 0, 1]);
        // p >= q: 0.6 < 0.9, so nothing the draft is this sure of passes sprinter-hard.
        assert_eq!(
            r.labelled_by(&AcceptanceRule::SprinterHard).labels,
            [0, 0, 0]
        );
    }

    #[test]
    fn shards_of_the_format_before_the_context_are_refused() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let labels = [1u8];
        let views = vec![("labels", TensorView::new(Dtype::U8, vec![1], &labels)?)];
        let meta =
            std::collections::HashMap::from([("format".to_string(), "approxy-rows/1".to_string())]);
        let path = shard_path(dir.path(), 0);
        std::fs::write(&path, safetensors::tensor::serialize(views, Some(meta))?)?;
        let e = load_dir(dir.path())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("collect again"), "{e}");
        Ok(())
    }
}
