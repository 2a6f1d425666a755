//! Removes acked messages a work queue failed to remove.
//!
//! Every message at or below the consumer's ack floor is acked (or
//! terminated) by definition, and in a work queue an acked message is
//! deleted. nats-server before 2.10 can keep some of them after it is killed
//! and restarted (the stream's deletes were not on disk, the consumer's acks
//! were): they are never delivered again, but they count against the stream's
//! limits, and with discard policy `new` a full stream refuses new results.
//! Our consumer has no filter, so it is the only consumer the work queue
//! allows: its ack floor speaks for every message.
//!
//! The same restart can leave the ack floor's *stream* sequence stale while
//! its *consumer* sequence has caught up with the last delivery (seen on
//! 2.9.10: ack floor consumer 9965 / stream 1672, delivered consumer 9965 /
//! stream 10000, nothing pending). The consumer sequences are the server's
//! own count of what it handed out and what came back: when they are equal,
//! every message up to the last delivered stream sequence is settled.

use async_nats::jetstream;
use tracing::warn;

/// Why the sweep could not look or purge; it is tried again later.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("reading stream {stream}: {source}")]
    Stream {
        stream: String,
        source: jetstream::context::GetStreamError,
    },
    #[error("reading consumer {stream}/{consumer}: {source}")]
    Consumer {
        stream: String,
        consumer: String,
        source: jetstream::context::ConsumerInfoError,
    },
    #[error("purging acked messages from {stream}: {source}")]
    Purge {
        stream: String,
        source: jetstream::stream::PurgeError,
    },
}

/// Purges the messages at or below the consumer's ack floor, if any are
/// still stored. Returns how many were removed.
pub async fn orphans(
    js: &jetstream::Context,
    stream_name: &str,
    consumer_name: &str,
) -> Result<u64, SweepError> {
    let stream = js
        .get_stream(stream_name)
        .await
        .map_err(|source| SweepError::Stream {
            stream: stream_name.to_string(),
            source,
        })?;
    let first = stream.cached_info().state.first_sequence;
    let stored = stream.cached_info().state.messages;
    let consumer = stream
        .consumer_info(consumer_name)
        .await
        .map_err(|source| SweepError::Consumer {
            stream: stream_name.to_string(),
            consumer: consumer_name.to_string(),
            source,
        })?;
    let floor = settled_floor(
        (
            consumer.ack_floor.consumer_sequence,
            consumer.ack_floor.stream_sequence,
        ),
        (
            consumer.delivered.consumer_sequence,
            consumer.delivered.stream_sequence,
        ),
    );
    if stored == 0 || first == 0 || first > floor {
        return Ok(0);
    }
    // Purge removes every message below the given sequence.
    let purged = stream
        .purge()
        .sequence(floor + 1)
        .await
        .map_err(|source| SweepError::Purge {
            stream: stream_name.to_string(),
            source,
        })?
        .purged;
    if purged > 0 {
        warn!(
            stream = stream_name,
            purged,
            ack_floor = floor,
            "removed acked messages the work queue had kept (a nats-server before 2.10 restarted uncleanly?)"
        );
    }
    Ok(purged)
}

/// The highest stream sequence at or below which every message is settled,
/// from the consumer's `(consumer, stream)` ack floor and last delivery.
fn settled_floor(ack_floor: (u64, u64), delivered: (u64, u64)) -> u64 {
    if ack_floor.0 >= delivered.0 {
        ack_floor.1.max(delivered.1)
    } else {
        ack_floor.1
    }
}

#[cfg(test)]
mod tests {
    use super::settled_floor;

    #[test]
    fn the_ack_floor_is_the_floor_while_deliveries_are_outstanding() {
        assert_eq!(settled_floor((90, 100), (95, 120)), 100);
    }

    #[test]
    fn a_stale_stream_floor_is_lifted_when_every_delivery_came_back() {
        // The state a restarted nats-server 2.9.10 reported in CI.
        assert_eq!(settled_floor((9965, 1672), (9965, 10000)), 10000);
    }

    #[test]
    fn nothing_delivered_means_nothing_settled() {
        assert_eq!(settled_floor((0, 0), (0, 0)), 0);
    }
}
