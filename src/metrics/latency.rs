//! The receipt → publish latency histogram, lock-free.
//!
//! prometheus-client's own `Histogram` takes a mutex on every observation;
//! at 100k+ results per second across all worker tasks that lock would be the
//! hottest one in the process. This histogram is one atomic add per bucket hit
//! plus one for the sum, and is encoded through prometheus-client like any
//! other metric.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::{MetricType, TypedMetric};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in microseconds: 50 µs to 5 s. A handoff on
/// loopback takes tens of microseconds; seconds mean something is very wrong.
const BOUNDS_US: [u64; 16] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000,
];

/// Bounds for the time left to a deadline, in microseconds: 0 (already
/// past) and 1 ms to 10 minutes (the default cancel retention: a longer
/// deadline is as good as none here).
pub const DEADLINE_BOUNDS_US: [u64; 16] = [
    0,
    1_000,
    10_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    30_000_000,
    60_000_000,
    120_000_000,
    300_000_000,
    600_000_000,
];

const MAX_NANOS: u64 = 86_400 * 1_000_000_000;

/// A histogram of durations with fixed buckets (see [`LatencyHistogram::bounds_seconds`]).
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Upper bounds, in microseconds, ascending.
    bounds: &'static [u64; 16],
    /// Non-cumulative counts; the last one is `+Inf`.
    buckets: [AtomicU64; BOUNDS_US.len() + 1],
    sum_nanos: AtomicU64,
}

impl Default for LatencyHistogram {
    /// Receipt → publish latencies: 50 µs to 5 s.
    fn default() -> Self {
        LatencyHistogram::with_bounds(&BOUNDS_US)
    }
}

impl LatencyHistogram {
    /// A histogram with these upper bounds, in microseconds, ascending
    /// (and `+Inf`).
    pub fn with_bounds(bounds: &'static [u64; 16]) -> LatencyHistogram {
        debug_assert!(bounds.is_sorted());
        LatencyHistogram {
            inner: Arc::new(Inner {
                bounds,
                buckets: Default::default(),
                sum_nanos: AtomicU64::new(0),
            }),
        }
    }

    pub fn observe(&self, latency: Duration) {
        // Capped at a day so that no observation can wrap the sum.
        let nanos = u64::try_from(latency.as_nanos()).map_or(MAX_NANOS, |n| n.min(MAX_NANOS));
        let micros = nanos / 1_000;
        // "le" buckets: a value equal to a bound belongs to that bound. A value
        // inside a microsecond just above a bound rounds down into it: harmless.
        let index = self.inner.bounds.partition_point(|&bound| bound < micros);
        self.inner.buckets[index].fetch_add(1, Ordering::Relaxed);
        self.inner.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The bucket upper bounds in seconds, without `+Inf`.
    pub fn bounds_seconds(&self) -> impl Iterator<Item = f64> + '_ {
        self.inner.bounds.iter().map(|&us| us as f64 / 1e6)
    }

    /// How many observations were made.
    pub fn count(&self) -> u64 {
        self.snapshot().1
    }

    /// `(sum in seconds, count, [(upper bound, non-cumulative count)])`.
    fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let buckets: Vec<(f64, u64)> = self
            .bounds_seconds()
            .chain(std::iter::once(f64::INFINITY))
            .zip(&self.inner.buckets)
            .map(|(bound, n)| (bound, n.load(Ordering::Relaxed)))
            .collect();
        // The count is the sum of the buckets, so `_count` always equals the
        // `+Inf` bucket even while observations race with a scrape.
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = self.inner.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        (sum, count, buckets)
    }
}

impl TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.snapshot();
        encoder.encode_histogram::<NoLabelSet>(
            sum,
            count,
            &buckets,
            None::<&HashMap<usize, Exemplar<NoLabelSet, f64>>>,
        )
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_smallest_bucket_that_holds_them() {
        // (latency, index of the bucket it must land in)
        let cases = [
            (Duration::ZERO, 0),
            (Duration::from_micros(50), 0),
            (Duration::from_micros(51), 1),
            (Duration::from_micros(100), 1),
            (Duration::from_millis(1), 4),
            (Duration::from_millis(3), 6),
            (Duration::from_secs(5), 15),
            (Duration::from_secs(6), 16),
            (Duration::MAX, 16),
        ];
        for (latency, want) in cases {
            let h = LatencyHistogram::default();
            h.observe(latency);
            let (_, count, buckets) = h.snapshot();
            assert_eq!(count, 1, "{latency:?}");
            let hit: Vec<usize> = buckets
                .iter()
                .enumerate()
                .filter(|(_, (_, n))| *n == 1)
                .map(|(i, _)| i)
                .collect();
            assert_eq!(hit, vec![want], "{latency:?}");
        }
    }

    #[test]
    fn deadline_bounds_start_at_zero() {
        let h = LatencyHistogram::with_bounds(&DEADLINE_BOUNDS_US);
        h.observe(Duration::ZERO);
        h.observe(Duration::from_micros(999));
        h.observe(Duration::from_secs(3600));
        let (_, count, buckets) = h.snapshot();
        assert_eq!(count, 3);
        assert_eq!((buckets[0], buckets[1].1, buckets[16].1), ((0.0, 1), 1, 1));
    }

    #[test]
    fn sum_is_in_seconds() {
        let h = LatencyHistogram::default();
        h.observe(Duration::from_millis(1500));
        h.observe(Duration::from_millis(500));
        let (sum, count, _) = h.snapshot();
        assert_eq!(count, 2);
        assert!((sum - 2.0).abs() < 1e-9, "{sum}");
    }
}
