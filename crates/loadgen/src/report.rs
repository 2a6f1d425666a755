//! The result of a run: counts, throughput and latency, as text for people
//! and as JSON for scripts.

use super::mix::OutputKind;
use super::tally::{EXAMPLES, Tally};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub run_id: String,
    pub mix: String,
    /// Messages published in the measured window (warm-up excluded).
    pub sent: u64,
    /// Publishes that failed (JetStream: no ack or a negative one).
    pub publish_errors: u64,
    pub publish_error_examples: Vec<String>,
    /// Outputs the load generator itself dropped because it fell behind
    /// (async-nats slow-consumer events); non-zero makes the run unreliable.
    pub slow_consumer_events: u64,
    /// Requested rate in messages/s; 0 = as fast as possible.
    pub rate: f64,
    /// Every output of this run by kind, duplicates included.
    pub received: BTreeMap<&'static str, u64>,
    /// Messages that had at least one output.
    pub matched: u64,
    pub missing: u64,
    pub missing_examples: Vec<String>,
    pub duplicates: u64,
    pub duplicate_examples: Vec<String>,
    /// Outputs of a different kind than the message calls for.
    pub wrong_kind: u64,
    pub wrong_kind_examples: Vec<String>,
    pub warmup_received: u64,
    pub foreign: u64,
    pub unreadable: u64,
    /// Seconds spent publishing the measured messages.
    pub publish_secs: f64,
    /// Seconds from the first send to the last output.
    pub window_secs: f64,
    /// Outputs per second over that window.
    pub throughput: f64,
    pub latency_ms: Latency,
    /// All outputs arrived exactly once, each of the expected kind, and every
    /// publish succeeded.
    pub ok: bool,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Default)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Latency {
    /// Nearest-rank percentiles over send-to-output latencies in nanoseconds.
    pub fn from_ns(mut samples: Vec<u64>) -> Latency {
        if samples.is_empty() {
            return Latency::default();
        }
        samples.sort_unstable();
        let ms = |ns: u64| ns as f64 / 1e6;
        let rank = |p: f64| {
            let r = (p / 100.0 * samples.len() as f64).ceil() as usize;
            samples[r.clamp(1, samples.len()) - 1]
        };
        let sum: u128 = samples.iter().map(|s| u128::from(*s)).sum();
        Latency {
            p50: ms(rank(50.0)),
            p90: ms(rank(90.0)),
            p99: ms(rank(99.0)),
            max: ms(samples[samples.len() - 1]),
            mean: sum as f64 / samples.len() as f64 / 1e6,
        }
    }
}

/// What the driver measured besides the arrivals.
#[derive(Debug, Clone)]
pub struct Timing {
    pub run_id: String,
    pub mix: String,
    pub rate: f64,
    /// Send instant of each measured message, ns since the run's origin.
    pub sent_ns: Vec<u64>,
    pub publish_errors: u64,
    pub publish_error_examples: Vec<String>,
    pub publish_end_ns: u64,
    pub slow_consumer_events: u64,
}

impl Report {
    pub fn new(tally: &Tally, timing: Timing) -> Report {
        let sent = timing.sent_ns.len() as u64;
        let first_send = timing.sent_ns.first().copied().unwrap_or(0);
        let missing: Vec<usize> = tally.missing().collect();
        let window_ns = tally.last_arrival_ns.saturating_sub(first_send);
        let window_secs = window_ns as f64 / 1e9;
        let received = OutputKind::ALL
            .iter()
            .map(|k| (k.as_str(), tally.by_kind[k.index()]))
            .filter(|(k, n)| *n > 0 || !matches!(*k, "relayed" | "unrecognized"))
            .collect();
        let ok = missing.is_empty()
            && tally.duplicates == 0
            && tally.wrong_kind == 0
            && timing.publish_errors == 0
            && timing.slow_consumer_events == 0
            && sent > 0;
        Report {
            run_id: timing.run_id,
            mix: timing.mix,
            sent,
            publish_errors: timing.publish_errors,
            publish_error_examples: timing.publish_error_examples,
            slow_consumer_events: timing.slow_consumer_events,
            rate: timing.rate,
            received,
            matched: tally.unique,
            missing: missing.len() as u64,
            missing_examples: missing
                .iter()
                .take(EXAMPLES)
                .map(|seq| tally.request_id(*seq))
                .collect(),
            duplicates: tally.duplicates,
            duplicate_examples: tally.duplicate_examples.clone(),
            wrong_kind: tally.wrong_kind,
            wrong_kind_examples: tally.wrong_kind_examples.clone(),
            warmup_received: tally.warmup,
            foreign: tally.foreign,
            unreadable: tally.unreadable,
            publish_secs: timing.publish_end_ns.saturating_sub(first_send) as f64 / 1e9,
            window_secs,
            throughput: if window_ns > 0 {
                tally.unique as f64 / window_secs
            } else {
                0.0
            },
            latency_ms: Latency::from_ns(tally.latencies_ns(&timing.sent_ns)),
            ok,
        }
    }

