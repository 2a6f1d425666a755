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

use async_nats::jetstream;
use tracing::warn;

/// Purges the messages at or below the consumer's ack floor, if any are
/// still stored. Returns how many were removed.
pub async fn orphans(
    js: &jetstream::Context,
    stream_name: &str,
    consumer_name: &str,
) -> Result<u64, String> {
    let stream = js
        .get_stream(stream_name)
        .await
        .map_err(|e| format!("reading stream {stream_name}: {e}"))?;
    let first = stream.cached_info().state.first_sequence;
    let stored = stream.cached_info().state.messages;
    let consumer = stream
        .consumer_info(consumer_name)
        .await
        .map_err(|e| format!("reading consumer {stream_name}/{consumer_name}: {e}"))?;
    let floor = consumer.ack_floor.stream_sequence;
    if stored == 0 || first == 0 || first > floor {
        return Ok(0);
    }
    // Purge removes every message below the given sequence.
    let purged = stream
        .purge()
        .sequence(floor + 1)
        .await
        .map_err(|e| format!("purging acked messages from {stream_name}: {e}"))?
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
