//! The hand-off: the target writes the rest of the answer in one call.

use super::state::{Run, unless_client_gone, unwritten};

use futures::StreamExt;

use crate::decode::calls::CallKind;
use crate::decode::request::{FinishReason, Source};
use crate::error::{EngineError, TargetError};
use crate::targets::TokenStream;

/// How a hand-off ended.
pub(super) enum HandOff {
    /// The answer ended.
    Finished(FinishReason),
    /// The grammar refused a target token: these target tokens were emitted before it, and
    /// the draft goes on from there.
    Refused(Vec<u32>),
}

impl Run<'_> {
    /// Opens a streamed call for at most `n` tokens after the current prefix; `None` when the
    /// client went away first.
    pub(super) async fn open_stream(&mut self, n: u32) -> Result<Option<TokenStream>, EngineError> {
        let creq = self.next_call(CallKind::HandOff, n).await;
        let call = self.engine.target.stream_tokens(&creq);
        Ok(
            unless_client_gone(&self.tx, &mut self.stats.target_wait, call)
                .await
                .transpose()?,
        )
    }

    /// Lets the target write the rest of the answer in one streamed call. Streamed, so that a
    /// stop string or the token limit ends it (and the upstream generation with it) as soon
    /// as it appears, as passthrough would.
    pub(super) async fn hand_off(&mut self) -> Result<HandOff, EngineError> {
        if self.stats.handed_off_at.is_none() {
            self.stats.handed_off_at = Some(self.stats.so_far());
        }
        let n = self.remaining();
        let Some(mut stream) = self.open_stream(n).await? else {
            return Ok(HandOff::Finished(FinishReason::Cancelled));
        };
        let mut taken = Vec::new();
        let mut received = 0usize;
        // A text-level target ends on end-of-sequence without a token for it.
        let mut ended = false;
        loop {
            let Some(chunk) =
                unless_client_gone(&self.tx, &mut self.stats.target_wait, stream.next()).await
            else {
                return Ok(HandOff::Finished(FinishReason::Cancelled));
            };
            let Some(chunk) = chunk else { break };
            let chunk = chunk?;
            self.absorb(chunk.cached_prompt_tokens, chunk.timings, chunk.extra_calls);
            received += chunk.tokens.len();
            self.last_prefix_len += chunk.tokens.len() as u64;
            for (i, &token) in chunk.tokens.iter().enumerate() {
                if self.refuses(token) {
                    self.stats.target_discarded_tokens += (chunk.tokens.len() - i) as u64;
                    self.end_call(&mut stream, false, unwritten(n, received))
                        .await;
                    // Closed first: a pick goes to the same slot, which would finish this
                    // generation before taking it.
                    drop(stream);
                    if let Some(alt) = self.allowed_alternative(chunk.top_logprobs.get(i)).await? {
                        taken.push(alt);
                        if let Some(reason) = self.emit(&[alt], Source::Target, None).await? {
                            return Ok(HandOff::Finished(reason));
                        }
                    }
                    return Ok(HandOff::Refused(taken));
                }
                taken.push(token);
                if let Some(reason) = self.emit(&[token], Source::Target, None).await? {
                    self.stats.target_discarded_tokens += (chunk.tokens.len() - i - 1) as u64;
                    let done = self.upstream_is_done(reason, received as u64, u64::from(n));
                    let more = if done { 0 } else { unwritten(n, received) };
                    self.end_call(&mut stream, false, more).await;
                    return Ok(HandOff::Finished(reason));
                }
            }
            if chunk.stopped_on_eos {
                ended = true;
                break;
            }
        }
        // A target that ended where the grammar says the answer goes on (or that stopped
        // short of it) leaves the rest to the draft.
        if self.remaining() > 0 && self.refuses_end() {
            self.drain_usage(&mut stream).await;
            return Ok(HandOff::Refused(taken));
        }
        if received == 0 && !ended && self.remaining() > 0 {
            return Err(TargetError::Protocol("target streamed no tokens".into()).into());
        }
        Ok(HandOff::Finished(if self.remaining() == 0 {
            FinishReason::Length
        } else {
            FinishReason::Stop
        }))
    }
}
