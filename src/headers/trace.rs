//! Which trace headers an input passes on to its output (contract 3 and 9).
//!
//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>) headers are
//! copied only when well formed and within the sizes the recommendation sets:
//! a `traceparent` of version `00` (exactly 55 characters), and a
//! `tracestate` of at most 32 well-formed list members in at most 512 bytes.
//! Anything else is dropped and reported, so that no header can push an
//! output over the server's `max_payload` (a 1 MB `tracestate` copied onto a
//! decode job would cost that result its one output) or smuggle bytes the
//! receivers' tracers would reject anyway.
//!
//! The output always carries the canonical lowercase names, whatever spelling
//! the input used, and one value each: several `tracestate` headers are one
//! list (W3C 3.3.1.1) and are joined with `,`; several `traceparent` headers
//! are ambiguous and dropped. A `tracestate` is only meaningful beside the
//! `traceparent` it belongs to, so it is dropped when that is (W3C 3.3.1:
//! "MUST NOT attempt to parse tracestate" then).

use super::names::{TRACEPARENT, TRACESTATE};
use async_nats::HeaderMap;

/// `traceparent` of version 00: `00-{32 hex}-{16 hex}-{2 hex}`.
pub const TRACEPARENT_LEN: usize = 55;
/// The largest `tracestate` copied (W3C: vendors SHOULD propagate at least 512).
pub const MAX_TRACESTATE_BYTES: usize = 512;
/// The most `tracestate` list members copied (W3C: at most 32).
pub const MAX_TRACESTATE_MEMBERS: usize = 32;

/// A trace header, for counting what was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceHeader {
    Traceparent,
    Tracestate,
}

impl TraceHeader {
    pub const ALL: [TraceHeader; 2] = [TraceHeader::Traceparent, TraceHeader::Tracestate];

    pub fn as_str(self) -> &'static str {
        match self {
            TraceHeader::Traceparent => TRACEPARENT,
            TraceHeader::Tracestate => TRACESTATE,
        }
    }
}

/// The trace headers to copy onto an output, and those dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceHeaders {
    /// `(name, value)` with the canonical lowercase names, at most one each.
    pub copy: Vec<(&'static str, String)>,
    /// Trace headers the input had that are not copied.
    pub dropped: Vec<TraceHeader>,
}

impl TraceHeaders {
    pub fn is_empty(&self) -> bool {
        self.copy.is_empty()
    }

    /// The trace headers a received message passes on to its outputs.
    pub fn read(headers: Option<&HeaderMap>) -> TraceHeaders {
        let Some(headers) = headers else {
            return TraceHeaders::default();
        };
        TraceHeaders::from_pairs(headers.iter().flat_map(|(name, values)| {
            let name: &str = name.as_ref();
            values.iter().map(move |value| (name, value.as_str()))
        }))
    }

    /// The trace headers of an input given as `(name, value)` pairs (names
    /// in any case; one pair per value of a repeated header). Other headers
    /// are ignored.
    pub fn from_pairs<'a>(input: impl IntoIterator<Item = (&'a str, &'a str)>) -> TraceHeaders {
        let mut parents: Vec<&str> = Vec::new();
        let mut states: Vec<&str> = Vec::new();
        for (name, value) in input {
            if name.eq_ignore_ascii_case(TRACEPARENT) {
                parents.push(value);
            } else if name.eq_ignore_ascii_case(TRACESTATE) {
                states.push(value);
            }
        }
        let mut out = TraceHeaders::default();
        let parent = match parents[..] {
            [] => None,
            [one] if is_traceparent(one) => Some(one),
            _ => {
                out.dropped.push(TraceHeader::Traceparent);
                None
            }
        };
        let Some(parent) = parent else {
            if !states.is_empty() {
                out.dropped.push(TraceHeader::Tracestate);
            }
            return out;
        };
        out.copy.push((TRACEPARENT, parent.to_string()));
        if states.is_empty() {
            return out;
        }
        // Cheap bound before joining: whatever the join, more bytes than this
        // cannot fit.
        let total: usize = states.iter().map(|s| s.len() + 1).sum();
        let state = (total <= MAX_TRACESTATE_BYTES + 1)
            .then(|| states.join(","))
            .filter(|s| is_tracestate(s));
        match state {
            Some(state) => out.copy.push((TRACESTATE, state)),
            None => out.dropped.push(TraceHeader::Tracestate),
        }
        out
    }
}

