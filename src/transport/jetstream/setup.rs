//! `setup`: the `{NS}_PREFILL` work-queue stream, the `{NS}_GEN` stream and the
//! shared durable pull consumer, created when missing and checked when present.
//!
//! What the configuration asks for is computed by pure functions
//! ([`prefill_stream`], [`gen_stream`], [`consumer`]) and compared with what
//! the server holds by pure functions ([`stream_mismatches`],
//! [`consumer_mismatches`]), so running `setup` twice provably changes nothing
//! the second time. Only the fields this worker sets are compared: the server
//! fills in defaults for the rest, and an operator may have tuned them.
//!
//! Only fields nats-server 2.9 understands are used (async-nats is built
//! without its `server_2_10` features): one consumer, no `filter_subjects`.

use super::JetStreamError;
use crate::config::{Config, ConfigError};
use async_nats::jetstream::{
    self,
    consumer::{AckPolicy, DeliverPolicy, FromConsumer, pull},
    stream::{self, DiscardPolicy, RetentionPolicy, StorageType},
};
use std::fmt;
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
        num_replicas: 1,
        ..Default::default()
    })
}

/// The GEN stream: decode jobs, deduplicated by `Nats-Msg-Id` within the
/// duplicate window. Retention `limits` (decode fleets bring their own
/// consumers); discard `old` once the limits are reached.
pub fn gen_stream(config: &Config) -> Result<stream::Config, ConfigError> {
    let js = &config.jetstream;
    check_name("jetstream.gen_stream", &js.gen_stream)?;
    if js.duplicate_window_secs == 0 {
        return Err(ConfigError(
            "jetstream.duplicate_window_secs: 0 disables duplicate detection; the GEN stream needs a window of at least 1 s so redelivered decode jobs are dropped".into(),
        ));
    }
    if js.max_age_secs != 0 && js.duplicate_window_secs > js.max_age_secs {
        return Err(ConfigError(format!(
            "jetstream.duplicate_window_secs ({}) is longer than jetstream.max_age_secs ({}); the server refuses a duplicate window longer than the stream's max age",
            js.duplicate_window_secs, js.max_age_secs
        )));
    }
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
        duplicate_window: Duration::from_secs(js.duplicate_window_secs),
        num_replicas: 1,
        ..Default::default()
    })
}

/// The durable pull consumer all workers share: explicit ack, deliver all,
/// `ack_wait` and `max_deliver` from the configuration. No filter subject:
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
        ..Default::default()
    })
}

/// One field whose value on the server is not what the configuration asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub field: &'static str,
    pub have: String,
    pub want: String,
    /// Whether the server can change it in place (an update keeps the messages).
    pub updatable: bool,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} → {}", self.field, self.have, self.want)
    }
}

fn mismatch<T: fmt::Debug + PartialEq>(
    out: &mut Vec<Mismatch>,
    field: &'static str,
    have: T,
    want: T,
    updatable: bool,
) {
    if have != want {
        out.push(Mismatch {
            field,
            have: format!("{have:?}"),
            want: format!("{want:?}"),
            updatable,
        });
    }
}

/// The differences that matter between a stream on the server and the one wanted.
pub fn stream_mismatches(have: &stream::Config, want: &stream::Config) -> Vec<Mismatch> {
    let mut out = Vec::new();
    let sorted = |s: &[String]| {
        let mut s = s.to_vec();
        s.sort();
        s
    };
    mismatch(
        &mut out,
        "subjects",
        sorted(&have.subjects),
        sorted(&want.subjects),
        true,
    );
    mismatch(&mut out, "retention", have.retention, want.retention, false);
    mismatch(&mut out, "storage", have.storage, want.storage, false);
    mismatch(&mut out, "discard", have.discard, want.discard, true);
    mismatch(&mut out, "max_age", have.max_age, want.max_age, true);
    // The server stores "no limit" as -1 whatever negative value was sent.
    mismatch(
        &mut out,
        "max_bytes",
        have.max_bytes.max(-1),
        want.max_bytes.max(-1),
        true,
    );
    if want.duplicate_window != Duration::ZERO {
        mismatch(
            &mut out,
            "duplicate_window",
            have.duplicate_window,
            want.duplicate_window,
            true,
        );
    }
    out
}

