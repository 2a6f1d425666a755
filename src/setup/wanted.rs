//! What the configuration asks for: the two streams and the consumer, as
//! pure functions of the [`Config`]. Only fields nats-server 2.9 understands
//! are used (async-nats is built without its `server_2_10` features): one
//! consumer, no `filter_subjects`.

use crate::config::{Config, ConfigError};
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

impl Wanted {
    /// What the configuration asks for. Fails on values the server would refuse.
    pub fn from_config(config: &Config) -> Result<Wanted, ConfigError> {
        Ok(Wanted {
            prefill: prefill_stream(config)?,
            gen_jobs: gen_stream(config)?,
            consumer: consumer(config)?,
        })
    }
}

fn storage(config: &Config) -> Result<StorageType, ConfigError> {
    match config.jetstream.storage.as_str() {
        "file" => Ok(StorageType::File),
        "memory" => Ok(StorageType::Memory),
        other => Err(ConfigError(format!(
            "jetstream.storage: {other:?} is not a storage type; expected \"file\" or \"memory\""
        ))),
    }
}

fn check_name(key: &str, name: &str) -> Result<(), ConfigError> {
    let bad = name.is_empty()
        || name
            .chars()
            .any(|c| matches!(c, '.' | '*' | '>' | '/' | '\\') || c.is_whitespace());
    if bad {
        return Err(ConfigError(format!(
            "{key}: {name:?} is not a JetStream name; use letters, digits, '-' and '_' (no dots, wildcards or spaces)"
        )));
    }
    Ok(())
}

/// The work queue over the prefill subjects. Discard policy `new`: when the
/// limits are reached, publishers get an error instead of the stream silently
/// dropping results no worker has processed yet.
pub fn prefill_stream(config: &Config) -> Result<stream::Config, ConfigError> {
    let js = &config.jetstream;
    check_name("jetstream.prefill_stream", &js.prefill_stream)?;
    let subjects = config.prefill_subjects();
    if subjects.is_empty() {
        return Err(ConfigError(
            "subjects.prefill_results: no subject given; the prefill stream needs at least one"
                .into(),
        ));
    }
    Ok(stream::Config {
        name: js.prefill_stream.clone(),
        subjects,
        retention: RetentionPolicy::WorkQueue,
        discard: DiscardPolicy::New,
        storage: storage(config)?,
        max_age: Duration::from_secs(js.max_age_secs),
        max_bytes: js.max_bytes,
        max_messages: -1,
        max_messages_per_subject: -1,
        max_consumers: -1,
        num_replicas: js.replicas,
        ..Default::default()
    })
}

/// The GEN stream: decode jobs, deduplicated by `Nats-Msg-Id` within the
/// duplicate window. Retention `limits` (decode fleets bring their own
/// consumers); discard `old` once the limits are reached.
pub fn gen_stream(config: &Config) -> Result<stream::Config, ConfigError> {
    let js = &config.jetstream;
    check_name("jetstream.gen_stream", &js.gen_stream)?;
    let window = duplicate_window(config)?;
    Ok(stream::Config {
        name: js.gen_stream.clone(),
        subjects: vec![config.subjects.gen_jobs.clone()],
        retention: RetentionPolicy::Limits,
        discard: DiscardPolicy::Old,
        storage: storage(config)?,
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
pub fn duplicate_window(config: &Config) -> Result<Duration, ConfigError> {
    let js = &config.jetstream;
    if js.duplicate_window_secs == 0 {
        return Err(ConfigError(
            "jetstream.duplicate_window_secs: 0 disables duplicate detection; the GEN stream needs a window of at least 1 s so redelivered decode jobs are dropped".into(),
        ));
    }
    let redelivery = Redelivery {
        nak_delay: Duration::from_millis(js.nak_delay_ms),
        max_deliver: js.max_deliver,
    };
    let Some(span) = redelivery.span(Duration::from_secs(js.ack_wait_secs)) else {
        if !js.gen_is_stream {
            // Decode jobs do not go into the stream: nothing to deduplicate.
            return Ok(Duration::from_secs(js.duplicate_window_secs));
        }
        return Err(ConfigError(format!(
            "jetstream.max_deliver: {} (unlimited) lets a decode job be redelivered after any time, longer than the GEN stream's duplicate window, which would then store it twice; set a delivery limit (20 covers 18 minutes at ack_wait_secs = 30)",
            js.max_deliver
        )));
    };
    let span_secs = span.as_secs() + u64::from(span.subsec_nanos() > 0);
    let window_secs = js.duplicate_window_secs.max(span_secs);
    if js.max_age_secs != 0 && window_secs > js.max_age_secs {
        return Err(ConfigError(format!(
            "jetstream.duplicate_window_secs: the GEN stream needs a window of {window_secs} s (the longer of duplicate_window_secs, {}, and the redelivery span, {span_secs} s: ack_wait_secs × max_deliver plus the nak delays), longer than jetstream.max_age_secs ({}); the server refuses a duplicate window longer than the stream's max age. Raise max_age_secs, or lower ack_wait_secs or max_deliver",
            js.duplicate_window_secs, js.max_age_secs
        )));
    }
    Ok(Duration::from_secs(window_secs))
}

/// The durable pull consumer all workers share: explicit ack, deliver all,
/// `ack_wait`, `max_deliver` and `max_ack_pending` from the configuration. No filter subject:
/// it is the only consumer the work queue allows over its subjects.
pub fn consumer(config: &Config) -> Result<pull::Config, ConfigError> {
    let js = &config.jetstream;
    check_name("jetstream.consumer", &js.consumer)?;
    if js.ack_wait_secs == 0 {
        return Err(ConfigError(
            "jetstream.ack_wait_secs: must be at least 1; it is how long a worker may hold a message before it is redelivered".into(),
        ));
    }
    if js.max_deliver == 0 || js.max_deliver < -1 {
        return Err(ConfigError(format!(
            "jetstream.max_deliver: {} is not allowed; use -1 (unlimited) or a positive count",
            js.max_deliver
        )));
    }
    Ok(pull::Config {
        durable_name: Some(js.consumer.clone()),
        description: Some("prefill-handoff workers".into()),
        deliver_policy: DeliverPolicy::All,
        ack_policy: AckPolicy::Explicit,
        ack_wait: Duration::from_secs(js.ack_wait_secs),
        max_deliver: js.max_deliver,
        max_ack_pending: js.max_ack_pending,
        ..Default::default()
    })
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

    #[test]
    fn bad_values_name_their_key() {
        type Edit = fn(&mut Config);
        let rows: &[(Edit, &str)] = &[
            (|c| c.jetstream.storage = "disk".into(), "jetstream.storage"),
            (|c| c.jetstream.ack_wait_secs = 0, "jetstream.ack_wait_secs"),
            (|c| c.jetstream.max_deliver = 0, "jetstream.max_deliver"),
            (|c| c.jetstream.max_deliver = -5, "jetstream.max_deliver"),
            (
                |c| c.jetstream.duplicate_window_secs = 0,
                "jetstream.duplicate_window_secs",
            ),
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
            (
                |c| c.jetstream.consumer = "a.b".into(),
                "jetstream.consumer",
            ),
            (
                |c| c.jetstream.prefill_stream = "X*".into(),
                "jetstream.prefill_stream",
            ),
            (
                |c| c.jetstream.gen_stream = "G EN".into(),
                "jetstream.gen_stream",
            ),
        ];
        for (edit, key) in rows {
            let mut config = base();
            edit(&mut config);
            let err = Wanted::from_config(&config).expect_err(key);
            assert!(err.0.starts_with(key), "{key}: {}", err.0);
        }
    }
}
