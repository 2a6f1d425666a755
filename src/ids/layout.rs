//! The two request-ID layouts TensorRT-LLM accepts.
//!
//! `MAX = 2^63 - 1`.
//! - rc21: `raw = ts << 22 | machine_id << 12 | counter` (12-bit counter),
//!   `id = raw % (MAX - 2^42) + 2^42`.
//! - rc22: `(node, process) = divmod(machine_id, 64)`,
//!   `raw = (ts mod 2^39) << 24 | node << 16 | process << 10 | counter`
//!   (10-bit counter), `id = raw % (MAX - 2^40) + 2^40`.

use super::MachineId;
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

const MAX: u64 = (1 << 63) - 1;

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum IdLayout {
    Rc21,
    #[default]
    Rc22,
}

/// The fields an ID carries, as `decode-id` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedId {
    pub timestamp_ms: u64,
    pub machine_id: u16,
    /// rc22 only.
    pub node_id: Option<u16>,
    /// rc22 only.
    pub process_id: Option<u16>,
    pub counter: u16,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("unknown ID layout {0:?}; expected \"rc21\" or \"rc22\"")]
    UnknownLayout(String),
    #[error("ID {id} is below the {layout} offset {offset}; it was not minted with this layout")]
    BelowOffset {
        id: u64,
        layout: IdLayout,
        offset: u64,
    },
    #[error("ID {id} is not below 2^63 - 1; no layout mints IDs that large")]
    AboveMax { id: u64 },
    #[error(
        "ID {id} decodes to machine ID {machine_id}, outside [0, 1021); it was not minted with the {layout} layout"
    )]
    NotAMachineId {
        id: u64,
        layout: IdLayout,
        machine_id: u16,
    },
}

impl IdLayout {
    pub fn as_str(self) -> &'static str {
        match self {
            IdLayout::Rc21 => "rc21",
            IdLayout::Rc22 => "rc22",
        }
    }

    /// Bits of the per-millisecond counter.
    pub fn counter_bits(self) -> u32 {
        match self {
            IdLayout::Rc21 => 12,
            IdLayout::Rc22 => 10,
        }
    }

    /// The largest counter value within one millisecond.
    pub fn max_counter(self) -> u16 {
        ((1u32 << self.counter_bits()) - 1) as u16
    }

    /// The timestamp as the layout stores it (rc22 keeps only 39 bits).
    pub fn stored_timestamp(self, ts_ms: u64) -> u64 {
        match self {
            IdLayout::Rc21 => ts_ms,
            IdLayout::Rc22 => ts_ms & ((1 << 39) - 1),
        }
    }

    /// What is added to the raw value: 2^42 (rc21) or 2^40 (rc22).
    pub fn offset(self) -> u64 {
        match self {
            IdLayout::Rc21 => 1 << 42,
            IdLayout::Rc22 => 1 << 40,
        }
    }

    /// The raw value before the modulo and offset.
    pub fn raw(self, ts_ms: u64, machine_id: MachineId, counter: u16) -> u128 {
        let counter = u128::from(counter & self.max_counter());
        let m = u128::from(machine_id.get());
        match self {
            IdLayout::Rc21 => u128::from(ts_ms) << 22 | m << 12 | counter,
            IdLayout::Rc22 => {
                let (node, process) = machine_id.node_and_process();
                u128::from(self.stored_timestamp(ts_ms)) << 24
                    | u128::from(node) << 16
                    | u128::from(process) << 10
                    | counter
            }
        }
    }

    /// The request ID for a raw value: `raw % (MAX - offset) + offset`.
    pub fn id_from_raw(self, raw: u128) -> u64 {
        let modulus = u128::from(MAX - self.offset());
        (raw % modulus) as u64 + self.offset()
    }

    /// Mints the ID for the given fields.
    pub fn encode(self, ts_ms: u64, machine_id: MachineId, counter: u16) -> u64 {
        self.id_from_raw(self.raw(ts_ms, machine_id, counter))
    }

    /// Reverses [`IdLayout::encode`]: subtracts the offset and splits the fields.
    pub fn decode(self, id: u64) -> Result<DecodedId, LayoutError> {
        if id >= MAX {
            return Err(LayoutError::AboveMax { id });
        }
        let offset = self.offset();
        let raw = id.checked_sub(offset).ok_or(LayoutError::BelowOffset {
            id,
            layout: self,
            offset,
        })?;
        let counter = (raw & u64::from(self.max_counter())) as u16;
        let decoded = match self {
            IdLayout::Rc21 => DecodedId {
                timestamp_ms: raw >> 22,
                machine_id: ((raw >> 12) & 0x3ff) as u16,
                node_id: None,
                process_id: None,
                counter,
            },
            IdLayout::Rc22 => {
                let node = ((raw >> 16) & 0xff) as u16;
                let process = ((raw >> 10) & 0x3f) as u16;
                DecodedId {
                    timestamp_ms: raw >> 24,
                    machine_id: node * 64 + process,
                    node_id: Some(node),
                    process_id: Some(process),
                    counter,
                }
            }
        };
        if decoded.machine_id >= super::SLOT_COUNT {
            return Err(LayoutError::NotAMachineId {
                id,
                layout: self,
                machine_id: decoded.machine_id,
            });
        }
        Ok(decoded)
    }
}

impl fmt::Display for IdLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for IdLayout {
    type Err = LayoutError;

    fn from_str(s: &str) -> Result<IdLayout, LayoutError> {
        match s {
            "rc21" => Ok(IdLayout::Rc21),
            "rc22" => Ok(IdLayout::Rc22),
            other => Err(LayoutError::UnknownLayout(other.to_string())),
        }
    }
}
