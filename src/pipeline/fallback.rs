//! The dead letters that stand in for an output that cannot go out, so a
//! result still gets its one output.

use super::{Pipeline, headers};
use crate::decision::{self, DeadLetterCode, Decision, TraceHeaders};
use crate::transport::{Delivery, Outbox, PublishError, Target};
use bytes::Bytes;

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

    pub(super) async fn dead_letter(
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
}
