//! The ID service's own budget: a token bucket of IDs, separate from the
//! decode jobs' minting.
//!
//! A slot mints at most 1,024 IDs per millisecond in rc22 (4,096 in rc21),
//! shared by decode jobs and the ID service. Without a budget, clients asking
//! for 1,024 IDs in a loop used that up, pushed the generator toward the end
//! of its etcd reservation, and decode jobs then answered
//! `identity_unavailable`. The service now hands out at most
//! `id_service.ids_per_sec` IDs per second (refusing the rest with
//! `rate_limited`), at most half of what a slot can mint, so decode jobs
//! always keep the other half.
//!
//! The bucket is owned by the service's one request loop: no lock, and the
//! time is passed in.

use std::time::{Duration, Instant};

/// How much the bucket holds: a tenth of a second of the rate, but never
/// less than one request of the largest allowed count (or a large request
/// could never pass at a low rate).
const BURST: Duration = Duration::from_millis(100);

/// IDs are counted in billionths (one ID = 10^9 units), so that a
/// nanosecond's refill at any rate is a whole number and no rounding
/// accumulates.
const UNIT: u128 = 1_000_000_000;

#[derive(Debug, Clone)]
pub struct Budget {
    /// The most IDs one request may take (`id_service.max_count`).
    max_count: u64,
    ids_per_sec: u128,
    capacity: u128,
    tokens: u128,
    refilled_at: Instant,
}

/// Why a request's IDs were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OverBudget {
    #[error(
        "{asked} IDs were asked for; this service hands out at most {max} per request (id_service.max_count)"
    )]
    TooMany { asked: u64, max: u64 },
    #[error(
        "the ID service's budget (id_service.ids_per_sec) is spent; retry after {} ms",
        retry_after.as_millis().max(1)
    )]
    Spent { retry_after: Duration },
}

impl Budget {
    /// A full bucket at `now`.
    pub fn new(ids_per_sec: u64, max_count: u64, now: Instant) -> Budget {
        let ids_per_sec = u128::from(ids_per_sec.max(1));
        let burst = ids_per_sec * BURST.as_nanos();
        let capacity = burst.max(u128::from(max_count) * UNIT);
        Budget {
            max_count,
            ids_per_sec,
            capacity,
            tokens: capacity,
            refilled_at: now,
        }
    }

    /// Takes `count` IDs from the budget at `now`, or refuses without taking
    /// any. An instant earlier than the last one refills nothing.
    pub fn take(&mut self, count: u64, now: Instant) -> Result<(), OverBudget> {
        if count > self.max_count {
            return Err(OverBudget::TooMany {
                asked: count,
                max: self.max_count,
            });
        }
        let elapsed = now.saturating_duration_since(self.refilled_at).as_nanos();
        self.refilled_at = self.refilled_at.max(now);
        self.tokens = (self.tokens + elapsed * self.ids_per_sec).min(self.capacity);
        let wanted = u128::from(count) * UNIT;
        if self.tokens >= wanted {
            self.tokens -= wanted;
            return Ok(());
        }
        let nanos = (wanted - self.tokens).div_ceil(self.ids_per_sec);
        Err(OverBudget::Spent {
            retry_after: Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let ms = Duration::from_millis;
        // (rate, max count, [(ms after start, count, taken)])
        type Step = (u64, u64, bool);
        let rows: &[(&str, u64, u64, &[Step])] = &[
            (
                "a full bucket holds a tenth of a second",
                10_000,
                1000,
                &[(0, 1000, true), (0, 1, false)],
            ),
            (
                "never less than one largest request",
                100,
                1024,
                &[(0, 1024, true), (0, 1, false)],
            ),
            (
                "more than the max count per request is refused whatever the budget",
                10_000,
                100,
                &[(0, 101, false), (0, 100, true)],
            ),
            (
                "refills at the rate",
                10_000,
                1000,
                &[(0, 1000, true), (50, 500, true), (50, 1, false)],
            ),
            (
                "refills up to the capacity only",
                10_000,
                1000,
                &[(0, 1000, true), (10_000, 1001, false), (10_000, 1000, true)],
            ),
            (
                "a refusal takes nothing",
                10_000,
                1000,
                &[(0, 600, true), (0, 500, false), (0, 400, true)],
            ),
            (
                "the clock going back refills nothing",
                10_000,
                1000,
                &[(100, 1000, true), (0, 1, false), (100, 1, false)],
            ),
            (
                "a flood gets the rate and no more",
                10_000,
                1000,
                &[
                    (0, 1000, true),
                    (1, 1000, false),
                    (2, 1000, false),
                    (100, 1000, true),
                    (101, 1000, false),
                ],
            ),
        ];
        for (name, rate, max, steps) in rows {
            let start = Instant::now();
            let mut budget = Budget::new(*rate, *max, start);
            for (i, (at, count, taken)) in steps.iter().enumerate() {
                let got = budget.take(*count, start + ms(*at));
                assert_eq!(got.is_ok(), *taken, "{name}, step {i}: {got:?}");
            }
        }
    }

    #[test]
    fn a_refusal_says_when_the_ids_will_be_there() {
        let start = Instant::now();
        let mut budget = Budget::new(1000, 100, start);
        budget.take(100, start).expect("full");
        let refused = budget.take(10, start).expect_err("empty");
        assert_eq!(
            refused,
            OverBudget::Spent {
                retry_after: Duration::from_millis(10)
            }
        );
        assert!(budget.take(10, start + Duration::from_millis(10)).is_ok());
    }
}
