use std::sync::Mutex;
use std::time::Duration;

use super::super::batch::tests::{Scripted, output_of};
use super::*;

fn meta() -> DraftMeta {
    DraftMeta {
        num_hidden_layers: 1,
        num_key_value_heads: 1,
        head_dim: 1,
        hidden_size: 1,
        vocab_size: 3,
        eos_token: None,
        context_length: 4096,
        precision: None,
        extra_options: Vec::new(),
    }
}

fn limits(streams: usize, floor: f64) -> Limits {
    Limits {
        streams,
        floor,
        kv_bytes: usize::MAX,
        bytes_per_position: 1,
        probe: false,
    }
}

/// A pool of one scripted worker whose steps each take `step` (a model's time), recording
/// the widths it stepped.
fn pool(streams: usize, floor: f64, step: Duration) -> (Arc<DraftPool>, Arc<Mutex<Vec<usize>>>) {
    let widths = Arc::new(Mutex::new(Vec::new()));
    let w = Arc::clone(&widths);
    let p = DraftPool::start_with(
        1,
        move |_| {
            let w = Arc::clone(&w);
            move || Ok(Timed(Scripted::default(), step, w))
        },
        limits(streams, floor),
        meta(),
    )
    .unwrap();
    (p, widths)
}

/// The scripted model, taking `1` per step and telling `2` each step's width.
struct Timed(Scripted, Duration, Arc<Mutex<Vec<usize>>>);

impl Rows for Timed {
    fn shape(&self) -> (usize, usize) {
        self.0.shape()
    }
    fn prefill(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        gone: &dyn Fn() -> bool,
    ) -> Result<PositionOutput, EngineError> {
        self.0.prefill(seq, prompt, gone)
    }
    fn arrange(
        &mut self,
        members: &[super::super::batch::Member],
        park: &[super::super::batch::Member],
        capacity: usize,
    ) -> Result<(), EngineError> {
        self.0.arrange(members, park, capacity)
    }
    fn reserve(&mut self, total: usize) -> Result<(), EngineError> {
        self.0.reserve(total)
    }
    fn step(
        &mut self,
        step: &super::super::rows::RowsStep<'_>,
    ) -> Result<Vec<Vec<PositionOutput>>, EngineError> {
        std::thread::sleep(self.1);
        if let Ok(mut w) = self.2.lock() {
            w.push(self.0.shape().0);
        }
        self.0.step(step)
    }
    fn forget(&mut self, seq: SeqId) {
        self.0.forget(seq);
    }
    fn trim_solo(&mut self, keep: usize) {
        self.0.trim_solo(keep);
    }
    fn reset(&mut self) {
        self.0.reset();
    }
}

/// A stream's decode: prefill, then `n` single-token steps, each token the one its output
/// names, with a rollback now and then; the outputs it saw.
async fn decode(d: Box<dyn Draft>, first: u32, n: usize) -> Vec<Vec<f32>> {
    let prompt: Vec<u32> = (first..first + 5).collect();
    let mut seen = vec![d.prefill(prompt).await.unwrap().logits];
    for i in 0..n {
        let next = (seen.last().unwrap()[0] as u32) % 50_000;
        seen.push(d.extend(vec![next], false).await.unwrap().remove(0).logits);
        if i % 5 == 4 {
            d.rollback(2).await.unwrap();
            seen.push(d.extend(vec![7, 8], true).await.unwrap().remove(1).logits);
        }
    }
    seen
}

