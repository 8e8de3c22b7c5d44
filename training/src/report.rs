//! Calibration report: ROC AUC of a verifier and of the draft-confidence baseline on held-out
//! rows, and for a grid of thresholds the accept rate, the false-accept rate (share of
//! accepted draft tokens the target would not have produced) and the expected target calls per
//! 100 output tokens, all split by code and chat prompts. The gateway reads the JSON to turn
//! a quality target into a threshold.

use approxy_verifier::calibration::CalibrationPoint;

use crate::dataset::Rows;

/// Scores of held-out rows under one verifier.
#[derive(Debug, Clone)]
pub struct Scored {
    /// p_accept per row.
    pub scores: Vec<f32>,
    /// Labels (true = draft agrees with target).
    pub labels: Vec<bool>,
    /// 0 = code, 1 = chat.
    pub kinds: Vec<u8>,
    /// True for rows collected along live decodes.
    pub live: Vec<bool>,
}

/// Area under the ROC curve (Mann-Whitney, ties counted half); `None` without both classes.
pub fn roc_auc(scores: &[f32], labels: &[bool]) -> Option<f64> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let (mut rank_sum, mut i) = (0f64, 0usize);
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && scores[idx[j + 1]] == scores[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        rank_sum += (i..=j).filter(|&k| labels[idx[k]]).count() as f64 * avg;
        i = j + 1;
    }
    let pos = labels.iter().filter(|l| **l).count() as f64;
    let neg = labels.len() as f64 - pos;
    (pos > 0.0 && neg > 0.0).then(|| (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg))
}

/// Points of the ROC curve (false-positive rate, true-positive rate), for charts.
pub fn roc_curve(scores: &[f32], labels: &[bool]) -> Vec<(f64, f64)> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let pos = labels.iter().filter(|l| **l).count().max(1) as f64;
    let neg = (labels.len() - labels.iter().filter(|l| **l).count()).max(1) as f64;
    let (mut tp, mut fp) = (0f64, 0f64);
    let mut out = vec![(0.0, 0.0)];
    for (n, &i) in idx.iter().enumerate() {
        if labels[i] {
            tp += 1.0
        } else {
            fp += 1.0
        }
        let last = n + 1 == idx.len() || scores[idx[n + 1]] != scores[i];
        if last {
            out.push((fp / neg, tp / pos));
        }
    }
    out
}

/// The grid for the rows selected by `keep`.
pub fn grid(s: &Scored, keep: impl Fn(usize) -> bool, thresholds: &[f32]) -> Vec<CalibrationPoint> {
    let rows: Vec<usize> = (0..s.scores.len()).filter(|&i| keep(i)).collect();
    let n = rows.len().max(1) as f32;
    thresholds
        .iter()
        .map(|&t| {
            let accepted: Vec<usize> = rows
                .iter()
                .copied()
                .filter(|&i| approxy_verifier::verify::accepts(s.scores[i], t))
                .collect();
            let wrong = accepted.iter().filter(|&&i| !s.labels[i]).count() as f32;
            let accept_rate = accepted.len() as f32 / n;
            CalibrationPoint {
                threshold: t,
                accept_rate,
                false_accept_rate: if accepted.is_empty() {
                    0.0
                } else {
                    wrong / accepted.len() as f32
                },
                target_calls_per_100_tokens: (1.0 - accept_rate) * 100.0,
            }
        })
        .collect()
}

/// The point, among the rows selected by `keep`, where the verifier accepts the most while
/// its false-accept rate stays within `budget`: the lowest threshold that is one of the scores
/// themselves and keeps the rate within it (threshold 1, accepting nothing, when none does).
pub fn at_budget(s: &Scored, keep: impl Fn(usize) -> bool, budget: f32) -> CalibrationPoint {
    let mut rows: Vec<usize> = (0..s.scores.len()).filter(|&i| keep(i)).collect();
    rows.sort_by(|&a, &b| s.scores[b].total_cmp(&s.scores[a]));
    let n = rows.len().max(1) as f32;
    let mut best = CalibrationPoint {
        threshold: 1.0,
        accept_rate: 0.0,
        false_accept_rate: 0.0,
        target_calls_per_100_tokens: 100.0,
    };
    let (mut accepted, mut wrong) = (0usize, 0usize);
    for (j, &i) in rows.iter().enumerate() {
        accepted += 1;
        wrong += usize::from(!s.labels[i]);
        // A threshold accepts every row with the same score, so only the last of a tie counts.
        let tie_ends = rows
            .get(j + 1)
            .is_none_or(|&next| s.scores[next] != s.scores[i]);
        let far = wrong as f32 / accepted as f32;
        if tie_ends && far <= budget {
            let accept_rate = accepted as f32 / n;
            best = CalibrationPoint {
                threshold: s.scores[i],
                accept_rate,
                false_accept_rate: far,
                target_calls_per_100_tokens: (1.0 - accept_rate) * 100.0,
            };
        }
    }
    best
}

