use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

/// A model whose "keys and values" are the tokens themselves and whose output at a position
/// names every token it attends to: a row that read a wrong, stale or unwritten position, or
/// another row's, answers differently from the same sequence run alone.
#[derive(Default)]
pub(crate) struct Scripted {
    rows: Vec<Vec<Option<u32>>>,
    capacity: usize,
    parked: HashMap<SeqId, Vec<Option<u32>>>,
    /// Rows each step ran.
    pub(crate) widths: Vec<usize>,
    /// Layouts made.
    pub(crate) arranged: usize,
}

/// The output after `seen`: its tokens folded into the logits.
pub(crate) fn output_of(seen: &[u32]) -> PositionOutput {
    let h = seen.iter().fold(1469598103934665603u64, |h, &t| {
        (h ^ u64::from(t)).wrapping_mul(1099511628211)
    });
    PositionOutput::new(
        vec![
            (h & 0xffff) as f32,
            (h >> 16 & 0xffff) as f32,
            seen.len() as f32,
        ],
        vec![0.0].into(),
    )
}

impl Scripted {
    fn seen(&self, row: usize, upto: usize) -> Result<Vec<u32>, EngineError> {
        self.rows[row][..upto]
            .iter()
            .map(|t| t.ok_or_else(|| EngineError::Draft(format!("row {row} read a hole"))))
            .collect()
    }
}

impl Rows for Scripted {
    fn shape(&self) -> (usize, usize) {
        (self.rows.len(), self.capacity)
    }
    fn prefill(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        _gone: &dyn Fn() -> bool,
    ) -> Result<PositionOutput, EngineError> {
        self.parked
            .insert(seq, prompt.iter().map(|&t| Some(t)).collect());
        Ok(output_of(prompt))
    }
    fn arrange(
        &mut self,
        members: &[Member],
        park: &[Member],
        capacity: usize,
    ) -> Result<(), EngineError> {
        self.arranged += 1;
        for p in park {
            let row = p.row.ok_or_else(|| EngineError::Draft("no row".into()))?;
            self.parked.insert(p.seq, self.rows[row][..p.len].to_vec());
        }
        let mut fresh = Vec::new();
        for m in members {
            // Only the valid positions travel: anything read past them is a hole.
            let mut row: Vec<Option<u32>> = match m.row {
                Some(r) => self.rows[r][..m.len].to_vec(),
                None => {
                    let p = self
                        .parked
                        .remove(&m.seq)
                        .ok_or_else(|| EngineError::Draft("not parked".into()))?;
                    p[..m.len].to_vec()
                }
            };
            assert!(m.len <= capacity);
            row.resize(capacity, None);
            fresh.push(row);
        }
        self.rows = fresh;
        self.capacity = if members.is_empty() { 0 } else { capacity };
        Ok(())
    }
    fn reserve(&mut self, total: usize) -> Result<(), EngineError> {
        if total > self.capacity {
            self.capacity = total;
            for r in &mut self.rows {
                r.resize(total, None);
            }
        }
        Ok(())
    }
    fn step(&mut self, step: &RowsStep<'_>) -> Result<Vec<Vec<PositionOutput>>, EngineError> {
        assert_eq!(step.ids.len(), self.rows.len() * step.s);
        self.widths.push(self.rows.len());
        let mut outs = Vec::new();
        for r in 0..self.rows.len() {
            let past = step.past[r];
            if past + step.s > self.capacity {
                return Err(EngineError::Draft("past the capacity".into()));
            }
            for i in 0..step.s {
                self.rows[r][past + i] = Some(step.ids[r * step.s + i]);
            }
            let mut o = Vec::new();
            for p in step.want[r].clone() {
                o.push(output_of(&self.seen(r, past + p + 1)?));
            }
            outs.push(o);
        }
        Ok(outs)
    }
    fn forget(&mut self, seq: SeqId) {
        self.parked.remove(&seq);
    }
    fn trim_solo(&mut self, _keep: usize) {}
    fn reset(&mut self) {
        self.rows.clear();
        self.parked.clear();
        self.capacity = 0;
    }
}

/// One thing a test does to the batch.
#[derive(Debug, Clone)]
enum Op {
    /// Sequence `i` (of 6) starts over with a prompt of this length (opening it if closed).
    Prefill(usize, usize),
    /// These sequences extend together, each by (tokens, all).
    Extend(Vec<(usize, usize, bool)>),
    /// Sequence `i` drops `n` positions.
    Rollback(usize, usize),
    /// Sequence `i` leaves.
    Close(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..6usize, 1..90usize).prop_map(|(i, n)| Op::Prefill(i, n)),
        prop::collection::vec((0..6usize, 1..80usize, any::<bool>()), 1..5).prop_map(Op::Extend),
        (0..6usize, 0..10usize).prop_map(|(i, n)| Op::Rollback(i, n)),
        (0..6usize).prop_map(Op::Close),
    ]
}

