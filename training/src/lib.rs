//! Verifier training for approxy: the prompt corpus, label collection from a real target,
//! fitting the verifier head, and threshold calibration.

pub mod corpus;