/// The standard grid: 0, 0.05, ..., 1.
pub fn standard_thresholds() -> Vec<f32> {
    (0..=20).map(|i| i as f32 / 20.0).collect()
}

/// Held-out scores under the draft-confidence baseline.
pub fn baseline(rows: &Rows, idx: &[usize]) -> Scored {
    confidence_against(rows, idx, idx.iter().map(|&i| rows.labels[i] == 1))
}

/// The rows `idx` scored by the draft's confidence, with `labels` in the same order (the
/// identity label, or an acceptance rule's).
pub fn confidence_against(
    rows: &Rows,
    idx: &[usize],
    labels: impl IntoIterator<Item = bool>,
) -> Scored {
    Scored {
        scores: idx.iter().map(|&i| rows.stats_of(i)[0]).collect(),
        labels: labels.into_iter().collect(),
        kinds: idx.iter().map(|&i| rows.kinds[i]).collect(),
        live: idx.iter().map(|&i| rows.live[i]).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_budget_accepts_the_most_within_the_false_accept_budget() {
        let s = Scored {
            scores: vec![0.9, 0.8, 0.7, 0.7, 0.6, 0.5, 0.1],
            labels: vec![true, true, false, true, true, false, true],
            kinds: vec![0; 7],
            live: vec![false; 7],
        };
        // Down to 0.6: 5 accepted, 1 wrong (0.2); down to 0.5: 6 and 2 (0.33).
        let p = at_budget(&s, |_| true, 0.25);
        assert_eq!((p.threshold, p.false_accept_rate), (0.6, 0.2));
        assert!((p.accept_rate - 5.0 / 7.0).abs() < 1e-6);
        // The tie at 0.7 cannot be split: 0.8 is the lowest threshold with no false accept.
        let p = at_budget(&s, |_| true, 0.0);
        assert_eq!((p.threshold, p.false_accept_rate), (0.8, 0.0));
        // Everything, at a budget above the overall rate.
        assert_eq!(at_budget(&s, |_| true, 0.5).accept_rate, 1.0);
        // Nothing qualifies: accept nothing, a call per token.
        let bad = Scored {
            labels: vec![false; 7],
            ..s
        };
        let p = at_budget(&bad, |_| true, 0.1);
        assert_eq!((p.accept_rate, p.target_calls_per_100_tokens), (0.0, 100.0));
    }

    #[test]
    fn auc_known_values() {
        assert_eq!(
            roc_auc(&[0.1, 0.2, 0.8, 0.9], &[false, false, true, true]),
            Some(1.0)
        );
        assert_eq!(
            roc_auc(&[0.9, 0.8, 0.2, 0.1], &[false, false, true, true]),
            Some(0.0)
        );
        assert_eq!(
            roc_auc(&[0.5, 0.5, 0.5, 0.5], &[false, true, false, true]),
            Some(0.5)
        );
        assert_eq!(
            roc_auc(&[0.1, 0.4, 0.35, 0.8], &[false, true, false, true]),
            Some(1.0)
        );
        assert_eq!(roc_auc(&[0.1, 0.2], &[true, true]), None);
    }

    #[test]
    fn grid_counts() {
        let s = Scored {
            scores: vec![0.1, 0.6, 0.7, 0.9],
            labels: vec![false, false, true, true],
            kinds: vec![0, 0, 1, 1],
            live: vec![false; 4],
        };
        let g = grid(&s, |_| true, &[0.0, 0.65, 1.0]);
        assert_eq!(
            g[0],
            CalibrationPoint {
                threshold: 0.0,
                accept_rate: 1.0,
                false_accept_rate: 0.5,
                target_calls_per_100_tokens: 0.0
            }
        );
        assert_eq!(g[1].accept_rate, 0.5);
        assert_eq!(g[1].false_accept_rate, 0.0);
        assert_eq!(g[2].accept_rate, 0.0);
        assert_eq!(g[2].target_calls_per_100_tokens, 100.0);
        let chat = grid(&s, |i| s.kinds[i] == 1, &[0.65]);
        assert_eq!(chat[0].accept_rate, 1.0);
        let roc = roc_curve(&s.scores, &s.labels);
        assert_eq!(roc.first(), Some(&(0.0, 0.0)));
        assert_eq!(roc.last(), Some(&(1.0, 1.0)));
    }
}
