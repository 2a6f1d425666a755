//! TODO

pub mod jetstream;
