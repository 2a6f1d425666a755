//! The wall clock, read only at the edge and passed into the pure core.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch. A clock set before 1970 reads as 0.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Milliseconds since an ID epoch (given in Unix milliseconds), 0 before it.
pub fn since_epoch_ms(epoch_unix_ms: u64) -> u64 {
    unix_ms().saturating_sub(epoch_unix_ms)
}
