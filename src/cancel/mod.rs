//! Cancellation (contract 10): cancels of requests, heard by every worker on
//! `{ns}.handoff.cancel`, held so that the decision can refuse a cancelled
//! request's handoff.
//!
//! - `message`: the cancel message, read and written.
//! - `set`: the bounded set of cancelled request IDs (pure).
//! - `recent`: the decode jobs sent lately, to count a cancel that came too
//!   late to stop one.
//! - here: [`Cancellations`], all three behind one handle shared by the
//!   cancel intake and every decision, and the decision's view of it
//!   ([`crate::decision::Cancels`]).
//!
//! Its NATS side (the subscription every worker holds on the cancel
//! subject, the cancels a JetStream stream kept) is the pipeline's
//! (`crate::pipeline::cancels`), beside the transports.

pub mod message;
mod recent;
mod set;

pub use message::{Cancel, CancelError, MAX_CANCEL_BYTES};
pub use recent::RecentJobs;
pub use set::{CancelSet, ENTRY_OVERHEAD, Limits, Recorded, charge};

use crate::config::CancelConfig;
use crate::decision::{self, Cancelled};
use crate::wire::Encoding;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What taking one cancel did, for metrics and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// Held from now on; older ones dropped to make room or past their
    /// retention.
    Recorded { evicted: usize, expired: usize },
    /// Held already.
    Again { expired: usize },
    /// The request's decode job left before the cancel came: nothing to
    /// stop here (the decode side may listen on the same subject).
    Late,
    /// Not a cancel: counted, never answered.
    Malformed(CancelError),
}

/// The limits `cancel.*` set.
pub fn limits(config: &CancelConfig) -> Limits {
    Limits {
        max_entries: usize::try_from(config.max_entries).unwrap_or(usize::MAX),
        max_bytes: usize::try_from(config.max_bytes).unwrap_or(usize::MAX),
        retention_ms: config.retention_secs.saturating_mul(1000),
    }
}

/// The worker's cancels: the set, and the decode jobs sent lately.
#[derive(Debug)]
pub struct Cancellations {
    set: Mutex<CancelSet>,
    /// How many cancels the set holds, read without the lock: a decision
    /// asks for every handoff, and nearly always none is held.
    held: AtomicUsize,
    recent: RecentJobs,
}

impl Cancellations {
    pub fn new(limits: Limits) -> Cancellations {
        Cancellations {
            set: Mutex::new(CancelSet::new(limits)),
            held: AtomicUsize::new(0),
            recent: RecentJobs::new(),
        }
    }

    /// Takes one cancel message as it arrived, at `now_ms`.
    pub fn take(&self, payload: &[u8], encoding: Encoding, now_ms: u64) -> Taken {
        match message::parse(payload, encoding) {
            Ok(cancel) => self.record(&cancel, now_ms),
            Err(why) => Taken::Malformed(why),
        }
    }

    /// Holds `cancel` from `at_ms` on (a cancel kept by the server: when it
    /// was first published), unless its decode job already left.
    pub fn record(&self, cancel: &Cancel, at_ms: u64) -> Taken {
        if self.recent.was_sent(&cancel.request_id) {
            return Taken::Late;
        }
        let mut set = self.lock();
        let done = set.record(&cancel.request_id, cancel.reason.as_deref(), at_ms);
        self.held.store(set.len(), Ordering::Relaxed);
        if done.new {
            Taken::Recorded {
                evicted: done.evicted,
                expired: done.expired,
            }
        } else {
            Taken::Again {
                expired: done.expired,
            }
        }
    }

    /// Remembers that `request_id`'s decode job left, so that a cancel
    /// coming after it is counted as late.
    pub fn job_sent(&self, request_id: &str) {
        self.recent.sent(request_id);
    }

    /// Cancels held now.
    pub fn len(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CancelSet> {
        // A panic while holding the lock leaves a set that is still
        // consistent (every change is a few field writes): keep using it.
        self.set
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl decision::Cancels for Cancellations {
    fn lookup(&self, request_id: &str, now_ms: u64) -> Option<Cancelled> {
        if self.is_empty() {
            return None;
        }
        let set = self.lock();
        let reason = set.lookup(request_id, now_ms)?;
        Some(Cancelled {
            reason: reason.map(str::to_string),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Cancels as _;

    fn cancellations() -> Cancellations {
        Cancellations::new(limits(&CancelConfig::default()))
    }

    #[test]
    fn a_cancel_taken_is_seen_by_the_decision_until_it_expires() {
        let c = cancellations();
        assert_eq!(c.lookup("r1", 0), None);
        let body = message::encode(
            &Cancel {
                request_id: "r1".into(),
                reason: Some("gone".into()),
            },
            Encoding::Json,
        );
        assert_eq!(
            c.take(&body, Encoding::Json, 1_000),
            Taken::Recorded {
                evicted: 0,
                expired: 0
            }
        );
        assert_eq!(c.len(), 1);
        assert_eq!(
            c.lookup("r1", 2_000),
            Some(Cancelled {
                reason: Some("gone".into())
            })
        );
        assert_eq!(c.lookup("r2", 2_000), None);
        assert_eq!(
            c.take(&body, Encoding::Json, 1_500),
            Taken::Again { expired: 0 }
        );
        // The default retention is ten minutes.
        assert!(c.lookup("r1", 1_000 + 599_999).is_some());
        assert_eq!(c.lookup("r1", 1_000 + 600_000), None);
    }

    #[test]
    fn a_cancel_after_the_job_left_is_late_and_a_malformed_one_is_refused() {
        let c = cancellations();
        c.job_sent("r1");
        let cancel = Cancel {
            request_id: "r1".into(),
            reason: None,
        };
        assert_eq!(c.record(&cancel, 0), Taken::Late);
        assert!(c.is_empty());
        assert!(matches!(
            c.take(b"\xc1", Encoding::MsgPack, 0),
            Taken::Malformed(CancelError::Undecodable { .. })
        ));
        assert!(matches!(
            c.take(b"{}", Encoding::Json, 0),
            Taken::Malformed(CancelError::RequestId(_))
        ));
    }

    #[test]
    fn the_default_bounds_keep_a_full_set_near_its_byte_bound() {
        let limits = limits(&CancelConfig::default());
        assert_eq!(limits.max_bytes, 8 * 1024 * 1024);
        // A typical request ID (chatcmpl- and a UUID): the byte bound, not
        // the entry bound, decides first.
        let typical = charge("chatcmpl-0b8f3c1e-6a51-4a7b-9a55-2c5e8c9f0d21", None);
        assert!(limits.max_bytes / typical < limits.max_entries);
    }
}
