//! Which delivery of its message a pulled message is, and when the server
//! stored it: both are in the message's ack subject
//! (`$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<stored, ns>.<pending>`,
//! or with `<domain>.<account hash>.` before the stream and a token after
//! `<pending>`: ADR-15).
//!
//! async-nats' `Message::info` reads the same, and is what this must agree
//! with (`same_answers_as_the_client`). It splits the subject with a `char`
//! searcher and reads the store time as an `i128`; one pass over the bytes
//! with `u64` arithmetic costs less per result, and less than `memchr` for
//! the dots (its set-up per dot is dearer than a byte compare on a short
//! subject) or `str::parse` per number (docs/performance.md, "Figures behind
//! choices in the code").

use time::OffsetDateTime;

/// The most tokens after the prefix looked at, as `Message::info` does.
const TOKENS: usize = 10;

/// `(delivered, stored at)` from an ack subject, when it is one that
/// async-nats' `Message::info` reads; `None` when that refuses it (then the
/// caller counts a first delivery of unknown age, as for a missing one).
pub fn attempt(reply: &[u8]) -> Option<(i64, OffsetDateTime)> {
    let rest = reply.strip_prefix(b"$JS.ACK.")?;
    // Where each token ends, for the first TOKENS of them.
    let mut ends = [0usize; TOKENS];
    let mut n = 0;
    for (i, byte) in rest.iter().enumerate() {
        if *byte == b'.' {
            ends[n] = i;
            n += 1;
            if n == TOKENS {
                break;
            }
        }
    }
    if n < TOKENS {
        // The last token runs to the end.
        ends[n] = rest.len();
        n += 1;
    }
    let token = |i: usize| {
        let start = if i == 0 { 0 } else { ends[i - 1] + 1 };
        rest.get(start..ends[i])
    };
    // The index of `delivered`: after stream and consumer, and after domain
    // and account hash in the longer form.
    let at = match n {
        7 => 2,
        n if n >= 9 => 4,
        _ => return None,
    };
    let delivered = signed(token(at)?)?;
    // Read (and so checked) like the rest, though unused here: a subject
    // the client refuses is refused here too.
    unsigned(token(at + 1)?)?;
    unsigned(token(at + 2)?)?;
    let stored = nanos(token(at + 3)?)?;
    unsigned(token(at + 4)?)?;
    Some((
        delivered,
        OffsetDateTime::from_unix_timestamp_nanos(stored).ok()?,
    ))
}

