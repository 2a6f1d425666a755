//! TensorRT-LLM-compatible request IDs: the rc21 and rc22 layouts, bit for bit,
//! plus the generator that never repeats an ID within a slot.
//!
//! Everything here is pure: the current time is always passed in.

mod generator;
mod layout;

pub use generator::{Exhausted, IdGenerator};
pub use layout::{DecodedId, IdLayout, LayoutError};

use std::fmt;
use thiserror::Error;

/// How many machine-ID slots exist. Both layouts leave room for 1024, but
/// upstream reserves the top three, so slots are `0..1021`.
pub const SLOT_COUNT: u16 = 1021;

/// A machine ID in `[0, 1021)`. The only way to build one checks the range, so
/// a `MachineId` can never name a slot outside the layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MachineId(u16);

#[derive(Debug, Error, PartialEq, Eq)]
#[error("machine ID {0} is out of range; a machine ID must be an integer in [0, 1021)")]
pub struct MachineIdOutOfRange(pub i128);

impl MachineId {
    pub fn new(value: i128) -> Result<MachineId, MachineIdOutOfRange> {
        if (0..i128::from(SLOT_COUNT)).contains(&value) {
            Ok(MachineId(value as u16))
        } else {
            Err(MachineIdOutOfRange(value))
        }
    }

    /// The slot a lease prefers: `lease_id % 1021`.
    pub fn preferred_for_lease(lease_id: i64) -> MachineId {
        MachineId(lease_id.rem_euclid(i64::from(SLOT_COUNT)) as u16)
    }

    /// The next slot upward, wrapping from 1020 to 0.
    pub fn next_wrapping(self) -> MachineId {
        MachineId((self.0 + 1) % SLOT_COUNT)
    }

    pub fn get(self) -> u16 {
        self.0
    }

    /// rc22's split of the machine ID: `divmod(machine_id, 64)`.
    pub fn node_and_process(self) -> (u16, u16) {
        (self.0 / 64, self.0 % 64)
    }
}

impl fmt::Display for MachineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Milliseconds since the Unix epoch of the default ID epoch,
/// 2025-01-01T00:00:00Z.
pub const DEFAULT_EPOCH_UNIX_MS: u64 = 1_735_689_600_000;
