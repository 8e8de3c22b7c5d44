//! Fitting the verifier head: logistic regression or a one-hidden-layer MLP over standardised
//! [logit statistics, context values, hidden state], trained with mini-batch Adam on binary cross-entropy.
//! Deterministic for a seed. Written out here rather than with a framework: the largest model
//! has a few thousand parameters, and the artifact format is the one the serving side reads
//! (`approxy_verifier::verify::learned`).

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng, rngs::StdRng};

use approxy_verifier::verify::context::CONTEXT_NAMES;
use approxy_verifier::verify::features::STAT_NAMES;
use approxy_verifier::verify::learned::{Artifact, Dense, FORMAT, FeatureSpec};

use crate::dataset::{N_CONTEXT, N_STATS, Rows};

/// Which head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadKind {
    /// One linear layer.
    Logistic,
    /// Linear -> ReLU (this many units) -> linear.
    Mlp(usize),
}

/// Training settings.
#[derive(Debug, Clone)]
pub struct FitOptions {
    /// Head.
    pub kind: HeadKind,
    /// Passes over the training rows.
    pub epochs: usize,
    /// Rows per step.
    pub batch: usize,
    /// Adam step size.
    pub learning_rate: f32,
    /// L2 penalty on weights.
    pub weight_decay: f32,
    /// Seed for initialisation and shuffling.
    pub seed: u64,
    /// Feed the hidden state as well as the logit statistics.
    pub use_hidden: bool,
    /// Feed the answer's context values.
    pub use_context: bool,
}

/// Which inputs a head reads besides the logit statistics (the order the serving side reads
/// them in: statistics, context, hidden state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inputs {
    /// The context values.
    pub context: bool,
    /// The hidden-state row.
    pub hidden: bool,
}

/// True for rows held out for evaluation: a fixed fifth of the prompts, chosen by id and seed,
/// so no prompt contributes to both sides.
pub fn is_held_out(prompt_id: u32, seed: u64) -> bool {
    let mut z = u64::from(prompt_id) ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)).is_multiple_of(5)
}

/// Input vector of row `i`, unnormalised: statistics, then the context values and the
/// hidden state when `inputs` asks for them.
pub fn raw_input(rows: &Rows, i: usize, inputs: Inputs) -> Vec<f32> {
    let mut x = rows.stats_of(i).to_vec();
    if inputs.context {
        x.extend_from_slice(rows.context_of(i));
    }
    if inputs.hidden {
        x.extend_from_slice(rows.hidden_of(i));
    }
    x
}

impl FitOptions {
    fn inputs(&self) -> Inputs {
        Inputs {
            context: self.use_context,
            hidden: self.use_hidden,
        }
    }
}

/// Fits a head on the rows at `train` and returns it as a serving artifact.
pub fn fit(rows: &Rows, train: &[usize], opts: &FitOptions, draft_sha256: &str) -> Artifact {
    let hidden_size = if opts.use_hidden { rows.hidden_size } else { 0 };
    let width = N_STATS + if opts.use_context { N_CONTEXT } else { 0 } + hidden_size;
    let (mean, std) = standardisation(rows, train, width, opts.inputs());
    let xs: Vec<Vec<f32>> = train
        .iter()
        .map(|&i| {
            raw_input(rows, i, opts.inputs())
                .iter()
                .zip(&mean)
                .zip(&std)
                .map(|((v, m), s)| (v - m) / s)
                .collect()
        })
        .collect();
    let ys: Vec<f32> = train.iter().map(|&i| f32::from(rows.labels[i])).collect();
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut layers = init(opts.kind, width, &mut rng);
    let mut adam = Adam::new(&layers);
    let mut order: Vec<usize> = (0..xs.len()).collect();
    for _ in 0..opts.epochs {
        order.shuffle(&mut rng);
        for batch in order.chunks(opts.batch.max(1)) {
            let mut grads = zeros_like(&layers);
            for &j in batch {
                backprop(&layers, &xs[j], ys[j], &mut grads);
            }
            let scale = 1.0 / batch.len() as f32;
            for (g, l) in grads.iter_mut().zip(&layers) {
                for (gr, wr) in g.weights.iter_mut().zip(&l.weights) {
                    for (gw, w) in gr.iter_mut().zip(wr) {
                        *gw = *gw * scale + opts.weight_decay * w;
                    }
                }
                g.bias.iter_mut().for_each(|b| *b *= scale);
            }
            adam.step(&mut layers, &grads, opts.learning_rate);
        }
    }
    Artifact {
        format: FORMAT.to_string(),
        kind: match opts.kind {
            HeadKind::Logistic => "logistic".into(),
            HeadKind::Mlp(_) => "mlp".into(),
        },
        draft_sha256: draft_sha256.to_string(),
        draft_build: Some(rows.draft_build.clone()),
        target: None,
        rule: None,
        features: FeatureSpec {
            stats: STAT_NAMES.iter().map(|s| s.to_string()).collect(),
            context: if opts.use_context {
                CONTEXT_NAMES.iter().map(|s| s.to_string()).collect()
            } else {
                Vec::new()
            },
            syntax: Vec::new(),
            hidden: opts.use_hidden,
            hidden_size,
        },
        mean,
        std,
        layers,
    }
}