/// A `u64` as `str::parse` reads one: an optional `+`, then digits only.
fn unsigned(token: &[u8]) -> Option<u64> {
    let digits = token.strip_prefix(b"+").unwrap_or(token);
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, d| {
        let d = d.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

/// An `i64` as `str::parse` reads one: an optional sign, then digits.
fn signed(token: &[u8]) -> Option<i64> {
    match token.strip_prefix(b"-") {
        Some(digits) if !digits.starts_with(b"+") => {
            let n = unsigned(digits)?;
            // i64::MIN's magnitude is one past i64::MAX.
            0i64.checked_sub_unsigned(n)
        }
        Some(_) => None,
        None => i64::try_from(unsigned(token)?).ok(),
    }
}

/// Nanoseconds since the epoch, as `str::parse::<i128>` reads them. Every
/// store time a server writes fits an `i64` (until 2262); longer numbers
/// take the general parser.
fn nanos(token: &[u8]) -> Option<i128> {
    if let Some(n) = signed(token) {
        return Some(i128::from(n));
    }
    std::str::from_utf8(token).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STORED: &str = "1764770000123456789";

    #[test]
    fn both_forms_are_read() {
        let at = OffsetDateTime::from_unix_timestamp_nanos(STORED.parse().unwrap()).unwrap();
        let short = format!("$JS.ACK.LLM_PREFILL.handoff.3.120.98.{STORED}.7");
        assert_eq!(attempt(short.as_bytes()), Some((3, at)));
        let long = format!("$JS.ACK._.ACCHASH.LLM_PREFILL.handoff.1.120.98.{STORED}.0.r4nd0m");
        assert_eq!(attempt(long.as_bytes()), Some((1, at)));
        // Nine tokens: the long form without its last one.
        let nine = format!("$JS.ACK.dom.hash.S.C.2.1.1.{STORED}.0");
        assert_eq!(attempt(nine.as_bytes()), Some((2, at)));
    }

    #[test]
    fn what_the_client_refuses_is_refused() {
        for bad in [
            "",
            "$JS.ACK.",
            "_INBOX.abc.def",
            "$JS.ACK.S.C.1.2.3.4",
            "$JS.ACK.S.C.1.2.3.4.5.6",
            "$JS.ACK.S.C.x.2.3.4.5",
            "$JS.ACK.S.C.1.-2.3.4.5",
            "$JS.ACK.S.C.1..3.4.5",
            "$JS.ACK.S.C.99999999999999999999.2.3.4.5",
        ] {
            assert_eq!(attempt(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn numbers_are_read_as_str_parse_reads_them() {
        for text in [
            "0",
            "+7",
            "-7",
            "+-7",
            "-+7",
            "--7",
            "",
            "+",
            "-",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-9223372036854775809",
            "18446744073709551615",
            "18446744073709551616",
            "12a",
            " 1",
        ] {
            let bytes = text.as_bytes();
            assert_eq!(unsigned(bytes), text.parse::<u64>().ok(), "u64 {text:?}");
            assert_eq!(signed(bytes), text.parse::<i64>().ok(), "i64 {text:?}");
            assert_eq!(nanos(bytes), text.parse::<i128>().ok(), "i128 {text:?}");
        }
    }

    /// A token of an ack subject, real or broken.
    fn token() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u64..100).prop_map(|n| n.to_string()),
            2 => Just(STORED.to_string()),
            1 => any::<i128>().prop_map(|n| n.to_string()),
            1 => any::<u64>().prop_map(|n| n.to_string()),
            1 => "[-+]?[0-9]{0,3}",
            1 => "[_A-Za-z0-9]{0,6}",
            1 => Just(String::new()),
        ]
    }

    /// What the client's `Message::info` reads from a pulled message whose
    /// reply is `subject`. A JetStream message needs a context, so a client
    /// that never connects (a loopback listener that never answers) makes
    /// one, on a runtime kept for the test binary's life.
    fn client_info(subject: &str) -> Option<(i64, time::OffsetDateTime)> {
        use std::sync::OnceLock;
        static CONTEXT: OnceLock<(tokio::runtime::Runtime, async_nats::jetstream::Context)> =
            OnceLock::new();
        let (_, context) = CONTEXT.get_or_init(|| {
            let runtime = tokio::runtime::Runtime::new().expect("a runtime");
            let context = runtime.block_on(async {
                let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await;
                let silent = silent.expect("a loopback listener");
                let addr = silent.local_addr().expect("its address");
                std::mem::forget(silent);
                let client = async_nats::ConnectOptions::new()
                    .retry_on_initial_connect()
                    .connect(addr.to_string())
                    .await
                    .expect("a client that connects in the background");
                async_nats::jetstream::new(client)
            });
            (runtime, context)
        });
        let message = async_nats::jetstream::Message {
            message: async_nats::Message {
                subject: "prefill.results".into(),
                reply: Some(subject.into()),
                payload: bytes::Bytes::new(),
                headers: None,
                status: None,
                description: None,
                length: 0,
            },
            context: context.clone(),
        };
        let info = message.info().ok()?;
        Some((info.delivered, info.published))
    }

    proptest::proptest! {
        /// The client's own reading of the subject, which this replaces on
        /// every pulled message, gives the same answer for anything.
        #[test]
        fn same_answers_as_the_client(
            prefix in proptest::prop_oneof![
                8 => proptest::strategy::Just("$JS.ACK."),
                1 => proptest::strategy::Just("$JS.ACK"),
                1 => proptest::strategy::Just("_INBOX."),
            ],
            tokens in proptest::collection::vec(token(), 0..14),
        ) {
            let subject = format!("{prefix}{}", tokens.join("."));
            let client = client_info(&subject);
            proptest::prop_assert_eq!(attempt(subject.as_bytes()), client);
        }
    }
}
