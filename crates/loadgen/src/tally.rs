//! Matching outputs to the messages that caused them: first arrivals,
//! duplicates, outputs of the wrong kind, and what never came.

use super::mix::OutputKind;
use super::payload::{RunIds, Tag};
use super::scan;

/// Where an output arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Gen,
    Reply,
    DeadLetter,
}

/// How many example request IDs a report lists per problem.
pub const EXAMPLES: usize = 5;

const NOT_YET: u64 = u64::MAX;

/// The arrivals of one run, indexed by sequence number.
#[derive(Debug)]
pub struct Tally {
    ids: RunIds,
    expected: Vec<OutputKind>,
    /// Nanoseconds since the run's origin at the first arrival, or `NOT_YET`.
    arrived_ns: Vec<u64>,
    pub unique: u64,
    pub by_kind: [u64; OutputKind::ALL.len()],
    pub duplicates: u64,
    pub duplicate_examples: Vec<String>,
    pub wrong_kind: u64,
    /// `request_id: expected X, got Y`.
    pub wrong_kind_examples: Vec<String>,
    pub warmup: u64,
    /// Outputs without a request ID of this run (other runs, other programs).
    pub foreign: u64,
    /// Outputs that are not a MessagePack map at all.
    pub unreadable: u64,
    pub last_arrival_ns: u64,
}

impl Tally {
    /// `expected[seq]` is the output kind message `seq` must produce.
    pub fn new(ids: RunIds, expected: Vec<OutputKind>) -> Tally {
        Tally {
            arrived_ns: vec![NOT_YET; expected.len()],
            ids,
            expected,
            unique: 0,
            by_kind: [0; OutputKind::ALL.len()],
            duplicates: 0,
            duplicate_examples: Vec::new(),
            wrong_kind: 0,
            wrong_kind_examples: Vec::new(),
            warmup: 0,
            foreign: 0,
            unreadable: 0,
            last_arrival_ns: 0,
        }
    }

    /// Whether every measured message has had its output.
    pub fn complete(&self) -> bool {
        self.unique == self.expected.len() as u64
    }

    /// Records one output that arrived on `channel` at `at_ns`.
    pub fn record(&mut self, channel: Channel, payload: &[u8], at_ns: u64) {
        let Some(fields) = scan::scan(payload) else {
            self.unreadable += 1;
            return;
        };
        let Some(tag) = fields.request_id.and_then(|id| self.ids.parse(id)) else {
            self.foreign += 1;
            return;
        };
        let seq = match tag {
            Tag::Warmup(_) => {
                self.warmup += 1;
                return;
            }
            Tag::Measured(seq) if seq < self.expected.len() => seq,
            Tag::Measured(_) => {
                self.foreign += 1;
                return;
            }
        };
        let kind = classify(channel, &fields);
        self.by_kind[kind.index()] += 1;
        let id = || fields.request_id.unwrap_or_default().to_string();
        if self.arrived_ns[seq] != NOT_YET {
            self.duplicates += 1;
            if self.duplicate_examples.len() < EXAMPLES {
                self.duplicate_examples.push(id());
            }
            return;
        }
        self.arrived_ns[seq] = at_ns;
        self.unique += 1;
        self.last_arrival_ns = self.last_arrival_ns.max(at_ns);
        let want = self.expected[seq];
        if kind != want {
            self.wrong_kind += 1;
            if self.wrong_kind_examples.len() < EXAMPLES {
                self.wrong_kind_examples.push(format!(
                    "{}: expected {}, got {}",
                    id(),
                    want.as_str(),
                    kind.as_str()
                ));
            }
        }
    }

    /// Sequence numbers that never had an output.
    pub fn missing(&self) -> impl Iterator<Item = usize> + '_ {
        self.arrived_ns
            .iter()
            .enumerate()
            .filter(|(_, at)| **at == NOT_YET)
            .map(|(seq, _)| seq)
    }

    pub fn request_id(&self, seq: usize) -> String {
        self.ids.request_id(Tag::Measured(seq))
    }

    /// Send-to-output latencies in nanoseconds of the messages that had an
    /// output, given each message's send instant (`sent_ns[seq]`).
    pub fn latencies_ns(&self, sent_ns: &[u64]) -> Vec<u64> {
        self.arrived_ns
            .iter()
            .zip(sent_ns)
            .filter(|(at, _)| **at != NOT_YET)
            .map(|(at, sent)| at.saturating_sub(*sent))
            .collect()
    }
}

