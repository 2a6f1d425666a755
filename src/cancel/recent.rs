//! The request IDs of the decode jobs this worker sent lately, to tell a late
//! cancel (its decode job already left) from one that is still of use.
//!
//! A fixed table of hashes, one per slot, written over as jobs come: no
//! allocation and no lock per job, a bounded memory (8 bytes a slot), and
//! only the most recent jobs remembered (a slot holds the last job whose
//! hash fell there). A cancel is late when its request's hash is found; a
//! 64-bit hash makes a false "late" for a request never sent practically
//! impossible.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots of the table: about the last this many jobs are remembered.
pub const SLOTS: usize = 1 << 16;

pub struct RecentJobs {
    hasher: foldhash::fast::RandomState,
    slots: Box<[AtomicU64]>,
}

impl Default for RecentJobs {
    fn default() -> Self {
        RecentJobs::new()
    }
}

impl RecentJobs {
    pub fn new() -> RecentJobs {
        RecentJobs {
            hasher: foldhash::fast::RandomState::default(),
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Remembers that a decode job for `request_id` left.
    pub fn sent(&self, request_id: &str) {
        let hash = self.hash(request_id);
        self.slot(hash).store(hash, Ordering::Relaxed);
    }

    /// Whether a decode job for `request_id` left lately.
    pub fn was_sent(&self, request_id: &str) -> bool {
        let hash = self.hash(request_id);
        self.slot(hash).load(Ordering::Relaxed) == hash
    }

    /// Never 0, the value of an empty slot.
    fn hash(&self, request_id: &str) -> u64 {
        self.hasher.hash_one(request_id).max(1)
    }

    fn slot(&self, hash: u64) -> &AtomicU64 {
        // The low bits pick the slot; all 64 are compared.
        &self.slots[(hash as usize) & (SLOTS - 1)]
    }
}

impl std::fmt::Debug for RecentJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecentJobs").field("slots", &SLOTS).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sent_job_is_remembered_and_others_are_not() {
        let recent = RecentJobs::new();
        assert!(!recent.was_sent("r1"));
        recent.sent("r1");
        assert!(recent.was_sent("r1"));
        assert!(!recent.was_sent("r2"));
        // The last few thousand are all remembered.
        for i in 0..2_000 {
            recent.sent(&format!("job-{i}"));
        }
        let remembered = (0..2_000)
            .filter(|i| recent.was_sent(&format!("job-{i}")))
            .count();
        assert!(remembered > 1_900, "{remembered} of 2,000");
        assert!(!recent.was_sent("job-2000"));
    }
}
