//! prefill-handoff patch: a bound in bytes on what the subscriptions hold.
//!
//! Upstream bounds a subscription's buffer by a count of messages only
//! (`subscription_capacity`), of up to the server's `max_payload` each, and
//! drops what does not fit. With a bound set
//! ([`crate::ConnectOptions::subscription_bytes`]), the connection task
//! stops reading the socket while the messages delivered to subscriptions
//! and not yet taken by the application hold that many bytes or more: what
//! the server sends meanwhile waits in the socket and in the server (up to
//! its `max_pending`, past which it cuts the connection off as a slow
//! consumer), not in this process.

use futures_util::task::AtomicWaker;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Context;

/// Bytes of messages in the subscriptions' buffers, shared by the
/// connection task (which adds each message it delivers) and the
/// subscribers (which take off each message they hand out or drop).
#[derive(Debug)]
pub(crate) struct Held {
    bytes: AtomicUsize,
    /// `usize::MAX` once lifted ([`Held::lift`]).
    limit: AtomicUsize,
    /// The connection task, while it waits for room.
    reader: AtomicWaker,
}

impl Held {
    pub(crate) fn new(limit: usize) -> Held {
        Held {
            bytes: AtomicUsize::new(0),
            limit: AtomicUsize::new(limit),
            reader: AtomicWaker::new(),
        }
    }

    /// A message of `n` bytes delivered to a subscription.
    pub(crate) fn add(&self, n: usize) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// A message of `n` bytes taken out of a subscription's buffer: wakes
    /// the connection task when this brings the bytes held under the bound.
    pub(crate) fn release(&self, n: usize) {
        let before = self.bytes.fetch_sub(n, Ordering::AcqRel);
        let limit = self.limit.load(Ordering::Relaxed);
        if before >= limit && before - n < limit {
            self.reader.wake();
        }
    }

    /// No bound from now on, and the connection task reads again at once:
    /// for a subscriber that must see everything the server has queued
    /// before it stops (a drain), whatever it holds meanwhile.
    pub(crate) fn lift(&self) {
        self.limit.store(usize::MAX, Ordering::Release);
        self.reader.wake();
    }

    /// Whether the connection task must stop reading: the bound is reached.
    /// When it is, the task is woken once the bytes held fall under it.
    pub(crate) fn full(&self, cx: &Context<'_>) -> bool {
        if self.bytes.load(Ordering::Acquire) < self.limit.load(Ordering::Acquire) {
            return false;
        }
        self.reader.register(cx.waker());
        // A release (or a lift) between the loads and the registration woke
        // nobody: look again now that the waker is in place.
        self.bytes.load(Ordering::Acquire) >= self.limit.load(Ordering::Acquire)
    }

    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn full_at_the_bound_and_woken_once_under_it() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(Arc::clone(&count));
        let cx = Context::from_waker(&waker);
        let held = Held::new(100);
        held.add(60);
        assert!(!held.full(&cx));
        held.add(40);
        assert!(held.full(&cx));
        held.add(30);
        // Still at or over the bound: nobody is woken.
        held.release(30);
        assert_eq!(count.0.load(Ordering::Relaxed), 0);
        assert!(held.full(&cx));
        held.release(1);
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        assert!(!held.full(&cx));
        held.release(99);
        assert_eq!(held.bytes(), 0);
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn lifted_it_is_never_full_and_wakes_the_reader() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(Arc::clone(&count));
        let cx = Context::from_waker(&waker);
        let held = Held::new(10);
        held.add(50);
        assert!(held.full(&cx));
        held.lift();
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        assert!(!held.full(&cx));
        held.add(1 << 40);
        assert!(!held.full(&cx));
    }
}
