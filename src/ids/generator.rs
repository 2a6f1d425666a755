//! The per-slot ID generator.
//!
//! Upstream's generator can repeat an ID when its counter wraps within one
//! millisecond or when the wall clock steps back. This one never does: it
//! refuses to mint (returning [`Exhausted`]) until the millisecond moves on,
//! and it never lets its own millisecond go backwards. Within one slot the raw
//! values it hands out strictly increase.

use super::{IdLayout, MachineId};

/// The generator's state for one slot.
#[derive(Debug, Clone)]
pub struct IdGenerator {
    layout: IdLayout,
    machine_id: MachineId,
    /// The last millisecond an ID was minted in, and the counter used there.
    last: Option<(u64, u16)>,
}

/// The counter is used up for the generator's current millisecond; try again
/// once the clock reads `retry_at_ms` or later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exhausted {
    pub retry_at_ms: u64,
}

impl IdGenerator {
    pub fn new(layout: IdLayout, machine_id: MachineId) -> IdGenerator {
        IdGenerator {
            layout,
            machine_id,
            last: None,
        }
    }

    /// A generator whose first ID's millisecond is above `floor_ms`: a reading
    /// at or below the floor is treated as the floor with its counter used up
    /// ([`Exhausted`] with `retry_at_ms: floor_ms + 1`). It continues where an
    /// earlier holder of the slot, or an earlier generator of this process,
    /// left off, so nothing it mints can repeat what they minted.
    pub fn above(layout: IdLayout, machine_id: MachineId, floor_ms: u64) -> IdGenerator {
        IdGenerator {
            layout,
            machine_id,
            last: Some((floor_ms, layout.max_counter())),
        }
    }

    pub fn layout(&self) -> IdLayout {
        self.layout
    }

    /// The highest millisecond this generator has minted in (or the floor it
    /// was started above); `None` before the first ID of [`IdGenerator::new`].
    pub fn last_ms(&self) -> Option<u64> {
        self.last.map(|(ms, _)| ms)
    }

    pub fn machine_id(&self) -> MachineId {
        self.machine_id
    }

    /// Mints the next ID for `now_ms` (milliseconds since the ID epoch).
    ///
    /// A clock reading behind the last millisecond used is treated as that
    /// millisecond: the generator keeps its own time rather than repeat.
    pub fn try_next(&mut self, now_ms: u64) -> Result<u64, Exhausted> {
        let (ms, counter) = match self.last {
            Some((last_ms, counter)) if now_ms <= last_ms => {
                if counter >= self.layout.max_counter() {
                    return Err(Exhausted {
                        retry_at_ms: last_ms + 1,
                    });
                }
                (last_ms, counter + 1)
            }
            _ => (now_ms, 0),
        };
        self.last = Some((ms, counter));
        Ok(self.layout.encode(ms, self.machine_id, counter))
    }

    /// Mints the next ID, reading the time from `clock` and waiting (by
    /// reading it again) while the counter is used up.
    pub fn next_with(&mut self, mut clock: impl FnMut() -> u64) -> u64 {
        loop {
            match self.try_next(clock()) {
                Ok(id) => return id,
                Err(_) => std::thread::yield_now(),
            }
        }
    }
}