fn standardisation(
    rows: &Rows,
    train: &[usize],
    width: usize,
    inputs: Inputs,
) -> (Vec<f32>, Vec<f32>) {
    let n = train.len().max(1) as f64;
    let mut sum = vec![0f64; width];
    let mut sq = vec![0f64; width];
    for &i in train {
        for (k, v) in raw_input(rows, i, inputs).iter().enumerate() {
            sum[k] += f64::from(*v);
            sq[k] += f64::from(*v) * f64::from(*v);
        }
    }
    let mean: Vec<f32> = sum.iter().map(|s| (s / n) as f32).collect();
    let std: Vec<f32> = sum
        .iter()
        .zip(&sq)
        .map(|(s, q)| ((q / n - (s / n).powi(2)).max(0.0).sqrt() as f32).max(1e-6))
        .collect();
    (mean, std)
}

fn init(kind: HeadKind, width: usize, rng: &mut StdRng) -> Vec<Dense> {
    let layer = |rng: &mut StdRng, outs: usize, ins: usize| {
        let bound = (6.0 / (ins + outs) as f32).sqrt();
        Dense {
            weights: (0..outs)
                .map(|_| (0..ins).map(|_| rng.random_range(-bound..bound)).collect())
                .collect(),
            bias: vec![0.0; outs],
        }
    };
    match kind {
        HeadKind::Logistic => vec![layer(rng, 1, width)],
        HeadKind::Mlp(h) => vec![layer(rng, h, width), layer(rng, 1, h)],
    }
}

fn zeros_like(layers: &[Dense]) -> Vec<Dense> {
    layers
        .iter()
        .map(|l| Dense {
            weights: l.weights.iter().map(|r| vec![0.0; r.len()]).collect(),
            bias: vec![0.0; l.bias.len()],
        })
        .collect()
}

fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

/// Adds the gradient of the cross-entropy at one example to `grads`.
fn backprop(layers: &[Dense], x: &[f32], y: f32, grads: &mut [Dense]) {
    let dot = |w: &[f32], v: &[f32]| w.iter().zip(v).map(|(a, b)| a * b).sum::<f32>();
    if layers.len() == 1 {
        let l = &layers[0];
        let dz = sigmoid(dot(&l.weights[0], x) + l.bias[0]) - y;
        for (g, v) in grads[0].weights[0].iter_mut().zip(x) {
            *g += dz * v;
        }
        grads[0].bias[0] += dz;
        return;
    }
    let (l1, l2) = (&layers[0], &layers[1]);
    let pre: Vec<f32> = l1
        .weights
        .iter()
        .zip(&l1.bias)
        .map(|(w, b)| dot(w, x) + b)
        .collect();
    let h: Vec<f32> = pre.iter().map(|v| v.max(0.0)).collect();
    let dz = sigmoid(dot(&l2.weights[0], &h) + l2.bias[0]) - y;
    for (k, hk) in h.iter().enumerate() {
        grads[1].weights[0][k] += dz * hk;
        if pre[k] > 0.0 {
            let dh = dz * l2.weights[0][k];
            for (g, v) in grads[0].weights[k].iter_mut().zip(x) {
                *g += dh * v;
            }
            grads[0].bias[k] += dh;
        }
    }
    grads[1].bias[0] += dz;
}

/// Adam with the usual defaults (beta1 0.9, beta2 0.999).
struct Adam {
    m: Vec<Dense>,
    v: Vec<Dense>,
    t: i32,
}

impl Adam {
    fn new(layers: &[Dense]) -> Self {
        Self {
            m: zeros_like(layers),
            v: zeros_like(layers),
            t: 0,
        }
    }

