//! What goes out beside a result's one output: the KV release notice of a
//! refused handoff, and the `Nats-TTL` that expires a decode job at its
//! deadline or its KV's expiry in the GEN stream.

use super::Pipeline;
use crate::decision::{Decision, Outcome, Release, deadline};
use crate::headers::names::NATS_TTL;
use crate::headers::{self, TraceHeaders};
use crate::transport::Target;
use bytes::Bytes;

/// The `Nats-TTL` of a decode job whose deadline is `deadline` at `now_ms`:
/// the time left in whole seconds, rounded up (a stream's TTLs are whole
/// seconds, at least one): a job never leaves before its deadline, at most
/// a second after.
pub fn msg_ttl(deadline: u64, now_ms: u64) -> String {
    let left_ms = deadline.saturating_sub(now_ms);
    format!("{}s", left_ms.div_ceil(1000).max(1))
}

impl Pipeline {
    /// Adds `Nats-TTL` to a decode job with a deadline or a KV expiry when
    /// the GEN stream expires messages by it: the earlier of the two.
    pub(super) fn expire_at_deadline(&self, decision: &mut Decision, now_ms: u64) {
        let ttl_stream = self
            .gen_stream
            .as_ref()
            .is_some_and(|stream| stream.msg_ttl);
        let expires = deadline::earliest(decision.deadline_ms, decision.kv_expires_ms);
        if let (true, Outcome::Decode { .. }, Some(at)) = (ttl_stream, &decision.outcome, expires) {
            decision.headers.push(NATS_TTL, &msg_ttl(at, now_ms));
        }
    }

    /// Remembers that a decode job left, so that a cancel of its request
    /// coming now counts as late.
    pub(super) fn job_left(&self, decision: &Decision) {
        if let (Outcome::Decode { .. }, Some(id)) = (&decision.outcome, &decision.request_id) {
            self.cancellations.job_sent(id);
        }
    }

    /// Publishes a refused handoff's KV release notice, after its error
    /// response went out: a side output, counted, whose failure is logged
    /// and leaves the result's one output as it is (the engine's own
    /// transfer timeout still frees the KV then).
    pub(super) async fn publish_release(
        &self,
        release: Release,
        decision: &Decision,
        trace: &TraceHeaders,
    ) {
        let Release {
            subject,
            headers,
            payload,
        } = release;
        let outgoing = headers::outgoing(headers, trace);
        let sent = self
            .sink
            .publish(
                &subject,
                outgoing,
                Bytes::from(payload),
                Target::Subject,
                None,
            )
            .await;
        self.metrics.release_notice(sent.is_ok());
        if let Err(e) = sent {
            tracing::warn!(
                request_id = decision.request_id.as_deref(),
                subject = %subject,
                error = %e,
                "could not publish the KV release notice"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::msg_ttl;

    #[test]
    fn a_ttl_is_the_time_left_in_whole_seconds_rounded_up() {
        let now = 1_767_225_600_000;
        for (left_ms, want) in [
            (1, "1s"),
            (999, "1s"),
            (1000, "1s"),
            (1001, "2s"),
            (0, "1s"),
        ] {
            assert_eq!(msg_ttl(now + left_ms, now), want, "{left_ms} ms left");
        }
        assert_eq!(msg_ttl(now - 5, now), "1s");
        assert_eq!(msg_ttl(now + 3_600_000, now), "3600s");
    }
}
