//! Warming: the prompt sent to the target's cache while the draft reads it, and what that
//! call cost.

use super::state::{Run, unless_client_gone};

use crate::decode::calls::CallKind;
use crate::decode::request::Verification;
use crate::decode::warm::{WarmCall, Warmed};

impl Run<'_> {
    /// Sends the prompt to the target's cache, where the target warms one and the answer may
    /// call it (at threshold 0 the draft writes everything).
    pub(super) async fn start_warm(&mut self) {
        let target = &self.engine.target;
        let draft_only = self.req.threshold <= 0.0
            && self.req.settings.verification == Verification::Approximate;
        if !target.warms() || draft_only {
            return;
        }
        let req = self.request(self.req.prompt.clone(), 0);
        self.warm = Some(WarmCall::start(target.clone(), req));
        // Its request goes out before the draft's prefill takes this task.
        tokio::task::yield_now().await;
    }

    /// Before the answer's first call: waits for the warm (the call would wait for the slot
    /// anyway) and counts it, so that the call's prefix is sent after it and counted as
    /// cached. Returns at once when there is none, or once the client has gone.
    pub(super) async fn settle_warm(&mut self) {
        let Some(mut warm) = self.warm.take() else {
            return;
        };
        if let Some(w) =
            unless_client_gone(&self.tx, &mut self.stats.target_wait, warm.finished()).await
        {
            self.count_warm(w);
        }
    }

    /// Counts a warm as a call of the prompt, nothing generated: at its own timings where it
    /// finished; at the learned rates where it was aborted unfinished.
    pub(super) fn count_warm(&mut self, w: Warmed) {
        let done = match w {
            Warmed::Nothing => return,
            Warmed::Unfinished => None,
            Warmed::Done(c) => Some(c),
        };
        let prompt = self.req.prompt.len() as u64;
        self.count_call(CallKind::Warm, prompt, 0);
        self.stats.target_warms += 1;
        self.call_reported = false;
        if let Some(c) = done {
            self.absorb(c.cached_prompt_tokens, c.timings, 0);
            // The next call's prefix starts with what the warm computed.
            self.last_prefix_len = prompt;
        }
    }
}