    fn step(&mut self, layers: &mut [Dense], grads: &[Dense], lr: f32) {
        self.t += 1;
        let (b1, b2) = (0.9f32, 0.999f32);
        let c1 = 1.0 - b1.powi(self.t);
        let c2 = 1.0 - b2.powi(self.t);
        let upd = |p: &mut f32, g: f32, m: &mut f32, v: &mut f32| {
            *m = b1 * *m + (1.0 - b1) * g;
            *v = b2 * *v + (1.0 - b2) * g * g;
            *p -= lr * (*m / c1) / ((*v / c2).sqrt() + 1e-8);
        };
        for (((l, g), m), v) in layers
            .iter_mut()
            .zip(grads)
            .zip(&mut self.m)
            .zip(&mut self.v)
        {
            for (((wr, gr), mr), vr) in l
                .weights
                .iter_mut()
                .zip(&g.weights)
                .zip(&mut m.weights)
                .zip(&mut v.weights)
            {
                for (((p, g), m), v) in wr.iter_mut().zip(gr).zip(mr.iter_mut()).zip(vr.iter_mut())
                {
                    upd(p, *g, m, v);
                }
            }
            for (((p, g), m), v) in l
                .bias
                .iter_mut()
                .zip(&g.bias)
                .zip(&mut m.bias)
                .zip(&mut v.bias)
            {
                upd(p, *g, m, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use approxy_verifier::verify::{Features, LearnedVerifier, Verifier};

    /// Rows whose label is a known function of one hidden unit and one context value: a
    /// working fit that reads both must find it.
    fn synthetic(n: usize) -> Rows {
        let mut rng = StdRng::seed_from_u64(1);
        let mut r = Rows::new(3);
        for i in 0..n {
            let h: Vec<f32> = (0..3).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut context = [0f32; N_CONTEXT];
            context
                .iter_mut()
                .for_each(|c| *c = rng.random_range(-1.0..1.0));
            let label = h[1] + context[5] > 0.2;
            let f = Features {
                top1: 0,
                token: 0,
                top1_prob: 0.5,
                stats: [0.5, 0.1, 1.0, 10.0],
                hidden: h.into(),
                context,
                syntax: Default::default(),
            };
            r.push(&f, label, i as u32, 0);
        }
        r
    }

    fn accuracy(a: Artifact, rows: &Rows) -> f32 {
        let v = LearnedVerifier::from_artifact(a, "sha").unwrap_or_else(|e| panic!("{e}"));
        let ok = (0..rows.len())
            .filter(|&i| (v.p_accept(&rows.features_of(i)) >= 0.5) == (rows.labels[i] == 1))
            .count();
        ok as f32 / rows.len() as f32
    }

    fn opts(kind: HeadKind, use_context: bool) -> FitOptions {
        FitOptions {
            kind,
            epochs: 30,
            batch: 64,
            learning_rate: 0.02,
            weight_decay: 0.0,
            seed: 3,
            use_hidden: true,
            use_context,
        }
    }

    #[test]
    fn both_heads_learn_a_separable_rule_and_load_for_serving() {
        let rows = synthetic(2000);
        let idx: Vec<usize> = (0..rows.len()).collect();
        for kind in [HeadKind::Logistic, HeadKind::Mlp(4)] {
            let a = fit(&rows, &idx, &opts(kind, true), "sha");
            let again = fit(&rows, &idx, &opts(kind, true), "sha");
            assert_eq!(
                a.layers[0].weights, again.layers[0].weights,
                "not deterministic"
            );
            let acc = accuracy(a, &rows);
            assert!(acc > 0.95, "{kind:?}: accuracy {acc}");
            // Without the context half of the rule is invisible.
            let blind = accuracy(fit(&rows, &idx, &opts(kind, false), "sha"), &rows);
            assert!(
                blind < 0.85,
                "{kind:?}: accuracy {blind} without the context"
            );
        }
    }

    #[test]
    fn held_out_split_is_by_prompt_and_about_a_fifth() {
        let held = (0..10_000u32).filter(|&i| is_held_out(i, 7)).count();
        assert!((1700..2300).contains(&held), "{held}");
        assert_ne!(
            (0..100u32)
                .filter(|&i| is_held_out(i, 7))
                .collect::<Vec<_>>(),
            (0..100u32)
                .filter(|&i| is_held_out(i, 8))
                .collect::<Vec<_>>()
        );
    }
}
