//! The worker's byte budget: how many bytes of prefill results it holds at
//! once, from the moment it takes one from NATS until its output is out
//! (`max_in_flight_bytes`). Counts alone do not bound memory: 256 results
//! in flight of up to 1 MiB each fill the whole memory limit of the shipped
//! DaemonSet and systemd unit.
//!
//! Both delivery modes hold their results' bytes here: core mode takes a
//! result only when its bytes fit and refuses it otherwise (see
//! `transport::core::intake`); JetStream mode sizes each pull to the bytes free
//! (`max_bytes`), so the server keeps what does not fit.

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes held; given back when dropped. The default holds none.
#[derive(Debug, Default)]
pub struct Held {
    permit: Option<OwnedSemaphorePermit>,
}

impl Held {
    /// How many bytes this holds.
    pub fn bytes(&self) -> usize {
        self.permit
            .as_ref()
            .map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// Takes over what `other` holds: both are given back together, in one
    /// release (a batch gives its results' bytes back at its end).
    pub fn merge(&mut self, other: Held) {
        match (&mut self.permit, other.permit) {
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (mine @ None, theirs) => *mine = theirs,
            (Some(_), None) => {}
        }
    }

    /// Moves `bytes` of this into a new [`Held`] (at most what this holds).
    pub fn split(&mut self, bytes: usize) -> Held {
        let bytes = bytes.min(self.bytes());
        if bytes == 0 {
            return Held { permit: None };
        }
        Held {
            permit: self.permit.as_mut().and_then(|p| p.split(bytes)),
        }
    }
}

/// A shared budget of bytes (clones share it).
#[derive(Clone, Debug)]
pub struct ByteBudget {
    bytes: Arc<Semaphore>,
    max: usize,
}

impl ByteBudget {
    /// A budget of `max` bytes (at least 1, at most `u32::MAX`).
    pub fn new(max: usize) -> ByteBudget {
        let max = max.clamp(1, u32::MAX as usize);
        ByteBudget {
            bytes: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Bytes free right now.
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }

    /// Holds `bytes` if they are free now; never waits.
    pub fn try_hold(&self, bytes: usize) -> Option<Held> {
        if bytes == 0 {
            return Some(Held { permit: None });
        }
        let n = u32::try_from(bytes).ok()?;
        let permit = Arc::clone(&self.bytes).try_acquire_many_owned(n).ok()?;
        Some(Held {
            permit: Some(permit),
        })
    }

    /// Waits until at least `least` bytes are free (`least` is capped at the
    /// budget), then holds every byte free at that moment.
    pub async fn hold_free(&self, least: usize) -> Held {
        let least = least.clamp(1, self.max);
        let n = u32::try_from(least).unwrap_or(u32::MAX);
        let Ok(mut permit) = Arc::clone(&self.bytes).acquire_many_owned(n).await else {
            // The semaphore is never closed.
            return Held { permit: None };
        };
        let more = u32::try_from(self.bytes.available_permits()).unwrap_or(u32::MAX);
        if more > 0
            && let Ok(extra) = Arc::clone(&self.bytes).try_acquire_many_owned(more)
        {
            permit.merge(extra);
        }
        Held {
            permit: Some(permit),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_held_until_dropped() {
        let budget = ByteBudget::new(100);
        let a = budget.try_hold(60).unwrap();
        assert!(budget.try_hold(41).is_none());
        let b = budget.try_hold(40).unwrap();
        assert_eq!(budget.available(), 0);
        drop(a);
        assert_eq!(budget.available(), 60);
        drop(b);
        assert_eq!(budget.available(), 100);
        assert!(budget.try_hold(101).is_none(), "more than the whole budget");
    }

    #[tokio::test]
    async fn free_bytes_are_held_and_split() {
        let budget = ByteBudget::new(100);
        let small = budget.try_hold(30).unwrap();
        let mut all = budget.hold_free(10).await;
        assert_eq!(all.bytes(), 70);
        let part = all.split(50);
        assert_eq!((part.bytes(), all.bytes()), (50, 20));
        let rest = all.split(99);
        assert_eq!((rest.bytes(), all.bytes()), (20, 0), "at most what is held");
        drop((small, part));
        assert_eq!(budget.available(), 80);
        drop(rest);
        assert_eq!(budget.available(), 100);
    }

    #[test]
    fn merged_holds_are_given_back_together() {
        let budget = ByteBudget::new(100);
        let mut all = Held::default();
        for bytes in [10, 0, 25] {
            all.merge(budget.try_hold(bytes).unwrap());
        }
        all.merge(Held::default());
        assert_eq!((all.bytes(), budget.available()), (35, 65));
        drop(all);
        assert_eq!(budget.available(), 100);
    }
}
