//! One generation, in stages: [`generate`] drives the loop; [`state`] holds what a generation
//! carries between steps; each other file is one stage of `impl Run` (the grammar's step, the
//! verdict on a draft token, windows, spans, the hand-off, picks, target calls and their
//! account, warming, emitting), the way a proxy spreads one service over a file per layer.

mod emit;
mod generate;
mod grammar_step;
mod hand_off;
mod pick;
mod span;
mod state;
mod target_call;
mod verdict;
mod warming;
mod window;