/// Runs `ops` against a batch and checks every output against the sequence's own tokens.
fn check(ops: &[Op]) -> Result<Batch<Scripted>, TestCaseError> {
    let mut batch = Batch::new(Scripted::default(), 4);
    // Each open sequence's tokens, as a run alone would hold them.
    let mut alone: HashMap<usize, Vec<u32>> = HashMap::new();
    let mut next_token = 1000u32;
    let mut fresh = |n: usize| {
        let t: Vec<u32> = (next_token..next_token + n as u32).collect();
        next_token += n as u32;
        t
    };
    for op in ops {
        match op {
            Op::Prefill(i, n) => {
                let prompt = fresh(*n);
                match batch.prefill(*i as u64, &prompt, &|| false) {
                    Ok(out) => {
                        prop_assert_eq!(out.logits, output_of(&prompt).logits);
                        alone.insert(*i, prompt);
                    }
                    Err(EngineError::Saturated) => prop_assert!(alone.len() >= 4),
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                }
            }
            Op::Extend(work) => {
                let mut seen = std::collections::HashSet::new();
                let work: Vec<(usize, Vec<u32>, bool)> = work
                    .iter()
                    .filter(|(i, _, _)| alone.contains_key(i) && seen.insert(*i))
                    .map(|&(i, n, all)| (i, fresh(n), all))
                    .collect();
                let asks: Vec<Extend<'_>> = work
                    .iter()
                    .map(|(i, t, all)| Extend {
                        seq: *i as u64,
                        tokens: t,
                        all: *all,
                    })
                    .collect();
                for ((i, tokens, all), got) in work.iter().zip(batch.extend(&asks)) {
                    let got = got.map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let seq = alone
                        .get_mut(i)
                        .ok_or_else(|| TestCaseError::fail("gone"))?;
                    let mut want = Vec::new();
                    for &t in tokens {
                        seq.push(t);
                        want.push(output_of(seq).logits);
                    }
                    if !all {
                        want.drain(..want.len() - 1);
                    }
                    let got: Vec<Vec<f32>> = got.into_iter().map(|o| o.logits).collect();
                    prop_assert_eq!(got, want, "sequence {}", i);
                }
            }
            Op::Rollback(i, n) => {
                if let Some(seq) = alone.get_mut(i) {
                    batch
                        .rollback(*i as u64, *n)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    seq.truncate(seq.len().saturating_sub(*n));
                }
            }
            Op::Close(i) => {
                batch
                    .close(*i as u64)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                alone.remove(i);
            }
        }
        prop_assert_eq!(batch.live(), alone.len());
        prop_assert_eq!(batch.model().shape().0, batch.width());
    }
    Ok(batch)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Sequences joining, leaving, rolled back and extended together, by any amounts, each
    /// get exactly the outputs of their run alone.
    #[test]
    fn each_sequence_sees_only_its_own_tokens(ops in prop::collection::vec(op(), 1..60)) {
        check(&ops)?;
    }
}

#[test]
fn a_sequence_alone_steps_in_one_row() {
    let mut b = Batch::new(Scripted::default(), 8);
    b.prefill(1, &[1, 2, 3], &|| false).unwrap();
    let asks = [Extend {
        seq: 1,
        tokens: &[4],
        all: false,
    }];
    b.extend(&asks).pop().unwrap().unwrap();
    assert_eq!(b.model().widths, [1]);
}

#[test]
fn a_sequence_that_sits_out_is_parked_and_comes_back() {
    let mut b = Batch::new(Scripted::default(), 8);
    for s in 0..3 {
        b.prefill(s, &[7, 8, s as u32], &|| false).unwrap();
    }
    let step = |b: &mut Batch<Scripted>, seqs: &[u64]| {
        let asks: Vec<Extend<'_>> = seqs
            .iter()
            .map(|&seq| Extend {
                seq,
                tokens: &[5],
                all: false,
            })
            .collect();
        for r in b.extend(&asks) {
            r.unwrap();
        }
        b.width()
    };
    assert_eq!(step(&mut b, &[0, 1, 2]), 3);
    // Sequence 2 waits on the target: it rides one step as filler, then is parked.
    assert_eq!(step(&mut b, &[0, 1]), 3);
    assert_eq!(step(&mut b, &[0, 1]), 2);
    assert_eq!(step(&mut b, &[0, 1]), 2);
    // Back with its next token, where it left off.
    assert_eq!(step(&mut b, &[0, 1, 2]), 3);
    let asks = [Extend {
        seq: 2,
        tokens: &[6],
        all: false,
    }];
    let out = b.extend(&asks).pop().unwrap().unwrap();
    assert_eq!(out[0].logits, output_of(&[7, 8, 2, 5, 5, 6]).logits);
    assert_eq!(b.live(), 3);
    for s in 0..3 {
        b.close(s).unwrap();
    }
    assert_eq!((b.live(), b.width(), b.model().shape()), (0, 0, (0, 0)));
}

#[test]
fn a_full_batch_refuses_another_sequence() {
    let mut b = Batch::new(Scripted::default(), 2);
    b.prefill(1, &[1], &|| false).unwrap();
    b.prefill(2, &[1], &|| false).unwrap();
    assert!(matches!(
        b.prefill(3, &[1], &|| false),
        Err(EngineError::Saturated)
    ));
    // The same sequence prefilling again keeps its row.
    b.prefill(2, &[5, 6], &|| false).unwrap();
}

#[test]
fn extending_an_unknown_sequence_fails_alone() {
    let mut b = Batch::new(Scripted::default(), 4);
    b.prefill(1, &[1, 2], &|| false).unwrap();
    let asks = [
        Extend {
            seq: 9,
            tokens: &[3],
            all: false,
        },
        Extend {
            seq: 1,
            tokens: &[3],
            all: false,
        },
    ];
    let r = b.extend(&asks);
    assert!(r[0].is_err());
    assert_eq!(
        r[1].as_ref().unwrap()[0].logits,
        output_of(&[1, 2, 3]).logits
    );
}