/// The same decode against a plain token list: what a run alone gives.
fn alone(first: u32, n: usize) -> Vec<Vec<f32>> {
    let mut seq: Vec<u32> = (first..first + 5).collect();
    let mut seen = vec![output_of(&seq).logits];
    for i in 0..n {
        let next = (seen.last().unwrap()[0] as u32) % 50_000;
        seq.push(next);
        seen.push(output_of(&seq).logits);
        if i % 5 == 4 {
            seq.truncate(seq.len() - 2);
            seq.extend([7, 8]);
            seen.push(output_of(&seq).logits);
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_step_together_and_each_gets_its_run_alone() {
    let (pool, widths) = pool(4, 0.0, Duration::from_millis(3));
    let mut tasks = Vec::new();
    for s in 0..4u32 {
        let d = pool.try_lease().expect("four streams fit");
        tasks.push(tokio::spawn(decode(d, 100 * s, 30)));
    }
    for (s, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), alone(100 * s as u32, 30), "stream {s}");
    }
    let w = widths.lock().unwrap().clone();
    assert!(w.contains(&4), "never stepped four rows: {w:?}");
    // The streams left; the worker holds none and frees its rows.
    assert_eq!(pool.streams(), 0);
    assert_eq!(pool.idle(), 1);
}

#[tokio::test]
async fn a_full_worker_refuses_at_once_and_takes_again_when_one_leaves() {
    let (pool, _) = pool(2, 0.0, Duration::ZERO);
    let a = pool.try_lease().unwrap();
    let _b = pool.try_lease().unwrap();
    let t = Instant::now();
    assert!(pool.try_lease().is_none());
    assert!(t.elapsed() < Duration::from_millis(10));
    drop(a);
    assert!(pool.try_lease().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_too_slow_for_the_floor_takes_no_more_streams() {
    // 40 ms a step: 25 tokens/s alone; a second stream would be priced at 12.5.
    let (pool, _) = pool(8, 20.0, Duration::from_millis(40));
    let d = pool.try_lease().unwrap();
    let _ = decode(d, 1, 3).await;
    let one = pool.try_lease().unwrap();
    assert!(pool.speed(0, 1).is_some_and(|s| s < 26.0));
    assert!(
        pool.try_lease().is_none(),
        "a second stream would draft under the floor"
    );
    drop(one);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_waiting_on_the_target_leave_room_under_the_floor() {
    // 10 ms a step: 100 tokens/s alone, and a wider step is priced at a whole step a row. Two
    // streams are held, one drafting, the other parked as if waiting on the target: half of
    // them step. A third is priced at the 2 rows half of three would step at (50 tokens/s),
    // not at 3 (33), and is let in under a floor of 40.
    let (pool, widths) = pool(8, 40.0, Duration::from_millis(10));
    let a = pool.try_lease().unwrap();
    let b = pool.try_lease().unwrap();
    b.prefill(vec![9, 9, 9]).await.unwrap();
    a.prefill(vec![1, 2, 3]).await.unwrap();
    for _ in 0..20 {
        a.extend(vec![5], false).await.unwrap();
    }
    assert!(widths.lock().unwrap().iter().all(|&w| w == 1));
    assert!(pool.speed(0, 3).is_some_and(|s| s < 40.0));
    assert!(pool.try_lease().is_some(), "the third stream was refused");
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probed_worker_admits_by_the_widths_it_stepped() {
    // 10 ms a step whatever the width. Unprobed, a third stream would be priced at a whole
    // step a row (30 ms, 33 tokens/s) and refused under a floor of 40.
    let widths = Arc::new(Mutex::new(Vec::new()));
    let w = Arc::clone(&widths);
    let mut l = limits(4, 40.0);
    l.probe = true;
    let step = Duration::from_millis(10);
    let pool = DraftPool::start_with(
        1,
        move |_| {
            let w = Arc::clone(&w);
            move || Ok(Timed(Scripted::default(), step, w))
        },
        l,
        meta(),
    )
    .unwrap();
    let stepped = widths.lock().unwrap().clone();
    for width in [1, 2, 4] {
        assert!(
            stepped.contains(&width),
            "the probe skipped {width}: {stepped:?}"
        );
        assert!(pool.speed(0, width).is_some(), "{width} rows unmeasured");
    }
    // The probe's sequences are gone: every stream is free, and a fresh one decodes as alone.
    let leases: Vec<_> = (0..4).map(|_| pool.try_lease()).collect();
    assert!(leases.iter().all(Option::is_some), "a stream was refused");
    let d = leases.into_iter().next().flatten().unwrap();
    assert_eq!(decode(d, 3, 6).await, alone(3, 6));
}

#[tokio::test]
async fn the_memory_bound_counts_the_longest_stream_in_every_row() {
    let mut l = limits(8, 0.0);
    l.kv_bytes = 2500;
    let p = DraftPool::start_with(1, |_| || Ok(Scripted::default()), l, meta()).unwrap();
    let _a = p.try_lease_for(1000).unwrap();
    // Two rows of 1,500 positions: over 2,500 bytes.
    assert!(p.try_lease_for(1500).is_none());
    let _b = p.try_lease_for(1000).unwrap();
    // Alone, a stream is taken whatever its length.
    let q = DraftPool::start_with(1, |_| || Ok(Scripted::default()), l, meta()).unwrap();
    assert!(q.try_lease_for(100_000).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_dropped_mid_call_leaves_the_others_untouched() {
    let (pool, _) = pool(4, 0.0, Duration::from_millis(5));
    let keep = pool.try_lease().unwrap();
    let other = tokio::spawn(decode(keep, 1, 20));
    for _ in 0..5 {
        let d = pool.try_lease().unwrap();
        d.prefill(vec![9, 9, 9]).await.unwrap();
        // Abandoned while its step is queued or running.
        let call = d.extend(vec![1, 2, 3], true);
        let _ = tokio::time::timeout(Duration::from_millis(2), call).await;
        drop(d);
    }
    assert_eq!(other.await.unwrap(), alone(1, 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_slower_than_the_least_wait_still_step_together() {
    // Each stream takes 3 to 6 ms between its steps (decode loops scanning their logits on a
    // busy core), longer than the least wait (2 ms); a step of four rows takes 40 ms, so the worker waits 10.
    let (pool, _) = pool(4, 0.0, Duration::from_millis(40));
    let slow = |d: Box<dyn Draft>, first: u32| async move {
        let mut next = d.prefill(vec![first, first + 1]).await.unwrap().logits[0] as u32;
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(3 + u64::from(first) / 10)).await;
            next = d.extend(vec![next % 50_000], false).await.unwrap()[0].logits[0] as u32;
        }
    };
    let leases: Vec<_> = (0..4).map(|_| pool.try_lease().unwrap()).collect();
    let tasks: Vec<_> = leases
        .into_iter()
        .zip(0u32..)
        .map(|(d, i)| tokio::spawn(slow(d, 10 * i)))
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let (stepped, asked) = pool.rows();
    // The streams start one prefill a round apart, so a first step may run without one. A
    // fixed wait of 2 ms stepped 76 rows for these 40.
    assert!(
        asked as f64 >= 0.8 * stepped as f64,
        "{asked} of {stepped} rows asked for: the worker stepped without streams it should have waited for"
    );
}