/// The differences that matter between the consumer on the server and the one wanted.
pub fn consumer_mismatches(
    have: &jetstream::consumer::Config,
    want: &pull::Config,
) -> Vec<Mismatch> {
    let mut out = Vec::new();
    mismatch(
        &mut out,
        "deliver_subject (push consumer)",
        have.deliver_subject.clone(),
        None,
        false,
    );
    mismatch(
        &mut out,
        "ack_policy",
        have.ack_policy,
        want.ack_policy,
        false,
    );
    mismatch(
        &mut out,
        "deliver_policy",
        have.deliver_policy,
        want.deliver_policy,
        false,
    );
    mismatch(
        &mut out,
        "filter_subject",
        have.filter_subject.clone(),
        want.filter_subject.clone(),
        false,
    );
    mismatch(&mut out, "ack_wait", have.ack_wait, want.ack_wait, true);
    mismatch(
        &mut out,
        "max_deliver",
        have.max_deliver.max(-1),
        want.max_deliver.max(-1),
        true,
    );
    out
}

/// What `setup` did to one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Created,
    Unchanged,
    Updated(Vec<Mismatch>),
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Created => f.write_str("created"),
            Change::Unchanged => f.write_str("unchanged"),
            Change::Updated(fields) => {
                f.write_str("updated (")?;
                for (i, m) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{m}")?;
                }
                f.write_str(")")
            }
        }
    }
}

/// What `setup` did, object by object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub objects: Vec<(String, Change)>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, change) in &self.objects {
            writeln!(f, "{name}: {change}")?;
        }
        Ok(())
    }
}

/// Which objects [`ensure`] manages. The GEN stream only when decode jobs are
/// published into it (`jetstream.gen_is_stream`).
fn manages_gen(config: &Config) -> bool {
    config.jetstream.gen_is_stream
}

/// Creates what is missing and updates what differs in a way the server can
/// change in place. A difference it cannot change (retention, storage, ack
/// policy, ...) is an error that names the object, the field and the way out;
/// nothing is deleted.
pub async fn ensure(js: &jetstream::Context, config: &Config) -> Result<Report, JetStreamError> {
    let wanted = Wanted::from_config(config)?;
    let mut objects = Vec::new();
    let label = |kind: &str, name: &str| format!("{kind} {name}");
    let change = ensure_stream(js, &wanted.prefill).await?;
    objects.push((label("stream", &wanted.prefill.name), change));
    if manages_gen(config) {
        let change = ensure_stream(js, &wanted.gen_jobs).await?;
        objects.push((label("stream", &wanted.gen_jobs.name), change));
    }
    let change = ensure_consumer(js, &wanted.prefill.name, &wanted.consumer).await?;
    let name = wanted.consumer.durable_name.clone().unwrap_or_default();
    objects.push((format!("consumer {}/{name}", wanted.prefill.name), change));
    Ok(Report { objects })
}

fn api_error(what: String, e: impl fmt::Display) -> JetStreamError {
    JetStreamError::Api(format!("{what}: {e}"))
}

