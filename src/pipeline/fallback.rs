//! The dead letters that stand in for an output that cannot go out, so a
//! result still gets its one output.

use super::{Handled, Pipeline, headers};
use crate::decision::{self, DeadLetterCode, Decision, Outcome, TraceHeaders};
use crate::metrics::RateLimitedLog;
use crate::transport::{Delivery, Outbox, PublishError, Target};
use bytes::Bytes;
use std::time::Instant;

impl Pipeline {
    /// The output can never be published (too large for the server, or a
    /// subject the client refuses): the input goes to the dead-letter
    /// subject instead, as it came.
    pub(super) async fn dead_letter_instead(
        &self,
        delivery: &Delivery,
        trace: &TraceHeaders,
        decision: &Decision,
        code: DeadLetterCode,
        error: &PublishError,
        mut outbox: Option<&mut Outbox>,
    ) -> Result<(), PublishError> {
        tracing::warn!(
            kind = decision.outcome.kind(),
            request_id = decision.request_id.as_deref(),
            source = %delivery.subject,
            %error,
            "the output cannot be published; dead-lettering the input instead"
        );
        let why = format!(
            "the {} output for this result could not be published: {error}",
            decision.outcome.kind()
        );
        let set = decision::dead_letter_headers(code, &why, &delivery.subject);
        let whole = self.dead_letter(&set, trace, delivery.payload.clone(), outbox.as_deref_mut());
        match delivery.while_pending(whole).await {
            Err(PublishError::TooLarge(why)) => {
                // The input fits the server, but not with the dead letter's
                // headers added: the dead letter goes without its bytes,
                // saying how many there were, rather than no output at all.
                tracing::warn!(
                    bytes = delivery.payload.len(),
                    source = %delivery.subject,
                    error = why,
                    "the dead letter with the input's bytes does not fit either; dead-lettering without them"
                );
                let set = decision::without_payload(&set, delivery.payload.len());
                let bare = self.dead_letter(&set, trace, Bytes::new(), outbox);
                delivery.while_pending(bare).await?;
            }
            other => other?,
        }
        Ok(())
    }

    async fn dead_letter(
        &self,
        set: &decision::Headers,
        trace: &TraceHeaders,
        payload: Bytes,
        outbox: Option<&mut Outbox>,
    ) -> Result<(), PublishError> {
        let headers = headers::output_headers(set, trace);
        self.sink
            .publish(
                &self.rules.dead_letter_subject,
                headers,
                payload,
                Target::Subject,
                outbox,
            )
            .await
    }

    /// Answers a result the byte budget had no room for, without deciding
    /// it: a dead letter `over_budget` without the input's bytes (which are
    /// what is over budget), saying how many there were. Counted in
    /// `handoff_dead_letters_total{code="over_budget"}` and logged at most
    /// once per 10 s with the count.
    pub async fn refuse_over_budget(
        &self,
        delivery: Box<Delivery>,
        bytes: usize,
        held: usize,
        max_in_flight_bytes: usize,
        log: &RateLimitedLog,
    ) -> Handled {
        let why = format!(
            "the worker held {held} bytes of results (max_in_flight_bytes {max_in_flight_bytes}) and had no room for this one's {bytes} bytes; it was not decided"
        );
        let code = DeadLetterCode::OverBudget;
        let set = decision::dead_letter_headers(code, &why, &delivery.subject);
        let set = decision::without_payload(&set, bytes);
        let trace = headers::trace_headers(delivery.headers.as_ref());
        self.metrics.trace_headers_dropped(&trace.dropped);
        let outcome = Outcome::DeadLetter { code };
        let published = self.dead_letter(&set, &trace, Bytes::new(), None);
        let handled = match delivery.while_pending(published).await {
            Ok(()) => {
                self.metrics
                    .record(&outcome, 0, delivery.received_at.elapsed());
                delivery.settle(crate::transport::Settle::Term).await;
                Handled::Published(outcome)
            }
            Err(e) => {
                self.metrics.publish_failed();
                tracing::error!(source = %delivery.subject, error = %e, "could not publish an over_budget dead letter; this result has no output");
                Handled::Failed(outcome)
            }
        };
        if let Some(refused) = log.due(Instant::now()) {
            tracing::warn!(
                refused,
                held,
                max_in_flight_bytes,
                "results refused: the worker's byte budget is spent; each got an over_budget dead letter without its bytes. Add workers, raise max_in_flight_bytes (and the memory limit), or use jetstream mode"
            );
        }
        handled
    }
}
