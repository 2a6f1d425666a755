//! What the configuration asks for: the two streams and the consumer, as
//! pure functions of the [`Config`]. Only fields nats-server 2.9 understands
//! are used (async-nats is built without its `server_2_10` features): one
//! consumer, no `filter_subjects`.
//!
//! The names, ranges and storage words are the configuration's checks; what
//! is refused here is what only the JetStream objects make impossible (the
//! duplicate window the redelivery settings need). [`Wanted::from_config`]
//! runs at load, so `run` and `setup` refuse it before any network contact.

use crate::config::Config;
use crate::redelivery::Redelivery;
use async_nats::jetstream::{
    consumer::{AckPolicy, DeliverPolicy, pull},
    stream::{self, DiscardPolicy, RetentionPolicy, StorageType},
};
use std::time::Duration;

/// The three JetStream objects `setup` manages.
#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    pub prefill: stream::Config,
    pub gen_jobs: stream::Config,
    pub consumer: pull::Config,
}

/// The JetStream objects the configuration asks for cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WantedError {
    #[error(
        "jetstream.max_deliver: -1 (unlimited) lets a decode job be redelivered after any time, longer than the GEN stream's duplicate window, which would then store it twice; set a delivery limit (20 covers 18 minutes at ack_wait_secs = 30), or set jetstream.gen_is_stream = false"
    )]
    UnlimitedRedelivery,
    #[error(
        "jetstream.duplicate_window_secs: the GEN stream needs a window of {window_secs} s (the longer of duplicate_window_secs, {configured_secs}, and the redelivery span, {span_secs} s: ack_wait_secs × max_deliver plus the nak delays), longer than jetstream.max_age_secs ({max_age_secs}); the server refuses a duplicate window longer than the stream's max age. Raise max_age_secs, or lower ack_wait_secs or max_deliver"
    )]
    WindowBeyondMaxAge {
        window_secs: u64,
        configured_secs: u64,
        span_secs: u64,
        max_age_secs: u64,
    },
}

impl Wanted {
    /// What a resolved configuration asks for. Fails on settings the
    /// server would refuse or that would store a decode job twice.
    pub fn from_config(config: &Config) -> Result<Wanted, WantedError> {
        Ok(Wanted {
            prefill: prefill_stream(config),
            gen_jobs: gen_stream(config)?,
            consumer: consumer(config),
        })
    }
}

/// `jetstream.storage`, one of the two words the key table allows.
fn storage(config: &Config) -> StorageType {
    match config.jetstream.storage.as_str() {
        "memory" => StorageType::Memory,
        _ => StorageType::File,
    }
}

/// The work queue over the prefill subjects. Discard policy `new`: when the
/// limits are reached, publishers get an error instead of the stream silently
/// dropping results no worker has processed yet.
pub fn prefill_stream(config: &Config) -> stream::Config {
    let js = &config.jetstream;
    stream::Config {
        name: js.prefill_stream.clone(),
        subjects: config.prefill_subjects(),
        retention: RetentionPolicy::WorkQueue,
        discard: DiscardPolicy::New,
        storage: storage(config),
        max_age: Duration::from_secs(js.max_age_secs),
        max_bytes: js.max_bytes,
        max_messages: -1,
        max_messages_per_subject: -1,
        max_consumers: -1,
        num_replicas: js.replicas,
        ..Default::default()
    }
}

/// The GEN stream: decode jobs, deduplicated by `Nats-Msg-Id` within the
/// duplicate window. Retention `limits` (decode fleets bring their own
/// consumers); discard `old` once the limits are reached.
pub fn gen_stream(config: &Config) -> Result<stream::Config, WantedError> {
    let js = &config.jetstream;
    let window = duplicate_window(config)?;
    Ok(stream::Config {
        name: js.gen_stream.clone(),
        subjects: vec![config.subjects.gen_jobs.clone()],
        retention: RetentionPolicy::Limits,
        discard: DiscardPolicy::Old,
        storage: storage(config),
        max_age: Duration::from_secs(js.max_age_secs),
        max_bytes: js.max_bytes,
        max_messages: -1,
        max_messages_per_subject: -1,
        max_consumers: -1,
        duplicate_window: window,
        num_replicas: js.replicas,
        ..Default::default()
    })
}

