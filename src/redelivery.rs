//! The JetStream redelivery schedule, from `jetstream.*`: how long a result
//! waits before it is delivered again (a nak delay that doubles per
//! delivery, up to a cap), how many deliveries there are, and the longest
//! span they allow. The settling rules use it per delivery
//! (`pipeline::settle`); the setup sizes the GEN stream's duplicate window
//! to cover its span (`setup::duplicate_window`). Core NATS is
//! [`Redelivery::AT_MOST_ONCE`].

use std::time::Duration;

/// The redelivery settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redelivery {
    /// The first nak delay (`jetstream.nak_delay_ms`).
    pub nak_delay: Duration,
    /// The delivery limit (`jetstream.max_deliver`); -1 means none.
    pub max_deliver: i64,
}

impl Redelivery {
    /// No redelivery: each delivery is the only one.
    pub const AT_MOST_ONCE: Redelivery = Redelivery {
        nak_delay: Duration::ZERO,
        max_deliver: 1,
    };
}

/// Nak delays double per delivery up to this multiple of the first one.
pub const MAX_BACKOFF_FACTOR: u32 = 32;

impl Redelivery {
    /// The nak delay after the `delivered`-th delivery (1 = first):
    /// `nak_delay × 2^(delivered-1)`, at most `nak_delay × 32`.
    pub fn delay(&self, delivered: i64) -> Duration {
        let doublings = delivered.saturating_sub(1).clamp(0, 5) as u32;
        let factor = (1u32 << doublings).min(MAX_BACKOFF_FACTOR);
        self.nak_delay.saturating_mul(factor)
    }

    /// The longest time from a message's first publish of an output to its
    /// last possible re-publish: every delivery may be held for `ack_wait`
    /// (the publish can happen at its very end) and each but the last may
    /// be followed by its nak delay. `None` without a delivery limit: the
    /// span is unbounded. Defaults (30 s, 20 deliveries, 1 s): 20 × 30 s +
    /// (1 + 2 + 4 + 8 + 16 + 14 × 32) s = 1079 s.
    pub fn span(&self, ack_wait: Duration) -> Option<Duration> {
        if self.max_deliver <= 0 {
            return None;
        }
        let holds = ack_wait.saturating_mul(u32::try_from(self.max_deliver).unwrap_or(u32::MAX));
        let naks = (1..self.max_deliver.min(i64::from(u32::MAX)))
            .map(|delivered| self.delay(delivered))
            .fold(Duration::ZERO, Duration::saturating_add);
        Some(holds.saturating_add(naks))
    }

    /// Whether the server will not deliver the message again after this delivery.
    pub fn is_last(&self, delivered: i64) -> bool {
        self.max_deliver > 0 && delivered >= self.max_deliver
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: Redelivery = Redelivery {
        nak_delay: Duration::from_millis(100),
        max_deliver: 5,
    };
    const UNLIMITED: Redelivery = Redelivery {
        nak_delay: Duration::from_millis(100),
        max_deliver: -1,
    };

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn span_covers_every_hold_and_every_nak_delay() {
        let ms = Duration::from_millis;
        let limited = |max_deliver| Redelivery {
            nak_delay: ms(1000),
            max_deliver,
        };
        let ack_wait = Duration::from_secs(30);
        assert_eq!(limited(1).span(ack_wait), Some(ack_wait));
        assert_eq!(limited(3).span(ack_wait), Some(ms(90_000 + 1000 + 2000)));
        assert_eq!(
            limited(20).span(ack_wait),
            Some(Duration::from_secs(600 + 31 + 14 * 32))
        );
        assert_eq!(UNLIMITED.span(ack_wait), None);
    }

    #[test]
    fn delay_doubles_then_caps() {
        let got: Vec<u64> = (0..=9)
            .map(|d| UNLIMITED.delay(d).as_millis() as u64)
            .collect();
        assert_eq!(
            got,
            vec![100, 100, 200, 400, 800, 1600, 3200, 3200, 3200, 3200]
        );
        assert_eq!(UNLIMITED.delay(i64::MAX), ms(3200));
        assert_eq!(UNLIMITED.delay(i64::MIN), ms(100));
    }

    #[test]
    fn last_delivery() {
        assert!(!R.is_last(4));
        assert!(R.is_last(5));
        assert!(!UNLIMITED.is_last(i64::MAX));
    }
}
