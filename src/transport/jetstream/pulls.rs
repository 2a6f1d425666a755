//! The pulls under way on the worker's one inbox, and the processing slots
//! and bytes held for what they may still bring.
//!
//! Every pull is sent with slots and bytes taken from the worker's limits
//! beforehand: as many slots as messages asked, and its `max_bytes`. Those
//! go into two pools shared by all pulls under way, because a delivered
//! message does not say which pull it answers (it arrives with its stream
//! subject; only the server's status messages come on the pull's own reply
//! subject). Each message takes one slot and its size from the pools; a
//! pull's end (408 or 409, whose `Nats-Pending-Messages` and
//! `Nats-Pending-Bytes` headers say what it did not bring) gives its rest
//! back. When every message asked has come or been declared not coming,
//! nothing more can arrive, and whatever the pools still hold is given back:
//! the bytes of pulls that ended on their count without a status (nats-server
//! 2.9 sends none) do not stay held.
//!
//! So at any time, messages being processed plus messages the server may
//! still send are at most `max_in_flight` and their bytes at most
//! `max_in_flight_bytes`.

use crate::transport::Held;
use async_nats::StatusCode;
use std::collections::HashMap;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Duration, Instant};

/// The status descriptions (409) the server ends a pull with when it has
/// served the pull in full: its max_bytes used up, or (nats-server 2.10 and
/// later, after a pull bounded in bytes) its batch complete. For the worker
/// they are the pull's normal end; any other 409 (consumer deleted, too many
/// pulls waiting, ...) reopens the consumer after a pause.
const PULL_SERVED: [&str; 2] = ["Message Size Exceeds MaxBytes", "Batch Completed"];
/// What a status on the inbox meant for the pulls.
#[derive(Debug, PartialEq, Eq)]
pub enum PullEnd {
    /// An idle heartbeat: nothing ended.
    Heartbeat,
    /// A pull expired or was served in full.
    Normal,
    /// A pull was refused: the consumer is reopened.
    Failed,
}

/// The server's status on the inbox, `None` for a message. A stream
/// message (its reply is an ack subject) is a message, whatever status line
/// its publisher wrote into its stored headers; only the server's own
/// messages to the inbox have a status.
pub fn server_status(message: &async_nats::Message) -> Option<StatusCode> {
    let from_stream = message
        .reply
        .as_deref()
        .is_some_and(|reply| reply.starts_with("$JS.ACK."));
    message.status.filter(|_| !from_stream)
}

/// One pull under way: what it asked for, and when to stop waiting for its
/// end if the server never says.
struct Ask {
    messages: usize,
    bytes: usize,
    give_up_at: Instant,
}

/// What one delivered message holds.
pub struct Taken {
    /// `None` when the server sent more than was asked: the runner takes a
    /// slot for it.
    pub slot: Option<OwnedSemaphorePermit>,
    pub held: Held,
}

#[derive(Default)]
pub struct Pulls {
    asks: HashMap<u64, Ask>,
    next_id: u64,
    /// Messages asked for and neither delivered nor declared not coming.
    pending: usize,
    slots: Option<OwnedSemaphorePermit>,
    bytes: Held,
}

