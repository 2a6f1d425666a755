//! The wall clock, read only at the edge and passed into the pure core.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch. A clock set before 1970 reads as 0.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

/// Milliseconds since an ID epoch (given in Unix milliseconds), 0 before it.
pub fn since_epoch_ms(epoch_unix_ms: u64) -> u64 {
    unix_ms().saturating_sub(epoch_unix_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_reads_after_its_epochs_and_zero_before() {
        // 2020-09-13: a working clock reads later.
        assert!(unix_ms() > 1_600_000_000_000);
        assert_eq!(since_epoch_ms(u64::MAX), 0);
        assert!(since_epoch_ms(0) >= unix_ms() - 1000);
    }
}