/// What an output is, from where it arrived and its top-level fields.
pub fn classify(channel: Channel, fields: &scan::Fields<'_>) -> OutputKind {
    match channel {
        Channel::Gen if fields.has_backend => OutputKind::Decode,
        Channel::Gen if fields.has_frames => OutputKind::Relayed,
        Channel::Reply => match fields.kind {
            Some("terminal") => OutputKind::Terminal,
            Some("error") => OutputKind::Error,
            _ => OutputKind::Unrecognized,
        },
        Channel::DeadLetter => OutputKind::DeadLetter,
        Channel::Gen => OutputKind::Unrecognized,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::{from_pairs, to_msgpack};
    use rmpv::Value;

    fn msg(pairs: Vec<(&str, Value)>) -> Vec<u8> {
        let v = Value::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (Value::from(k), v))
                .collect(),
        );
        to_msgpack(&v)
    }

    fn id(seq: &str) -> (&'static str, Value) {
        ("request_id", Value::from(format!("lg-t-{seq}")))
    }

    #[test]
    fn classifies_by_channel_and_fields() {
        let f = |kind: Option<&'static str>, backend: bool, frames: bool| scan::Fields {
            request_id: None,
            kind,
            has_backend: backend,
            has_frames: frames,
        };
        let rows = [
            (Channel::Gen, f(None, true, false), OutputKind::Decode),
            (Channel::Gen, f(None, false, true), OutputKind::Relayed),
            (
                Channel::Gen,
                f(None, false, false),
                OutputKind::Unrecognized,
            ),
            (
                Channel::Reply,
                f(Some("terminal"), false, false),
                OutputKind::Terminal,
            ),
            (
                Channel::Reply,
                f(Some("error"), false, false),
                OutputKind::Error,
            ),
            (
                Channel::Reply,
                f(Some("other"), false, false),
                OutputKind::Unrecognized,
            ),
            (
                Channel::DeadLetter,
                f(None, false, true),
                OutputKind::DeadLetter,
            ),
        ];
        for (channel, fields, want) in rows {
            assert_eq!(classify(channel, &fields), want, "{channel:?} {fields:?}");
        }
    }

    #[test]
    fn counts_firsts_duplicates_wrong_kinds_and_missing() {
        let expected = vec![
            OutputKind::Decode,
            OutputKind::Terminal,
            OutputKind::Error,
            OutputKind::DeadLetter,
        ];
        let mut t = Tally::new(RunIds::new("t"), expected);
        let job = msg(vec![id("0"), ("backend", Value::from("trtllm"))]);
        t.record(Channel::Gen, &job, 10);
        t.record(Channel::Gen, &job, 30); // duplicate
        // Expected terminal, got error.
        t.record(
            Channel::Reply,
            &msg(vec![id("1"), ("kind", Value::from("error"))]),
            20,
        );
        t.record(
            Channel::DeadLetter,
            &msg(vec![id("3"), ("frames", Value::Array(vec![]))]),
            25,
        );
        t.record(
            Channel::Gen,
            &msg(vec![id("w4"), ("backend", Value::Nil)]),
            1,
        );
        t.record(
            Channel::Gen,
            &msg(vec![id("9"), ("backend", Value::Nil)]),
            1,
        );
        t.record(
            Channel::Gen,
            &msg(vec![("request_id", Value::from("lg-other-0"))]),
            1,
        );
        t.record(Channel::Gen, b"not msgpack", 1);
        t.record(Channel::Gen, &to_msgpack(&from_pairs([])), 1);

        assert_eq!(t.unique, 3);
        assert!(!t.complete());
        assert_eq!(t.duplicates, 1);
        assert_eq!(t.duplicate_examples, vec!["lg-t-0"]);
        assert_eq!(t.wrong_kind, 1);
        assert_eq!(
            t.wrong_kind_examples,
            vec!["lg-t-1: expected terminal, got error"]
        );
        assert_eq!(t.warmup, 1);
        assert_eq!(t.foreign, 3, "out-of-range seq, other run, no request_id");
        assert_eq!(t.unreadable, 1);
        assert_eq!(t.missing().collect::<Vec<_>>(), vec![2]);
        assert_eq!(t.last_arrival_ns, 25);
        assert_eq!(t.by_kind[OutputKind::Decode.index()], 2);
        assert_eq!(t.by_kind[OutputKind::Error.index()], 1);
        assert_eq!(t.by_kind[OutputKind::DeadLetter.index()], 1);
        // Latency from each message's own send instant; missing ones excluded.
        assert_eq!(t.latencies_ns(&[4, 5, 6, 7]), vec![6, 15, 18]);
    }
}
