//! Verifier training for approxy: the prompt corpus, label collection from a real target,
//! fitting the verifier head, and threshold calibration.

pub mod charts;
pub mod collect;
pub mod corpus;
pub mod dataset;
pub mod fit;
pub mod report;