impl Pulls {
    /// Records a pull sent with `slots` (one permit for all its messages)
    /// and `bytes` as its max_bytes; returns its id, the last token of its
    /// reply subject.
    pub fn sent(&mut self, slots: OwnedSemaphorePermit, bytes: Held, lasts: Duration) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let ask = Ask {
            messages: slots.num_permits(),
            bytes: bytes.bytes(),
            give_up_at: Instant::now() + lasts,
        };
        self.pending += ask.messages;
        match &mut self.slots {
            Some(pool) => pool.merge(slots),
            None => self.slots = Some(slots),
        }
        self.bytes.merge(bytes);
        self.asks.insert(id, ask);
        id
    }

    /// Whether any pull may still bring a message.
    pub fn under_way(&self) -> bool {
        self.pending > 0
    }

    /// Pulls under way.
    pub fn count(&self) -> usize {
        self.asks.len()
    }

    /// A message arrived: its slot and `size` bytes from the pools.
    pub fn delivered(&mut self, size: usize) -> Taken {
        let slot = self.slots.as_mut().and_then(|pool| {
            if pool.num_permits() > 1 {
                pool.split(1)
            } else {
                None
            }
        });
        let slot = slot.or_else(|| self.slots.take());
        let held = self.bytes.split(size);
        self.pending = self.pending.saturating_sub(1);
        self.settle();
        Taken { slot, held }
    }

    /// Pull `id` ended with `messages` and `bytes` not sent (what the
    /// server's headers say, or everything it asked when they are missing).
    /// An id not under way (ended already) changes nothing.
    pub fn ended(&mut self, id: u64, messages: Option<usize>, bytes: Option<usize>) {
        let Some(ask) = self.asks.remove(&id) else {
            return;
        };
        let messages = messages.unwrap_or(ask.messages).min(ask.messages);
        let bytes = bytes.unwrap_or(ask.bytes).min(ask.bytes);
        self.give_back(messages, bytes);
    }

    /// A status on a pull's reply subject (`{inbox}.{id}`): its end
    /// (expired, served, or refused), or an idle heartbeat.
    pub fn status(&mut self, status: StatusCode, message: &async_nats::Message) -> PullEnd {
        if status == StatusCode::IDLE_HEARTBEAT {
            return PullEnd::Heartbeat;
        }
        let header = |name: &str| -> Option<usize> {
            message
                .headers
                .as_ref()
                .and_then(|h| h.get(name))
                .and_then(|v| v.as_str().parse().ok())
        };
        let id = message
            .subject
            .rsplit('.')
            .next()
            .and_then(|t| t.parse().ok());
        if let Some(id) = id {
            let messages = header("Nats-Pending-Messages");
            let bytes = header("Nats-Pending-Bytes");
            self.ended(id, messages, bytes);
        }
        let description = message.description.as_deref().unwrap_or("");
        let served = status == StatusCode::REQUEST_TERMINATED
            && PULL_SERVED.iter().any(|s| description.contains(s));
        if status == StatusCode::TIMEOUT || status == StatusCode::NOT_FOUND || served {
            PullEnd::Normal
        } else {
            PullEnd::Failed
        }
    }

    /// Ends the pulls whose end the server should have sent by now (a lost
    /// status), as if none of their messages were coming.
    pub fn give_up_late(&mut self, now: Instant) {
        let late: Vec<u64> = self
            .asks
            .iter()
            .filter(|(_, ask)| ask.give_up_at <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            self.ended(id, None, None);
        }
    }

    /// Forgets every pull (the connection was re-established: the server
    /// may have lost them) and gives back everything held for them.
    pub fn clear(&mut self) {
        self.asks.clear();
        self.pending = 0;
        self.slots = None;
        self.bytes = Held::default();
    }

    fn give_back(&mut self, messages: usize, bytes: usize) {
        self.pending = self.pending.saturating_sub(messages);
        if let Some(pool) = &mut self.slots {
            if messages >= pool.num_permits() {
                self.slots = None;
            } else if messages > 0 {
                drop(pool.split(messages));
            }
        }
        drop(self.bytes.split(bytes));
        self.settle();
    }

    /// Nothing more can arrive: every pull is over, whatever it was.
    fn settle(&mut self) {
        if self.pending == 0 {
            self.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::budget::ByteBudget;
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    const LASTS: Duration = Duration::from_secs(3);

    fn limits() -> (Arc<Semaphore>, ByteBudget) {
        (Arc::new(Semaphore::new(10)), ByteBudget::new(1000))
    }

    fn send(
        pulls: &mut Pulls,
        slots: &Arc<Semaphore>,
        budget: &ByteBudget,
        n: u32,
        b: usize,
    ) -> u64 {
        let permit = Arc::clone(slots).try_acquire_many_owned(n).unwrap();
        pulls.sent(permit, budget.try_hold(b).unwrap(), LASTS)
    }

    #[tokio::test]
    async fn messages_take_their_slot_and_bytes_from_the_pulls() {
        let (slots, budget) = limits();
        let mut pulls = Pulls::default();
        send(&mut pulls, &slots, &budget, 3, 300);
        send(&mut pulls, &slots, &budget, 3, 300);
        assert_eq!((slots.available_permits(), budget.available()), (4, 400));
        let a = pulls.delivered(100);
        let b = pulls.delivered(50);
        assert!(a.slot.is_some() && b.slot.is_some());
        assert_eq!((a.held.bytes(), b.held.bytes()), (100, 50));
        drop(a);
        assert_eq!((slots.available_permits(), budget.available()), (5, 500));
        assert!(pulls.under_way());
        drop(b);
        // Still held for the four messages the pulls may bring.
        assert_eq!((slots.available_permits(), budget.available()), (6, 550));
    }

    #[tokio::test]
    async fn an_ended_pull_gives_back_what_it_did_not_bring() {
        let (slots, budget) = limits();
        let mut pulls = Pulls::default();
        let first = send(&mut pulls, &slots, &budget, 4, 400);
        send(&mut pulls, &slots, &budget, 4, 400);
        let taken = pulls.delivered(100);
        pulls.ended(first, Some(3), Some(300));
        assert_eq!((slots.available_permits(), budget.available()), (5, 500));
        pulls.ended(first, Some(3), Some(300));
        assert_eq!(
            budget.available(),
            500,
            "a second end of the same pull changes nothing"
        );
        assert_eq!(pulls.count(), 1);
        drop(taken);
        assert_eq!((slots.available_permits(), budget.available()), (6, 600));
    }

    #[tokio::test]
    async fn everything_is_given_back_once_no_message_can_come() {
        let (slots, budget) = limits();
        let mut pulls = Pulls::default();
        // Two pulls served on their count, without a status: the bytes
        // they did not use are given back with the last message.
        send(&mut pulls, &slots, &budget, 1, 400);
        send(&mut pulls, &slots, &budget, 1, 400);
        let a = pulls.delivered(10);
        assert!(pulls.under_way());
        let b = pulls.delivered(10);
        assert!(!pulls.under_way());
        assert_eq!(pulls.count(), 0);
        assert_eq!((slots.available_permits(), budget.available()), (8, 980));
        drop((a, b));
        assert_eq!((slots.available_permits(), budget.available()), (10, 1000));
    }

    #[tokio::test]
    async fn a_message_beyond_the_asks_gets_no_slot() {
        let (slots, budget) = limits();
        let mut pulls = Pulls::default();
        send(&mut pulls, &slots, &budget, 1, 100);
        let asked = pulls.delivered(10);
        let extra = pulls.delivered(10);
        assert!(asked.slot.is_some());
        assert!(extra.slot.is_none(), "the runner takes a slot for it");
        assert_eq!(extra.held.bytes(), 0);
    }

    #[tokio::test]
    async fn late_and_cleared_pulls_give_everything_back() {
        let (slots, budget) = limits();
        let mut pulls = Pulls::default();
        send(&mut pulls, &slots, &budget, 2, 200);
        pulls.give_up_late(Instant::now());
        assert_eq!(pulls.count(), 1, "not late yet");
        pulls.give_up_late(Instant::now() + LASTS);
        assert_eq!(
            (pulls.count(), slots.available_permits(), budget.available()),
            (0, 10, 1000)
        );
        send(&mut pulls, &slots, &budget, 2, 200);
        pulls.clear();
        assert_eq!((slots.available_permits(), budget.available()), (10, 1000));
        assert!(!pulls.under_way());
    }
}
