//! Which of llama-server's slots each answer's calls go to (`id_slot`).
//!
//! An answer makes many calls, each re-sending the prompt and the answer so far; the slot that
//! served the last call holds all of it in its cache. But a span's stream is closed while the
//! target is still generating, and llama-server notices the close a token or two later. A call
//! that comes sooner finds that slot busy, and llama-server, left to choose, gives it another:
//! one with less of the prefix, often none (`selected slot by LRU`), so the whole prompt is
//! computed again, nearly twice the prompt tokens the calls brought (see tests/README.md,
//! "Slots that keep an answer's cache"). A call that names its slot waits for it instead (llama-server defers the task until the
//! slot is released), which is the few milliseconds until the close is noticed.
//!
//! A new answer takes the free slot whose last prefix shares the most with its prompt (a
//! system prompt the slot still holds), else the one approxy used longest ago. When every slot
//! is held by a live answer, a call names none and llama-server chooses, as without pins.
//!
//! Only when the policy asks (`target.cache.slots`), and only for a server whose RAM prompt
//! cache is off (`--cache-ram 0`, as approxy's own scripts start it). With that cache on
//! (llama-server's default), a task that names a busy slot makes llama-server save and load
//! prompt state into that slot before deferring the task (`get_available_slot` in
//! `tools/server/server-context.cpp`, build b1-0c1e570), so the call running there goes on from
//! another prompt's state: an answer's call then writes from a prompt it never sent (see
//! tests/README.md, "Slots that keep an answer's cache", for the case that showed it).

use std::collections::HashMap;
use std::sync::Mutex;

/// Tokens of each slot's last prefix kept to compare with new prompts: enough for any system
/// prompt worth reusing, and a bound on what the pins hold.
const KEPT_PREFIX: usize = 4096;

/// The slots' assignment to live answers.
#[derive(Debug, Default)]
pub struct SlotPins {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Per slot: the start of the last prefix sent to it, and when (a call counter).
    slots: Vec<Slot>,
    /// The slot each live answer holds.
    held: HashMap<u64, usize>,
    calls: u64,
}

#[derive(Debug, Default, Clone)]
struct Slot {
    prefix: Vec<u32>,
    used: u64,
}

impl SlotPins {
    /// The slot for a call of `answer` sending `prefix`, to a server of `total` slots: the one
    /// the answer holds, or a free one it now holds; `None` when every slot is held.
    pub fn pin(&self, answer: u64, prefix: &[u32], total: usize) -> Option<usize> {
        let Ok(mut s) = self.state.lock() else {
            return None;
        };
        if s.slots.len() != total {
            // The first call sizes the table; another count (a caller asking anew of a server
            // restarted with other slots) makes what was known stale.
            s.slots = vec![Slot::default(); total];
            s.held.clear();
        }
        let slot = match s.held.get(&answer) {
            Some(&slot) => slot,
            None => {
                let taken: Vec<usize> = s.held.values().copied().collect();
                let slot = (0..total).filter(|i| !taken.contains(i)).max_by_key(|&i| {
                    let shared = common_prefix(&s.slots[i].prefix, prefix);
                    (shared, std::cmp::Reverse(s.slots[i].used))
                })?;
                s.held.insert(answer, slot);
                slot
            }
        };
        s.calls += 1;
        let calls = s.calls;
        let kept = &prefix[..prefix.len().min(KEPT_PREFIX)];
        let entry = &mut s.slots[slot];
        entry.prefix.clear();
        entry.prefix.extend_from_slice(kept);
        entry.used = calls;
        Some(slot)
    }

    /// `answer` makes no more calls: its slot is free for the next answer (its cache stays,
    /// for an answer that shares its prompt).
    pub fn release(&self, answer: u64) {
        if let Ok(mut s) = self.state.lock() {
            s.held.remove(&answer);
        }
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_keeps_its_slot_for_every_call() {
        let pins = SlotPins::default();
        let a = pins.pin(1, &[1, 2, 3], 4);
        assert!(a.is_some());
        assert_eq!(pins.pin(1, &[1, 2, 3, 4, 5], 4), a);
        assert_eq!(pins.pin(1, &[1, 2, 3, 4, 5, 6, 7], 4), a);
    }

    #[test]
    fn live_answers_hold_different_slots_and_the_last_gets_none() {
        let pins = SlotPins::default();
        let slots: Vec<_> = (1..=3).map(|a| pins.pin(a, &[a as u32], 3)).collect();
        assert!(slots.iter().all(Option::is_some));
        let mut distinct = slots.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 3);
        assert_eq!(
            pins.pin(4, &[4], 3),
            None,
            "every slot is held: the server chooses"
        );
        pins.release(2);
        assert_eq!(
            pins.pin(4, &[4], 3),
            slots[1],
            "a released slot is free again"
        );
    }

    #[test]
    fn a_new_answer_takes_the_free_slot_holding_most_of_its_prompt() {
        let pins = SlotPins::default();
        let system = [7u32, 7, 7, 7, 7, 7];
        let with = |q: u32| system.iter().copied().chain([q]).collect::<Vec<_>>();
        let first = pins.pin(1, &with(1), 4).unwrap();
        pins.pin(2, &[9, 9], 4).unwrap();
        pins.release(1);
        pins.release(2);
        assert_eq!(pins.pin(3, &with(3), 4), Some(first));
    }

    #[test]
    fn with_nothing_shared_the_slot_used_longest_ago_is_taken() {
        let pins = SlotPins::default();
        let a = pins.pin(1, &[1], 2).unwrap();
        pins.release(1);
        let b = pins.pin(2, &[2], 2).unwrap();
        assert_ne!(a, b, "the never-used slot is older than the one just used");
        pins.release(2);
        assert_eq!(pins.pin(3, &[3], 2), Some(a));
    }

    #[test]
    fn another_slot_count_starts_over() {
        let pins = SlotPins::default();
        assert!(pins.pin(1, &[1], 1).is_some());
        assert_eq!(pins.pin(2, &[2], 1), None);
        assert!(
            pins.pin(2, &[2], 2).is_some(),
            "a restarted server's slots are all free"
        );
    }
}
