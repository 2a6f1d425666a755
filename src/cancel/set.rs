//! The set of cancelled request IDs one worker holds: bounded in entries and
//! in bytes, each entry kept for a retention time. Pure: time is an argument.
//!
//! Cancels are held in the order they came. A new cancel first drops the
//! ones past their retention (expired), then the oldest ones while a bound
//! would be passed (evicted): a flood of cancels costs at most the bounds,
//! and what the bounds cost is counted. A lookup ignores an entry past its
//! retention even before it is dropped.

use std::collections::{HashMap, VecDeque};

/// Seeded at random per set: request IDs come from publishers, and an
/// unseeded hash would let one pick IDs that collide.
type Hasher = foldhash::fast::RandomState;
use std::sync::Arc;

/// What one held cancel is charged besides its request ID and reason: its
/// hash map slot (key, time, reason pointer, control byte, at the map's
/// load factor), the order queue's slot and the allocators' rounding.
pub const ENTRY_OVERHEAD: usize = 160;

/// The bounds of a [`CancelSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_entries: usize,
    /// Bytes, each entry counted as [`charge`] says.
    pub max_bytes: usize,
    pub retention_ms: u64,
}

/// The bytes one cancel is charged against [`Limits::max_bytes`].
pub fn charge(request_id: &str, reason: Option<&str>) -> usize {
    ENTRY_OVERHEAD + request_id.len() + reason.map_or(0, str::len)
}

#[derive(Debug)]
struct Held {
    at_ms: u64,
    reason: Option<Box<str>>,
}

/// What [`CancelSet::record`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Recorded {
    /// The request was not held yet and is now.
    pub new: bool,
    /// Older cancels dropped past their retention.
    pub expired: usize,
    /// Older cancels dropped to keep within the bounds.
    pub evicted: usize,
}

#[derive(Debug)]
pub struct CancelSet {
    limits: Limits,
    by_id: HashMap<Arc<str>, Held, Hasher>,
    /// The held request IDs, oldest first, with when each was recorded.
    order: VecDeque<(Arc<str>, u64)>,
    bytes: usize,
}