async fn ensure_stream(
    js: &jetstream::Context,
    want: &stream::Config,
) -> Result<Change, JetStreamError> {
    use jetstream::context::GetStreamErrorKind;
    let name = &want.name;
    let have = match js.get_stream(name).await {
        Ok(mut stream) => stream
            .info()
            .await
            .map_err(|e| api_error(format!("reading stream {name}"), e))?
            .config
            .clone(),
        Err(e) if matches!(e.kind(), GetStreamErrorKind::JetStream(ref api) if api.code() == 404) =>
        {
            js.create_stream(want.clone())
                .await
                .map_err(|e| api_error(format!("creating stream {name}"), e))?;
            return Ok(Change::Created);
        }
        Err(e) => return Err(api_error(format!("looking up stream {name}"), e)),
    };
    let mismatches = stream_mismatches(&have, want);
    if mismatches.is_empty() {
        return Ok(Change::Unchanged);
    }
    if let Some(fixed) = mismatches.iter().find(|m| !m.updatable) {
        return Err(JetStreamError::Incompatible(format!(
            "stream {name} exists with {} {} but the configuration wants {}; the server cannot change that in place. Either set the configuration to match, or delete the stream (its messages are lost) and run setup again",
            fixed.field, fixed.have, fixed.want
        )));
    }
    // Keep every field we do not manage as the operator left it.
    let mut update = have;
    update.subjects = want.subjects.clone();
    update.discard = want.discard;
    update.max_age = want.max_age;
    update.max_bytes = want.max_bytes;
    if want.duplicate_window != Duration::ZERO {
        update.duplicate_window = want.duplicate_window;
    }
    js.update_stream(update)
        .await
        .map_err(|e| api_error(format!("updating stream {name}"), e))?;
    Ok(Change::Updated(mismatches))
}

