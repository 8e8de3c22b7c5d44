//! Emitting tokens: the text decoder, the JSON fence, stop strings and loop watch, and the
//! generation's end.

use super::state::Run;

use crate::decode::calls::settle;
use crate::decode::request::{FinishReason, Source, TokenEvent, Verification};
use crate::decode::stats::Stats;
use crate::error::{EngineError, TargetError};
use crate::stop::StopResult;
use crate::verify::Record;

impl Run<'_> {
    /// Emits tokens; `Ok(Some(reason))` when one of them ends the generation. `first` is what
    /// the draft thought at the first of them (see [`Run::record`]); at the others it is not
    /// known.
    pub(super) async fn emit(
        &mut self,
        ids: &[u32],
        source: Source,
        first: Option<Record>,
    ) -> Result<Option<FinishReason>, EngineError> {
        for (i, &id) in ids.iter().enumerate() {
            if self.engine.eos.contains(&id) {
                return Ok(Some(FinishReason::Stop));
            }
            // A target's id goes into the draft's cache next: one it cannot hold is the
            // target's error, not a crash in the draft runtime.
            if source == Source::Target && id as usize >= self.engine.tokenizer.vocab_size() {
                return Err(TargetError::Protocol(format!(
                    "token id {id} is outside the vocabulary ({} tokens)",
                    self.engine.tokenizer.vocab_size()
                ))
                .into());
            }
            let delta = self.take(id, source, if i == 0 { first } else { None })?;
            let client = self.client_text(&delta);
            let (text, stop) = match self.stop.push(&client) {
                StopResult::Continue(t) => (t, false),
                StopResult::Stop(t) => (t, true),
            };
            if let Some(sent) = &mut self.json_sent {
                sent.push_str(&text);
            }
            if self
                .tx
                .send(TokenEvent {
                    id: Some(id),
                    text,
                    source,
                })
                .await
                .is_err()
            {
                return Ok(Some(FinishReason::Cancelled));
            }
            if stop {
                self.hit_stop_sequence = true;
                return Ok(Some(self.stopped_by_string()));
            }
            if self.remaining() == 0 {
                return Ok(Some(FinishReason::Length));
            }
        }
        Ok(None)
    }

    /// Takes `id` into the answer: the grammar, the counts by source, the loop watch, the
    /// text decoder and what reads its text (JSON place, context, tool-call repeats). Returns
    /// the token's text.
    fn take(
        &mut self,
        id: u32,
        source: Source,
        record: Option<Record>,
    ) -> Result<String, EngineError> {
        if self.emitted.is_empty() {
            self.stats.time_to_first_token = self.started.elapsed();
        }
        if let Some(g) = &mut self.grammar {
            g.consume(id)?;
        }
        self.emitted.push(id);
        self.last_source = source;
        self.stats.completion_tokens += 1;
        // Counted here, with completion_tokens, so an end-of-sequence token (never
        // emitted) is counted by neither and the three always add up.
        match source {
            Source::Draft => {
                self.stats.draft_tokens += 1;
                self.loops.draft(id);
            }
            Source::Grammar => {
                self.stats.draft_tokens += 1;
                self.stats.forced_tokens += 1;
            }
            Source::Target => {
                self.stats.target_tokens += 1;
                self.loops.target(id);
            }
        }
        let delta = self.decoder.push(id)?;
        if let Some(p) = &mut self.place {
            p.push(&delta);
        }
        if let Some(ctx) = &mut self.context {
            ctx.push(record, &delta);
        }
        if let Some(r) = &mut self.repeats {
            for stop in r.feed(&delta) {
                self.stop.add(stop);
            }
        }
        Ok(delta)
    }

    /// What of the answer's next text the client receives: all of it, but a JSON answer's
    /// fence.
    pub(super) fn client_text(&mut self, delta: &str) -> String {
        match &mut self.fence {
            Some(fence) => fence.feed(delta),
            None => delta.to_string(),
        }
    }

    /// How an answer a stop string cut ends: `Stop`, but for a JSON answer whose text as sent
    /// is not a whole JSON value, which ends as if cut by its token limit (`Length`): every
    /// structured answer that ends with `Stop` is valid for its schema. Cut JSON that parses
    /// is whole for the schema too, as the grammar let each of its values close; a top-level
    /// number cut short is the exception no client schema in practice has.
    pub(super) fn stopped_by_string(&self) -> FinishReason {
        match &self.json_sent {
            Some(sent) if serde_json::from_str::<serde::de::IgnoredAny>(sent).is_err() => {
                FinishReason::Length
            }
            _ => FinishReason::Stop,
        }
    }

    pub(super) async fn finish(mut self, reason: FinishReason) -> Result<Stats, EngineError> {
        if reason != FinishReason::Cancelled && !self.hit_stop_sequence {
            // Whatever was held back (an incomplete character, a possible stop string) is text.
            let flushed = self.decoder.flush()?;
            let mut tail = self.client_text(&flushed);
            if let Some(fence) = &mut self.fence {
                tail.push_str(&fence.finish());
            }
            let text = match self.stop.push(&tail) {
                StopResult::Continue(t) => t + &self.stop.finish(),
                StopResult::Stop(t) => t,
            };
            if !text.is_empty() {
                let _ = self
                    .tx
                    .send(TokenEvent {
                        id: None,
                        text,
                        source: self.last_source,
                    })
                    .await;
            }
        }
        if let Some(warm) = self.warm.take() {
            // No call came after it (the draft wrote the whole answer): whatever it finished
            // is counted, and if unfinished it is stopped.
            self.count_warm(warm.now());
        }
        let total = self.stats.target_generated();
        settle(&mut self.stats.calls, total);
        self.stats.finish_reason = Some(reason);
        self.stats.spans_for_windows =
            self.windows_unsupported && self.req.settings.verification != Verification::Approximate;
        Ok(self.stats)
    }
}
