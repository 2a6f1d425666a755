//! The headers an output sets, as names and values: what the decision
//! returns, and what the pipeline adds (a decode job's `Nats-TTL`).

use super::msg_id::{msg_id, release_msg_id};
use super::names::{HANDOFF_DEADLINE, HANDOFF_KV_EXPIRES, NATS_MSG_ID};

/// An output's own headers (the trace headers copied from its input come
/// beside them, [`super::outgoing`]): `(name, value)` in the order they were
/// set, each name a constant of [`super::names`], each value one that can
/// stand in a header line (a CR or LF, which cannot, became a space when it
/// was set). Empty when there is no header.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers {
    fields: Vec<(&'static str, String)>,
}

impl Headers {
    pub const fn new() -> Headers {
        Headers { fields: Vec::new() }
    }

    /// A decode job's one header, `Nats-Msg-Id` ([`msg_id`]).
    pub fn msg_id(request_id: &str) -> Headers {
        Headers::job(request_id, None, None)
    }

    /// A decode job's headers: `Nats-Msg-Id` ([`msg_id`]), for a result
    /// with a deadline `Handoff-Deadline`, and for one whose KV expires
    /// `Handoff-KV-Expires`. Room for one more, which
    /// the pipeline adds when the GEN stream expires jobs by `Nats-TTL`.
    pub fn job(request_id: &str, deadline: Option<u64>, kv_expires: Option<u64>) -> Headers {
        let mut headers = Headers {
            fields: Vec::with_capacity(2),
        };
        headers.add_job(request_id, deadline, kv_expires);
        headers
    }

    /// Appends a decode job's headers ([`Headers::job`]) to these.
    pub fn add_job(&mut self, request_id: &str, deadline: Option<u64>, kv_expires: Option<u64>) {
        self.fields.push((NATS_MSG_ID, msg_id(request_id)));
        if let Some(ms) = deadline {
            self.fields.push((HANDOFF_DEADLINE, ms.to_string()));
        }
        if let Some(ms) = kv_expires {
            self.fields.push((HANDOFF_KV_EXPIRES, ms.to_string()));
        }
    }

    /// A KV release notice's one header: `Nats-Msg-Id: release-{request_id}`
    /// ([`release_msg_id`]).
    pub fn release(request_id: &str) -> Headers {
        Headers {
            fields: vec![(NATS_MSG_ID, release_msg_id(request_id))],
        }
    }

    /// Appends `name: value`. `name` is a constant of [`super::names`] (no
    /// `:`, space or line break); a CR or LF in `value`, which cannot stand
    /// in a header line, becomes a space.
    pub fn push(&mut self, name: &'static str, value: &str) {
        debug_assert!(!name.is_empty() && !name.contains([':', ' ', '\r', '\n']));
        self.fields.push((name, line_safe(value)));
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The value of the first header named `name` (exactly: the names are
    /// this crate's constants).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// `(name, value)` in the order they were set.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> + Clone {
        self.fields.iter().map(|(n, v)| (*n, v.as_str()))
    }

    pub(super) fn into_fields(self) -> Vec<(&'static str, String)> {
        self.fields
    }
}

/// `value` with each CR and LF written as a space.
fn line_safe(value: &str) -> String {
    // Looked for first: values almost never hold one, and a rewrite a
    // character at a time would cost every output a pass it does not need.
    if memchr::memchr2(b'\r', b'\n', value.as_bytes()).is_none() {
        return value.to_string();
    }
    value.replace(['\r', '\n'], " ")
}

impl<'a> IntoIterator for &'a Headers {
    type Item = (&'static str, &'a str);
    type IntoIter = Box<dyn Iterator<Item = (&'static str, &'a str)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_read_back_as_set_with_line_breaks_as_spaces() {
        let mut h = Headers::new();
        assert!(h.is_empty() && h.get("A").is_none());
        h.push("Content-Type", "application/json");
        h.push("Handoff-Error", "one\r\ntwo\n: three\rfour");
        assert_eq!(
            h.iter().collect::<Vec<_>>(),
            vec![
                ("Content-Type", "application/json"),
                ("Handoff-Error", "one  two : three four")
            ]
        );
        assert_eq!(h.get("Handoff-Error"), Some("one  two : three four"));
        assert_eq!(h.get("content-type"), None, "names match exactly");
        assert_eq!(
            format!("{h:?}"),
            format!("{:?}", h.iter().collect::<Vec<_>>())
        );
    }

    #[test]
    fn a_job_carries_its_msg_id_and_deadline_and_a_release_its_own_msg_id() {
        for id in ["r-1", "a b%c\u{e9}\r\n", ""] {
            let h = Headers::msg_id(id);
            let mut pushed = Headers::new();
            pushed.push("Nats-Msg-Id", &msg_id(id));
            assert_eq!(h, pushed, "{id:?}");
            assert_eq!(h.get("Nats-Msg-Id"), Some(msg_id(id).as_str()));
        }
        for deadline in [0, 9, 10, 1_767_225_600_000, (1 << 63) - 1] {
            let h = Headers::job("r-1", Some(deadline), None);
            let mut pushed = Headers::new();
            pushed.push("Nats-Msg-Id", &msg_id("r-1"));
            pushed.push("Handoff-Deadline", &deadline.to_string());
            assert_eq!(h, pushed, "{deadline}");
        }
        assert_eq!(Headers::job("r-1", None, None), Headers::msg_id("r-1"));
        let h = Headers::job("r-1", None, Some(7));
        assert_eq!(h.get("Handoff-KV-Expires"), Some("7"));
        let h = Headers::release("a b");
        assert_eq!(h.get("Nats-Msg-Id"), Some("release-a%20b"));
        assert_eq!(h.iter().count(), 1);
    }
}