/// The GEN stream's duplicate window: `jetstream.duplicate_window_secs`, or
/// the redelivery span when that is longer (whole seconds, rounded up).
///
/// Why: a decode job whose publish was stored but whose ack was lost is
/// published again on redelivery, with a newly minted `disagg_request_id`;
/// only `Nats-Msg-Id` stops the second copy, and only within this window. So
/// the window covers every redelivery the consumer's settings allow
/// ([`Redelivery::span`]), and an unbounded `max_deliver` is refused while
/// decode jobs go into the stream.
pub fn duplicate_window(config: &Config) -> Result<Duration, WantedError> {
    let js = &config.jetstream;
    let redelivery = Redelivery {
        nak_delay: Duration::from_millis(js.nak_delay_ms),
        max_deliver: js.max_deliver,
    };
    let Some(span) = redelivery.span(Duration::from_secs(js.ack_wait_secs)) else {
        if !js.gen_is_stream {
            // Decode jobs do not go into the stream: nothing to deduplicate.
            return Ok(Duration::from_secs(js.duplicate_window_secs));
        }
        return Err(WantedError::UnlimitedRedelivery);
    };
    let span_secs = span.as_secs() + u64::from(span.subsec_nanos() > 0);
    let window_secs = js.duplicate_window_secs.max(span_secs);
    if js.max_age_secs != 0 && window_secs > js.max_age_secs {
        return Err(WantedError::WindowBeyondMaxAge {
            window_secs,
            configured_secs: js.duplicate_window_secs,
            span_secs,
            max_age_secs: js.max_age_secs,
        });
    }
    Ok(Duration::from_secs(window_secs))
}

/// The durable pull consumer all workers share: explicit ack, deliver all,
/// `ack_wait`, `max_deliver` and `max_ack_pending` from the configuration. No filter subject:
/// it is the only consumer the work queue allows over its subjects.
pub fn consumer(config: &Config) -> pull::Config {
    let js = &config.jetstream;
    pull::Config {
        durable_name: Some(js.consumer.clone()),
        description: Some("prefill-handoff workers".into()),
        deliver_policy: DeliverPolicy::All,
        ack_policy: AckPolicy::Explicit,
        ack_wait: Duration::from_secs(js.ack_wait_secs),
        max_deliver: js.max_deliver,
        max_ack_pending: js.max_ack_pending,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Config {
        Config::default().resolve().expect("default config")
    }

    #[test]
    fn wanted_objects_follow_the_configuration() {
        let mut config = base();
        config.jetstream.max_bytes = 1 << 30;
        config.jetstream.max_age_secs = 1200;
        let w = Wanted::from_config(&config).expect("valid");
        assert_eq!(w.prefill.name, "LLM_PREFILL");
        assert_eq!(w.prefill.retention, RetentionPolicy::WorkQueue);
        assert_eq!(w.prefill.discard, DiscardPolicy::New);
        assert_eq!(w.prefill.max_bytes, 1 << 30);
        assert_eq!(w.gen_jobs.name, "LLM_GEN");
        assert_eq!(w.gen_jobs.subjects, vec!["llm.gen.jobs".to_string()]);
        // The redelivery span of the defaults (1079 s) is longer than 120 s.
        assert_eq!(w.gen_jobs.duplicate_window, Duration::from_secs(1079));
        assert_eq!(w.gen_jobs.max_age, Duration::from_secs(1200));
        assert_eq!(w.consumer.durable_name.as_deref(), Some("handoff"));
        assert_eq!(w.consumer.ack_wait, Duration::from_secs(30));
        assert_eq!(w.consumer.max_deliver, 20);
        assert!(w.consumer.filter_subject.is_empty());
    }

    #[test]
    fn the_duplicate_window_covers_the_redelivery_span() {
        let mut config = base();
        config.jetstream.ack_wait_secs = 2;
        config.jetstream.max_deliver = 3;
        config.jetstream.nak_delay_ms = 300;
        // 3 × 2 s + 0.3 s + 0.6 s = 6.9 s, rounded up.
        config.jetstream.duplicate_window_secs = 1;
        assert_eq!(duplicate_window(&config).ok(), Some(Duration::from_secs(7)));
        config.jetstream.duplicate_window_secs = 120;
        assert_eq!(
            duplicate_window(&config).ok(),
            Some(Duration::from_secs(120))
        );
    }

    /// What only the JetStream objects make impossible; every other value
    /// is the configuration's to refuse (tests/offline/config).
    #[test]
    fn bad_values_name_their_key() {
        type Edit = fn(&mut Config);
        let rows: &[(Edit, &str)] = &[
            (
                |c| c.jetstream.max_age_secs = 60,
                "jetstream.duplicate_window_secs",
            ),
            // Long enough for the configured window, not for the span.
            (
                |c| c.jetstream.max_age_secs = 600,
                "jetstream.duplicate_window_secs",
            ),
            (|c| c.jetstream.max_deliver = -1, "jetstream.max_deliver"),
        ];
        for (edit, key) in rows {
            let mut config = base();
            edit(&mut config);
            let err = Wanted::from_config(&config).expect_err(key).to_string();
            assert!(err.starts_with(key), "{key}: {err}");
        }
        // Unlimited redelivery is fine while decode jobs stay out of the stream.
        let mut config = base();
        config.jetstream.max_deliver = -1;
        config.jetstream.gen_is_stream = false;
        assert!(Wanted::from_config(&config).is_ok());
    }
}
