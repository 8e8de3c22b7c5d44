//! Verifier training for approxy: the prompt corpus, label collection from a real target,
//! fitting the verifier head, and threshold calibration.
//!
//! Layout:
//! - `cli`: `approxy train collect` and `approxy train fit`, wired to the draft and the cache home.
//! - `corpus`: the prompt corpus and HumanEval problems.
//! - `collect`: target answers plus teacher-forced (or live) draft features, as shards.
//! - `dataset`: reading the shards back as rows.
//! - `humaneval`: HumanEval's pass@1 check, sandboxed, and the problems training never sees.
//! - `importance`: AutoJudge's importance labels: does the draft's token change the tests' verdict?
//! - `importance_chat`: the same labels on chat: does the draft's token flip an instruction
//!   checked by code, or cost the finished answer the target's likelihood?
//! - `importance_cli`: `approxy train importance`, wired to the draft, the target and HumanEval.
//! - `instructions`: the instruction-following set and IFEval's checkers over answers.
//! - `fit`: logistic and MLP heads, trained and exported as verifier artifacts.
//! - `report`: ROC AUC and the threshold grid written into the calibration file.
//! - `rule_study`: what each acceptance rule accepts on rows with the target's probabilities.
//! - `charts`: the ROC and threshold PNGs beside it.

pub mod charts;
pub mod cli;
pub mod collect;
pub mod corpus;
pub mod dataset;
pub mod fit;
pub mod humaneval;
pub mod importance;
pub mod importance_chat;
pub mod importance_cli;
pub mod instructions;
pub mod report;
pub mod rule_study;