async fn ensure_consumer(
    js: &jetstream::Context,
    stream_name: &str,
    want: &pull::Config,
) -> Result<Change, JetStreamError> {
    use jetstream::context::ConsumerInfoErrorKind;
    let name = want.durable_name.clone().unwrap_or_default();
    let stream = js
        .get_stream_no_info(stream_name)
        .await
        .map_err(|e| api_error(format!("opening stream {stream_name}"), e))?;
    let have = match stream.consumer_info(&name).await {
        Ok(info) => info.config,
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {
            stream
                .create_consumer(want.clone())
                .await
                .map_err(|e| api_error(format!("creating consumer {stream_name}/{name}"), e))?;
            return Ok(Change::Created);
        }
        Err(e) => {
            return Err(api_error(
                format!("looking up consumer {stream_name}/{name}"),
                e,
            ));
        }
    };
    let mismatches = consumer_mismatches(&have, want);
    if mismatches.is_empty() {
        return Ok(Change::Unchanged);
    }
    if let Some(fixed) = mismatches.iter().find(|m| !m.updatable) {
        return Err(JetStreamError::Incompatible(format!(
            "consumer {stream_name}/{name} exists with {} {} but the configuration wants {}; the server cannot change that in place. Delete the consumer (unacknowledged deliveries restart from the stream) and run setup again",
            fixed.field, fixed.have, fixed.want
        )));
    }
    // Creating a durable with the same name updates its editable fields.
    let mut update = pull::Config::try_from_consumer_config(have)
        .map_err(|e| api_error(format!("reading consumer {stream_name}/{name}"), e))?;
    update.ack_wait = want.ack_wait;
    update.max_deliver = want.max_deliver;
    stream
        .create_consumer(update)
        .await
        .map_err(|e| api_error(format!("updating consumer {stream_name}/{name}"), e))?;
    Ok(Change::Updated(mismatches))
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream::consumer::IntoConsumerConfig;

    fn base() -> Config {
        Config::default().resolve().expect("default config")
    }

    #[test]
    fn wanted_objects_follow_the_configuration() {
        let mut config = base();
        config.jetstream.max_bytes = 1 << 30;
        config.jetstream.max_age_secs = 600;
        let w = Wanted::from_config(&config).expect("valid");
        assert_eq!(w.prefill.name, "LLM_PREFILL");
        assert_eq!(w.prefill.retention, RetentionPolicy::WorkQueue);
        assert_eq!(w.prefill.discard, DiscardPolicy::New);
        assert_eq!(w.prefill.max_bytes, 1 << 30);
        assert_eq!(w.gen_jobs.name, "LLM_GEN");
        assert_eq!(w.gen_jobs.subjects, vec!["llm.gen.jobs".to_string()]);
        assert_eq!(w.gen_jobs.duplicate_window, Duration::from_secs(120));
        assert_eq!(w.gen_jobs.max_age, Duration::from_secs(600));
        assert_eq!(w.consumer.durable_name.as_deref(), Some("handoff"));
        assert_eq!(w.consumer.ack_wait, Duration::from_secs(30));
        assert_eq!(w.consumer.max_deliver, 20);
        assert!(w.consumer.filter_subject.is_empty());
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

    #[test]
    fn stream_mismatches_report_only_fields_that_matter() {
        let want = prefill_stream(&base()).expect("valid");
        type Edit = fn(&mut stream::Config);
        let rows: &[(Edit, &[(&str, bool)])] = &[
            (|_| {}, &[]),
            // Server-filled defaults and fields we do not manage are ignored.
            (|s| s.max_message_size = 1024, &[]),
            (|s| s.duplicate_window = Duration::from_secs(120), &[]),
            (|s| s.max_bytes = -7, &[]),
            (|s| s.subjects = vec!["other".into()], &[("subjects", true)]),
            (
                |s| s.retention = RetentionPolicy::Limits,
                &[("retention", false)],
            ),
            (|s| s.storage = StorageType::Memory, &[("storage", false)]),
            (|s| s.discard = DiscardPolicy::Old, &[("discard", true)]),
            (|s| s.max_age = Duration::ZERO, &[("max_age", true)]),
            (|s| s.max_bytes = 10, &[("max_bytes", true)]),
        ];
        for (i, (edit, expected)) in rows.iter().enumerate() {
            let mut have = want.clone();
            edit(&mut have);
            let got: Vec<_> = stream_mismatches(&have, &want)
                .into_iter()
                .map(|m| (m.field, m.updatable))
                .collect();
            assert_eq!(&got, expected, "row {i}");
        }
    }

    #[test]
    fn subject_order_does_not_matter() {
        let mut config = base();
        config.subjects.prefill_results = "a.results, b.results".into();
        let want = prefill_stream(&config).expect("valid");
        let mut have = want.clone();
        have.subjects.reverse();
        assert!(stream_mismatches(&have, &want).is_empty());
    }

    #[test]
    fn consumer_mismatches_report_only_fields_that_matter() {
        let want = consumer(&base()).expect("valid");
        let server = |edit: fn(&mut jetstream::consumer::Config)| {
            let mut c = want.clone().into_consumer_config();
            edit(&mut c);
            c
        };
        type Edit = fn(&mut jetstream::consumer::Config);
        let rows: &[(Edit, &[(&str, bool)])] = &[
            (|_| {}, &[]),
            (|c| c.max_ack_pending = 1000, &[]),
            (
                |c| c.ack_wait = Duration::from_secs(1),
                &[("ack_wait", true)],
            ),
            (|c| c.max_deliver = 3, &[("max_deliver", true)]),
            (|c| c.ack_policy = AckPolicy::All, &[("ack_policy", false)]),
            (
                |c| c.deliver_policy = DeliverPolicy::New,
                &[("deliver_policy", false)],
            ),
            (
                |c| c.filter_subject = "x".into(),
                &[("filter_subject", false)],
            ),
            (
                |c| c.deliver_subject = Some("push.here".into()),
                &[("deliver_subject (push consumer)", false)],
            ),
        ];
        for (i, (edit, expected)) in rows.iter().enumerate() {
            let got: Vec<_> = consumer_mismatches(&server(*edit), &want)
                .into_iter()
                .map(|m| (m.field, m.updatable))
                .collect();
            assert_eq!(&got, expected, "row {i}");
        }
    }

    #[test]
    fn an_update_report_lists_old_and_new_values() {
        let change = Change::Updated(vec![Mismatch {
            field: "max_age",
            have: "60s".into(),
            want: "120s".into(),
            updatable: true,
        }]);
        assert_eq!(change.to_string(), "updated (max_age 60s → 120s)");
    }
}