impl CancelSet {
    pub fn new(limits: Limits) -> CancelSet {
        CancelSet {
            limits,
            by_id: HashMap::default(),
            order: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Holds a cancel of `request_id` from `now_ms` on. A request already
    /// held keeps its first cancel (and its retention). A cancel larger than
    /// the byte bound on its own is not held (`new` false).
    pub fn record(&mut self, request_id: &str, reason: Option<&str>, now_ms: u64) -> Recorded {
        let mut done = Recorded {
            expired: self.expire(now_ms),
            ..Recorded::default()
        };
        if self.by_id.contains_key(request_id) {
            return done;
        }
        let cost = charge(request_id, reason);
        if cost > self.limits.max_bytes {
            return done;
        }
        while !self.order.is_empty()
            && (self.order.len() >= self.limits.max_entries
                || self.bytes + cost > self.limits.max_bytes)
        {
            self.drop_oldest();
            done.evicted += 1;
        }
        let id: Arc<str> = Arc::from(request_id);
        self.order.push_back((id.clone(), now_ms));
        self.by_id.insert(
            id,
            Held {
                at_ms: now_ms,
                reason: reason.map(Box::from),
            },
        );
        self.bytes += cost;
        done.new = true;
        done
    }

    /// The cancel held for `request_id` at `now_ms`: its reason (`Some(None)`
    /// when it gave none).
    pub fn lookup(&self, request_id: &str, now_ms: u64) -> Option<Option<&str>> {
        let held = self.by_id.get(request_id)?;
        self.fresh(held.at_ms, now_ms)
            .then_some(held.reason.as_deref())
    }

    /// Drops the cancels past their retention at `now_ms`; how many.
    pub fn expire(&mut self, now_ms: u64) -> usize {
        let mut expired = 0;
        while let Some((_, at_ms)) = self.order.front() {
            if self.fresh(*at_ms, now_ms) {
                break;
            }
            self.drop_oldest();
            expired += 1;
        }
        expired
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The bytes charged for the cancels held ([`charge`]).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether a cancel recorded at `at_ms` is still held at `now_ms`. A
    /// clock that stepped back keeps it.
    fn fresh(&self, at_ms: u64, now_ms: u64) -> bool {
        now_ms.saturating_sub(at_ms) < self.limits.retention_ms
    }

    fn drop_oldest(&mut self) {
        if let Some((id, _)) = self.order.pop_front()
            && let Some(held) = self.by_id.remove(&id)
        {
            self.bytes -= charge(&id, held.reason.as_deref());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(max_entries: usize, max_bytes: usize, retention_ms: u64) -> CancelSet {
        CancelSet::new(Limits {
            max_entries,
            max_bytes,
            retention_ms,
        })
    }

    #[test]
    fn a_cancel_is_held_for_its_retention_and_then_forgotten() {
        let mut s = set(10, 1 << 20, 1000);
        assert_eq!(s.lookup("r1", 0), None);
        let done = s.record("r1", Some("gone"), 5_000);
        assert_eq!(
            done,
            Recorded {
                new: true,
                ..Recorded::default()
            }
        );
        assert_eq!(s.lookup("r1", 5_000), Some(Some("gone")));
        assert_eq!(s.lookup("r1", 5_999), Some(Some("gone")));
        assert_eq!(s.lookup("r1", 6_000), None, "past its retention");
        assert_eq!(
            s.lookup("r1", 4_000),
            Some(Some("gone")),
            "clock stepped back"
        );
        assert_eq!(s.lookup("r2", 5_000), None);
        // A second cancel of the same request keeps the first.
        assert!(!s.record("r1", None, 5_500).new);
        assert_eq!(s.lookup("r1", 5_600), Some(Some("gone")));
        // Expired entries are dropped by the next record.
        let done = s.record("r2", None, 7_000);
        assert_eq!((done.new, done.expired, done.evicted), (true, 1, 0));
        assert_eq!(s.len(), 1);
        assert_eq!(s.lookup("r2", 7_000), Some(None));
        assert_eq!(s.expire(8_000), 1);
        assert!(s.is_empty() && s.bytes() == 0);
    }

    #[test]
    fn the_entry_bound_evicts_the_oldest_and_counts_them() {
        let mut s = set(3, 1 << 20, 60_000);
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            assert_eq!(s.record(id, None, i as u64).evicted, 0);
        }
        let done = s.record("d", None, 10);
        assert_eq!((done.new, done.evicted), (true, 1));
        assert_eq!(s.lookup("a", 10), None, "the oldest went");
        for id in ["b", "c", "d"] {
            assert!(s.lookup(id, 10).is_some(), "{id}");
        }
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn the_byte_bound_evicts_as_many_as_a_new_cancel_needs() {
        let small = charge("aa", None);
        let mut s = set(100, small * 3, 60_000);
        for id in ["aa", "bb", "cc"] {
            assert!(s.record(id, None, 0).new);
        }
        assert_eq!(s.bytes(), small * 3);
        // Twice the size of a small one: two must go.
        let reason = "x".repeat(small - 2);
        let done = s.record("dd", Some(&reason), 1);
        assert_eq!((done.new, done.evicted), (true, 2));
        assert_eq!(s.bytes(), small + charge("dd", Some(&reason)));
        assert!(s.bytes() <= small * 3);
        assert!(s.lookup("cc", 1).is_some() && s.lookup("dd", 1).is_some());
        // One larger than the whole bound is not held, and evicts nothing.
        let huge = "y".repeat(small * 3);
        let done = s.record("ee", Some(&huge), 2);
        assert_eq!((done.new, done.evicted), (false, 0));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn a_flood_stays_within_both_bounds() {
        let limits = Limits {
            max_entries: 1000,
            max_bytes: 100 * 1024,
            retention_ms: 600_000,
        };
        let mut s = CancelSet::new(limits);
        let mut evicted = 0;
        for i in 0..20_000u64 {
            let id = format!("chatcmpl-{i:032x}");
            let done = s.record(&id, None, i / 10);
            assert!(done.new);
            evicted += done.evicted;
            assert!(s.len() <= limits.max_entries && s.bytes() <= limits.max_bytes);
        }
        assert_eq!(evicted + s.len(), 20_000, "every cancel held or counted");
        let last = format!("chatcmpl-{:032x}", 19_999);
        assert!(s.lookup(&last, 2_000).is_some());
    }
}
