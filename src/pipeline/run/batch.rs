//! The task a batch runs in. In JetStream mode the batch's results run
//! concurrently ([`handle`] each); in core mode one after the other, their
//! outputs into one outbox sent at the batch's end ([`run_core_batch`]).

use super::super::{Handled, Pipeline, Stats};
use crate::transport::{Admitted, Held, Outbox};
use std::sync::Arc;
use tokio::sync::OwnedSemaphorePermit;

/// Runs a core-mode batch: each delivery through the pipeline, one after
/// the other, their outputs into one outbox; then sends the outbox and
/// counts each result by whether its output went out.
pub(super) async fn run_core_batch(
    pipeline: Arc<Pipeline>,
    stats: Arc<Stats>,
    batch: Vec<Admitted>,
) {
    let mut outbox = Outbox::with_capacity(batch.len());
    let mut results = Vec::with_capacity(batch.len());
    let mut slots: Option<OwnedSemaphorePermit> = None;
    let mut bytes = Held::default();
    for admitted in batch {
        let Admitted {
            delivery,
            held,
            slot,
        } = admitted;
        bytes.merge(held);
        match (&mut slots, slot) {
            (Some(all), Some(slot)) => all.merge(slot),
            (all, slot) => *all = all.take().or(slot),
        }
        results.push(pipeline.handle(delivery, Some(&mut outbox)).await);
    }
    let queued = outbox.len();
    let out = pipeline.sink.send(outbox).await;
    if out < queued {
        tracing::error!(
            lost = queued - out,
            "the NATS client has closed: a batch's outputs could not be queued; these results have none"
        );
    }
    for handled in count_sent(results, out, &pipeline.metrics) {
        stats.handled(&handled);
    }
    // Released once the outputs are out.
    drop((bytes, slots));
}

/// A batch's results as counted once its outbox is sent: the queued ones,
/// in order, published for the first `out` (which went out) and failed for
/// the rest (lost with the client); each queued result put exactly one
/// output in the outbox, in the same order.
fn count_sent(
    results: Vec<Handled>,
    out: usize,
    metrics: &crate::metrics::Metrics,
) -> impl Iterator<Item = Handled> {
    let mut nth = 0;
    results.into_iter().map(move |handled| match handled {
        Handled::Queued(queued) => {
            nth += 1;
            queued.count(metrics, nth <= out)
        }
        other => other,
    })
}

/// Runs one delivery through the pipeline; its bytes and its slot count
/// until it is settled.
pub(super) async fn handle(pipeline: &Pipeline, stats: &Stats, admitted: Admitted) {
    let Admitted {
        delivery,
        held,
        slot,
    } = admitted;
    stats.handled(&pipeline.handle(delivery, None).await);
    drop((held, slot));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{DeadLetterCode, Outcome};
    use crate::metrics::Metrics;

    fn queued(code: DeadLetterCode) -> Handled {
        Handled::Queued(super::super::super::Queued {
            outcome: Outcome::DeadLetter { code },
            trailing_frames: 0,
            received_at: std::time::Instant::now(),
        })
    }

    fn batch() -> Vec<Handled> {
        let failed = Outcome::DeadLetter {
            code: DeadLetterCode::TooLarge,
        };
        vec![
            queued(DeadLetterCode::Malformed),
            Handled::Failed(failed),
            queued(DeadLetterCode::MissingReplyTo),
            queued(DeadLetterCode::OverBudget),
        ]
    }

    fn published(counted: &[Handled]) -> usize {
        let published = counted
            .iter()
            .filter(|h| matches!(h, Handled::Published(_)));
        published.count()
    }

    #[test]
    fn a_batch_whose_client_is_gone_counts_nothing_as_published() {
        let metrics = Metrics::new();
        let counted: Vec<Handled> = count_sent(batch(), 0, &metrics).collect();
        assert_eq!(published(&counted), 0, "{counted:?}");
        assert!(counted.iter().all(|h| matches!(h, Handled::Failed(_))));
        let text = metrics.encode();
        let value = |name: &str| {
            let line = text.lines().find(|l| l.starts_with(name));
            line.and_then(|l| l.rsplit(' ').next()).map(str::to_string)
        };
        let no_output = value("handoff_dead_letters_total{code=\"malformed\"}");
        assert_eq!(no_output.as_deref(), Some("0"), "{text}");
        let failures = value("handoff_publish_failures_total");
        assert_eq!(failures.as_deref(), Some("3"), "{text}");
    }

    #[test]
    fn the_first_outputs_out_are_counted_published_in_order() {
        let metrics = Metrics::new();
        let counted: Vec<Handled> = count_sent(batch(), 2, &metrics).collect();
        let kinds: Vec<&str> = counted
            .iter()
            .map(|h| match h {
                Handled::Published(_) => "published",
                Handled::Failed(_) => "failed",
                Handled::Deferred(_) => "deferred",
                Handled::Queued(_) => "queued",
            })
            .collect();
        assert_eq!(kinds, ["published", "failed", "published", "failed"]);
    }
}
