//! Counts of what the worker did, kept beside the Prometheus metrics so the
//! shutdown report (and tests) can compare results taken with outputs made.

use super::Handled;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Stats {
    received: AtomicU64,
    published: AtomicU64,
    failed: AtomicU64,
    deferred: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Results taken from the transport.
    pub received: u64,
    /// Results whose output is published.
    pub published: u64,
    /// Results whose output could not be published.
    pub failed: u64,
    /// Results left for redelivery (durable mode, no slot).
    pub deferred: u64,
}

impl Stats {
    /// `count` results taken from the transport at once.
    pub(super) fn received(&self, count: usize) {
        self.received.fetch_add(count as u64, Ordering::Relaxed);
    }

    /// Counts a result whose output's fate is known. A queued one is not
    /// counted here: it is counted once its outbox is sent
    /// ([`super::Queued::count`]).
    pub(super) fn handled(&self, handled: &Handled) {
        let counter = match handled {
            Handled::Published(_) => &self.published,
            Handled::Failed(_) => &self.failed,
            Handled::Deferred(_) => &self.deferred,
            Handled::Queued(_) => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn counts(&self) -> Counts {
        Counts {
            received: self.received.load(Ordering::Relaxed),
            published: self.published.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            deferred: self.deferred.load(Ordering::Relaxed),
        }
    }
}