    /// One sentence on what went wrong, for the exit message; `None` when ok.
    pub fn failure(&self) -> Option<String> {
        if self.ok {
            return None;
        }
        let mut parts = Vec::new();
        if self.sent == 0 {
            parts.push("nothing was sent".to_string());
        }
        if self.missing > 0 {
            parts.push(format!("{} of {} outputs missing", self.missing, self.sent));
        }
        if self.duplicates > 0 {
            parts.push(format!("{} duplicated", self.duplicates));
        }
        if self.wrong_kind > 0 {
            parts.push(format!("{} of the wrong kind", self.wrong_kind));
        }
        if self.publish_errors > 0 {
            parts.push(format!("{} publishes failed", self.publish_errors));
        }
        if self.slow_consumer_events > 0 {
            parts.push(format!(
                "the load generator fell behind and dropped outputs {} times",
                self.slow_consumer_events
            ));
        }
        Some(parts.join(", "))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rate = if self.rate > 0.0 {
            format!("{} msg/s", self.rate)
        } else {
            "as fast as possible".into()
        };
        writeln!(f, "run {}  mix {}  rate {rate}", self.run_id, self.mix)?;
        writeln!(
            f,
            "sent        {} in {:.3} s ({} publish errors)",
            self.sent, self.publish_secs, self.publish_errors
        )?;
        let kinds: Vec<String> = self
            .received
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        writeln!(f, "received    {}", kinds.join(" "))?;
        writeln!(
            f,
            "matched     {}  missing {}  duplicated {}  wrong kind {}",
            self.matched, self.missing, self.duplicates, self.wrong_kind
        )?;
        for (label, list) in [
            ("publish errors", &self.publish_error_examples),
            ("missing", &self.missing_examples),
            ("duplicated", &self.duplicate_examples),
            ("wrong kind", &self.wrong_kind_examples),
        ] {
            if !list.is_empty() {
                writeln!(f, "  {label}: {}", list.join(", "))?;
            }
        }
        if self.foreign + self.unreadable + self.warmup_received > 0 {
            writeln!(
                f,
                "ignored     warm-up {}  other runs {}  unreadable {}",
                self.warmup_received, self.foreign, self.unreadable
            )?;
        }
        writeln!(
            f,
            "throughput  {:.0} outputs/s over {:.3} s (first send to last output)",
            self.throughput, self.window_secs
        )?;
        let l = &self.latency_ms;
        write!(
            f,
            "latency ms  p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}  mean {:.3}",
            l.p50, l.p90, l.p99, l.max, l.mean
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::{RunIds, from_pairs, to_msgpack};
    use crate::tally::Channel;
    use rmpv::Value;

    #[test]
    fn percentiles_by_nearest_rank() {
        let l = Latency::from_ns((1..=100).map(|ms| ms * 1_000_000).collect());
        assert_eq!((l.p50, l.p90, l.p99, l.max), (50.0, 90.0, 99.0, 100.0));
        assert!((l.mean - 50.5).abs() < 1e-9);
        let one = Latency::from_ns(vec![2_000_000]);
        assert_eq!((one.p50, one.p99, one.max), (2.0, 2.0, 2.0));
        assert_eq!(Latency::from_ns(vec![]), Latency::default());
    }

    fn job(seq: usize) -> Vec<u8> {
        to_msgpack(&from_pairs([
            ("request_id", Value::from(format!("lg-r-{seq}"))),
            ("backend", Value::from("opaque")),
        ]))
    }

    fn timing(sent_ns: Vec<u64>) -> Timing {
        Timing {
            run_id: "r".into(),
            mix: "trtllm=1".into(),
            rate: 0.0,
            sent_ns,
            publish_errors: 0,
            publish_error_examples: vec![],
            publish_end_ns: 0,
            slow_consumer_events: 0,
        }
    }

    #[test]
    fn all_once_is_ok_and_throughput_spans_first_send_to_last_output() {
        let mut t = Tally::new(RunIds::new("r"), vec![OutputKind::Decode; 4]);
        for seq in 0..4 {
            t.record(
                Channel::Gen,
                &job(seq),
                1_000_000_000 + seq as u64 * 250_000_000,
            );
        }
        // Sends at 0.5 s .. ; last output at 1.75 s: a 1.25 s window.
        let r = Report::new(
            &t,
            timing(vec![500_000_000, 600_000_000, 700_000_000, 800_000_000]),
        );
        assert!(r.ok, "{r}");
        assert_eq!(r.failure(), None);
        assert_eq!((r.sent, r.matched, r.missing), (4, 4, 0));
        assert!((r.window_secs - 1.25).abs() < 1e-9);
        assert!((r.throughput - 3.2).abs() < 1e-9);
        assert_eq!(r.received.get("decode"), Some(&4));
        assert_eq!(
            r.received.get("relayed"),
            None,
            "zero extras are not listed"
        );
    }

    #[test]
    fn missing_and_duplicates_fail_the_run_and_are_listed() {
        let mut t = Tally::new(RunIds::new("r"), vec![OutputKind::Decode; 8]);
        t.record(Channel::Gen, &job(1), 10);
        t.record(Channel::Gen, &job(1), 11);
        let r = Report::new(&t, timing(vec![0; 8]));
        assert!(!r.ok);
        assert_eq!(r.missing, 7);
        assert_eq!(
            r.missing_examples,
            vec!["lg-r-0", "lg-r-2", "lg-r-3", "lg-r-4", "lg-r-5"]
        );
        assert_eq!(r.duplicates, 1);
        assert_eq!(
            r.failure().as_deref(),
            Some("7 of 8 outputs missing, 1 duplicated")
        );
        let json = serde_json::to_value(&r).expect("serializes");
        assert_eq!(json["missing"], 7);
        assert_eq!(json["latency_ms"]["p50"], 1e-5);
    }
}
