//! Comparing what the server holds with what is wanted. Only the fields this
//! worker sets are compared: the server fills in defaults for the rest, and
//! an operator may have tuned them.

use async_nats::jetstream::{self, consumer::pull, stream};
use std::fmt;
use std::time::Duration;

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
    // 0 means no limit too.
    let limit = |n: i64| if n <= 0 { -1 } else { n };
    mismatch(
        &mut out,
        "max_messages",
        limit(have.max_messages),
        limit(want.max_messages),
        true,
    );

    // Raising replicas (1 → 3) is done in place by 2.9.10 and 2.15 alike.
    mismatch(
        &mut out,
        "num_replicas",
        have.num_replicas.max(1),
        want.num_replicas.max(1),
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
    mismatch(
        &mut out,
        "max_ack_pending",
        have.max_ack_pending.max(-1),
        want.max_ack_pending.max(-1),
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
    /// What the server cannot do that the configuration would use, said
    /// once (per-message TTL before nats-server 2.11).
    pub notes: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, change) in &self.objects {
            writeln!(f, "{name}: {change}")?;
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::setup::wanted::{consumer, prefill_stream};
    use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, IntoConsumerConfig};
    use async_nats::jetstream::stream::{DiscardPolicy, RetentionPolicy, StorageType};

    fn base() -> Config {
        Config::default().resolve().expect("default config")
    }

    #[test]
    fn stream_mismatches_report_only_fields_that_matter() {
        let want = prefill_stream(&base());
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
            // The server reports 0 for a stream created without replicas.
            (|s| s.num_replicas = 0, &[]),
            (|s| s.num_replicas = 3, &[("num_replicas", true)]),
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
        let want = prefill_stream(&config);
        let mut have = want.clone();
        have.subjects.reverse();
        assert!(stream_mismatches(&have, &want).is_empty());
    }

    #[test]
    fn consumer_mismatches_report_only_fields_that_matter() {
        let want = consumer(&base());
        let server = |edit: fn(&mut jetstream::consumer::Config)| {
            let mut c = want.clone().into_consumer_config();
            edit(&mut c);
            c
        };
        type Edit = fn(&mut jetstream::consumer::Config);
        let rows: &[(Edit, &[(&str, bool)])] = &[
            (|_| {}, &[]),
            (|c| c.max_ack_pending = 4096, &[]),
            (
                |c| c.ack_wait = Duration::from_secs(1),
                &[("ack_wait", true)],
            ),
            (|c| c.max_deliver = 3, &[("max_deliver", true)]),
            (|c| c.max_ack_pending = 50, &[("max_ack_pending", true)]),
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
