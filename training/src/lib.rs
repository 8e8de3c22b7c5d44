//! approxy training.