/// `00-{trace-id: 32 lowercase hex, not all zero}-{parent-id: 16 lowercase
/// hex, not all zero}-{flags: 2 lowercase hex}`. Other versions are not
/// copied: version 00 is the only one defined, and `ff` is invalid.
fn is_traceparent(value: &str) -> bool {
    let b = value.as_bytes();
    if b.len() != TRACEPARENT_LEN || &b[..3] != b"00-" || b[35] != b'-' || b[52] != b'-' {
        return false;
    }
    let hex = |s: &[u8]| s.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let zero = |s: &[u8]| s.iter().all(|c| *c == b'0');
    let (trace_id, parent_id, flags) = (&b[3..35], &b[36..52], &b[53..55]);
    hex(trace_id) && hex(parent_id) && hex(flags) && !zero(trace_id) && !zero(parent_id)
}

/// A W3C `tracestate` list within [`MAX_TRACESTATE_BYTES`] and
/// [`MAX_TRACESTATE_MEMBERS`], every member `key=value` and no key twice.
/// Empty members (`a=1,,b=2`) are allowed, as W3C says; they do not count.
fn is_tracestate(value: &str) -> bool {
    if value.len() > MAX_TRACESTATE_BYTES {
        return false;
    }
    let mut keys: Vec<&str> = Vec::new();
    for member in value.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        let Some((key, val)) = member.split_once('=') else {
            return false;
        };
        if !is_key(key) || !is_value(val) || keys.contains(&key) {
            return false;
        }
        keys.push(key);
        if keys.len() > MAX_TRACESTATE_MEMBERS {
            return false;
        }
    }
    true
}

/// `simple-key` (lcalpha then up to 255 of lcalpha, digit, `_-*/`) or
/// `tenant@system` (tenant: lcalpha or digit then up to 240 more; system:
/// lcalpha then up to 13 more).
fn is_key(key: &str) -> bool {
    let rest = |s: &[u8], max: usize| {
        s.len() <= max
            && s.iter()
                .all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/'))
    };
    match key.as_bytes().split(|c| *c == b'@').collect::<Vec<_>>()[..] {
        [simple] => matches!(simple.first(), Some(b'a'..=b'z')) && rest(&simple[1..], 255),
        [tenant, system] => {
            matches!(tenant.first(), Some(b'a'..=b'z' | b'0'..=b'9'))
                && rest(&tenant[1..], 240)
                && matches!(system.first(), Some(b'a'..=b'z'))
                && rest(&system[1..], 13)
        }
        _ => false,
    }
}

/// 1 to 256 printable ASCII characters other than `,` and `=`, spaces
/// allowed inside but not at the end.
fn is_value(value: &str) -> bool {
    let b = value.as_bytes();
    !b.is_empty()
        && b.len() <= 256
        && b.last() != Some(&b' ')
        && b.iter()
            .all(|c| (0x20..=0x7e).contains(c) && *c != b',' && *c != b'=')
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// What a row expects: the values copied (traceparent, tracestate) and
    /// the headers dropped.
    type Want<'a> = (Option<&'a str>, Option<&'a str>, &'a [TraceHeader]);
    /// (name, input headers, expected)
    type Row<'a> = (&'a str, Vec<(&'a str, &'a str)>, Want<'a>);

    /// One row per rule of the module's doc.
    #[test]
    #[expect(
        clippy::too_many_lines,
        reason = "the rows are the specification, read as one table"
    )]
    fn table() {
        use TraceHeader::{Traceparent as P, Tracestate as S};
        let tp_long = format!("{TP}-x");
        // Well-formed members (values up to 256 characters) adding up to
        // 512 bytes, and to 517.
        let exactly_512 = format!("a={},b={}", "v".repeat(254), "v".repeat(253));
        let over_512 = format!("a={},b={},c=1", "v".repeat(254), "v".repeat(254));
        let value_257 = format!("a={}", "v".repeat(257));
        let members_32: String = (0..32)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",");
        let members_33: String = (0..33)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",");
        let rows: Vec<Row> = vec![
            ("no headers", vec![], (None, None, &[])),
            (
                "other headers only",
                vec![("Content-Type", "x")],
                (None, None, &[]),
            ),
            (
                "valid pair",
                vec![("traceparent", TP), ("tracestate", "rojo=1,congo=t61")],
                (Some(TP), Some("rojo=1,congo=t61"), &[]),
            ),
            (
                "names in any case",
                vec![("TraceParent", TP), ("TRACESTATE", "a=1")],
                (Some(TP), Some("a=1"), &[]),
            ),
            (
                "traceparent alone",
                vec![("traceparent", TP)],
                (Some(TP), None, &[]),
            ),
            (
                "traceparent too long",
                vec![("traceparent", &tp_long)],
                (None, None, &[P]),
            ),
            (
                "traceparent too short",
                vec![("traceparent", &TP[..54])],
                (None, None, &[P]),
            ),
            (
                "traceparent upper-case hex",
                vec![(
                    "traceparent",
                    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                )],
                (None, None, &[P]),
            ),
            (
                "traceparent non-hex",
                vec![(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
                )],
                (None, None, &[P]),
            ),
            (
                "traceparent zero trace-id",
                vec![(
                    "traceparent",
                    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                )],
                (None, None, &[P]),
            ),
            (
                "traceparent zero parent-id",
                vec![(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                )],
                (None, None, &[P]),
            ),
            (
                "traceparent version ff",
                vec![(
                    "traceparent",
                    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                )],
                (None, None, &[P]),
            ),
            (
                "traceparent other version",
                vec![(
                    "traceparent",
                    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                )],
                (None, None, &[P]),
            ),
            (
                "traceparent wrong separators",
                vec![(
                    "traceparent",
                    "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                )],
                (None, None, &[P]),
            ),
            (
                "traceparent twice",
                vec![("traceparent", TP), ("traceparent", TP)],
                (None, None, &[P]),
            ),
            (
                "bad traceparent takes tracestate with it",
                vec![("traceparent", "junk"), ("tracestate", "a=1")],
                (None, None, &[P, S]),
            ),
            (
                "tracestate without traceparent",
                vec![("tracestate", "a=1")],
                (None, None, &[S]),
            ),
            (
                "tracestate 512 bytes",
                vec![("traceparent", TP), ("tracestate", &exactly_512)],
                (Some(TP), Some(&exactly_512), &[]),
            ),
            (
                "tracestate over 512 bytes",
                vec![("traceparent", TP), ("tracestate", &over_512)],
                (Some(TP), None, &[S]),
            ),
            (
                "tracestate value over 256 characters",
                vec![("traceparent", TP), ("tracestate", &value_257)],
                (Some(TP), None, &[S]),
            ),
            (
                "tracestate 32 members",
                vec![("traceparent", TP), ("tracestate", &members_32)],
                (Some(TP), Some(&members_32), &[]),
            ),
            (
                "tracestate 33 members",
                vec![("traceparent", TP), ("tracestate", &members_33)],
                (Some(TP), None, &[S]),
            ),
            (
                "tracestate split over two headers",
                vec![
                    ("traceparent", TP),
                    ("tracestate", "a=1"),
                    ("tracestate", "b=2"),
                ],
                (Some(TP), Some("a=1,b=2"), &[]),
            ),
            (
                "tracestate empty members and spaces",
                vec![("traceparent", TP), ("tracestate", "a=1 ,, \tb=2")],
                (Some(TP), Some("a=1 ,, \tb=2"), &[]),
            ),
            (
                "tracestate multi-tenant key",
                vec![("traceparent", TP), ("tracestate", "t1@sys=x")],
                (Some(TP), Some("t1@sys=x"), &[]),
            ),
            (
                "tracestate member without =",
                vec![("traceparent", TP), ("tracestate", "a=1,b")],
                (Some(TP), None, &[S]),
            ),
            (
                "tracestate upper-case key",
                vec![("traceparent", TP), ("tracestate", "Ab=1")],
                (Some(TP), None, &[S]),
            ),
            (
                "tracestate key starting with a digit",
                vec![("traceparent", TP), ("tracestate", "1a=1")],
                (Some(TP), None, &[S]),
            ),
            (
                "tracestate empty value",
                vec![("traceparent", TP), ("tracestate", "a=")],
                (Some(TP), None, &[S]),
            ),
            (
                "tracestate value with =",
                vec![("traceparent", TP), ("tracestate", "a=b=c")],
                (Some(TP), None, &[S]),
            ),
            (
                "tracestate control character",
                vec![("traceparent", TP), ("tracestate", "a=b\u{1}c")],
                (Some(TP), None, &[S]),
            ),
            (
                "tracestate non-ASCII",
                vec![("traceparent", TP), ("tracestate", "a=é")],
                (Some(TP), None, &[S]),
            ),
            (
                "tracestate duplicate key",
                vec![("traceparent", TP), ("tracestate", "a=1,a=2")],
                (Some(TP), None, &[S]),
            ),
            (
                "tracestate system id too long",
                vec![("traceparent", TP), ("tracestate", "t@abcdefghijklmno=1")],
                (Some(TP), None, &[S]),
            ),
        ];
        for (name, input, (parent, state, dropped)) in rows {
            let got = TraceHeaders::from_pairs(input.iter().copied());
            let mut want = Vec::new();
            if let Some(p) = parent {
                want.push((TRACEPARENT, p.to_string()));
            }
            if let Some(s) = state {
                want.push((TRACESTATE, s.to_string()));
            }
            assert_eq!(got.copy, want, "{name}");
            assert_eq!(got.dropped, dropped, "{name}");
        }
    }
}
