//! Which reply subjects the worker will publish to.
//!
//! A prefill result names its own reply subject, so a crafted one could make
//! the worker publish into the JetStream API, the system account, a KV bucket
//! or its own pipeline. A reply subject is accepted only when it is a literal
//! subject (no wildcards, no empty tokens, no whitespace), does not start with
//! `$`, does not match any of the worker's own subjects, and matches one of
//! the allowed patterns.

use thiserror::Error;

/// Longest reply subject accepted, in bytes. Real inboxes are under 64.
pub const MAX_REPLY_SUBJECT_BYTES: usize = 512;

#[derive(Debug, Clone)]
pub struct ReplyPolicy {
    allowed: Vec<Pattern>,
    own: Vec<Pattern>,
    /// The lengths a subject matching an own pattern may have, one bit
    /// each up to [`MAX_REPLY_SUBJECT_BYTES`]: a literal pattern's length,
    /// or every length once a pattern has a wildcard. A subject of another
    /// length is compared with none of them (the worker's own subjects are
    /// literal, and a reply subject is rarely as long as one).
    own_lengths: [u64; LENGTH_WORDS],
}

const LENGTH_WORDS: usize = MAX_REPLY_SUBJECT_BYTES / 64 + 1;

/// A subject pattern split into tokens once, when the policy is made: the
/// check runs for every message, against every own and allowed pattern
/// (`docs/performance.md`, "Figures behind choices in the code").
#[derive(Debug, Clone)]
struct Pattern {
    tokens: Vec<Token>,
    /// The whole pattern when it has no wildcard (every own subject, as a
    /// rule): it matches a valid subject exactly when the bytes are equal,
    /// and a subject of another length is refused without reading it (own
    /// subjects share the namespace's first token with its reply subjects,
    /// so token by token each cost two compares).
    exact: Option<Box<[u8]>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(Literal),
    /// `*`: any one token.
    One,
    /// A final `>`: one or more tokens.
    Rest,
}

/// A literal token, with its first (up to) 8 bytes as a little-endian word
/// and the mask of the bytes that word holds: a subject with 8 bytes left is
/// compared with a token of up to 8 in one load, not a `memcmp` call (seven
/// per message, against the default own and allowed patterns).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Literal {
    bytes: Box<[u8]>,
    word: u64,
    mask: u64,
}

impl Literal {
    fn new(bytes: &[u8]) -> Literal {
        let mut head = [0u8; 8];
        let n = bytes.len().min(8);
        head[..n].copy_from_slice(&bytes[..n]);
        Literal {
            bytes: bytes.into(),
            word: u64::from_le_bytes(head),
            mask: if n == 8 {
                u64::MAX
            } else {
                (1u64 << (8 * n)) - 1
            },
        }
    }

    /// Whether `rest` starts with this token followed by a dot or its end;
    /// what follows the dot (`Some`), or `None` at the end. `Err` when it
    /// does not.
    #[inline]
    fn strip<'s>(&self, rest: &'s [u8]) -> Result<Option<&'s [u8]>, ()> {
        let n = self.bytes.len();
        let after = match rest.get(n) {
            None if rest.len() == n => None,
            Some(b'.') => Some(&rest[n + 1..]),
            _ => return Err(()),
        };
        let same = match rest.first_chunk::<8>() {
            Some(head) if n <= 8 => (u64::from_le_bytes(*head) ^ self.word) & self.mask == 0,
            _ => rest[..n] == *self.bytes,
        };
        if same { Ok(after) } else { Err(()) }
    }
}

impl Pattern {
    fn new(pattern: &str) -> Pattern {
        let tokens: Vec<Token> = tokens(pattern.as_bytes())
            .map(|t| match t {
                b"*" => Token::One,
                b">" => Token::Rest,
                literal => Token::Literal(Literal::new(literal)),
            })
            .collect();
        let literal = tokens.iter().all(|t| matches!(t, Token::Literal(_)));
        Pattern {
            exact: literal.then(|| pattern.as_bytes().into()),
            tokens,
        }
    }

    /// Whether a valid literal subject (no empty token: [`ReplyPolicy::check`]
    /// has refused those) matches: `*` one token, a final `>` one or more,
    /// anything else itself. Read from the subject's bytes, without
    /// splitting it first.
    #[inline(always)]
    fn matches(&self, subject: &[u8]) -> bool {
        if let Some(exact) = &self.exact {
            return subject == &**exact;
        }
        // What is left of the subject, from the start of a token; `None`
        // once every token is used.
        let mut rest = Some(subject);
        for token in &self.tokens {
            let Some(now) = rest else {
                return false;
            };
            rest = match token {
                Token::Rest => return true,
                Token::One => memchr::memchr(b'.', now).map(|dot| &now[dot + 1..]),
                Token::Literal(literal) => match literal.strip(now) {
                    Ok(after) => after,
                    Err(()) => return false,
                },
            };
        }
        rest.is_none()
    }
}

/// Why a reply subject was refused. The text is a sentence for the
/// dead letter's `Handoff-Error` header.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("the reply subject is empty")]
    Empty,
    #[error("the reply subject is {0} bytes long; at most 512 are accepted")]
    TooLong(usize),
    #[error(
        "the reply subject {0:?} is not a valid NATS subject (empty token, whitespace or control character)"
    )]
    Invalid(String),
    #[error(
        "the reply subject {0:?} contains a wildcard; a reply subject must be a literal subject"
    )]
    Wildcard(String),
    #[error("the reply subject {0:?} is a system subject ($...); the worker never publishes there")]
    System(String),
    #[error("the reply subject {0:?} is one of the worker's own subjects")]
    OwnSubject(String),
    #[error("the reply subject {0:?} matches none of the allowed reply patterns")]
    NotAllowed(String),
}

#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("allowed reply pattern {0:?} is not a valid NATS subject pattern")]
pub struct BadPattern(pub String);

impl ReplyPolicy {
    /// `allowed`: the patterns replies may match (e.g. `_INBOX.>`);
    /// `own`: the worker's own subjects (prefill, GEN, dead letter, ids),
    /// wildcards allowed.
    pub fn new(allowed: &[String], own: &[String]) -> Result<ReplyPolicy, BadPattern> {
        for p in allowed.iter().chain(own) {
            if !crate::config::subject::is_pattern(p) {
                return Err(BadPattern(p.clone()));
            }
        }
        let own: Vec<Pattern> = own.iter().map(|p| Pattern::new(p)).collect();
        let mut own_lengths = [0u64; LENGTH_WORDS];
        for pattern in &own {
            match &pattern.exact {
                Some(exact) if exact.len() <= MAX_REPLY_SUBJECT_BYTES => {
                    own_lengths[exact.len() / 64] |= 1 << (exact.len() % 64);
                }
                // Too long to be a reply subject: never matched.
                Some(_) => {}
                None => own_lengths = [u64::MAX; LENGTH_WORDS],
            }
        }
        Ok(ReplyPolicy {
            allowed: allowed.iter().map(|p| Pattern::new(p)).collect(),
            own,
            own_lengths,
        })
    }

    pub fn check(&self, subject: &str) -> Result<(), Refusal> {
        if subject.is_empty() {
            return Err(Refusal::Empty);
        }
        if subject.len() > MAX_REPLY_SUBJECT_BYTES {
            return Err(Refusal::TooLong(subject.len()));
        }
        let shown = || subject.to_string();
        let bytes = subject.as_bytes();
        // One pass over the bytes, eight at a time: whitespace and control
        // bytes, wildcard bytes, and a dot after a dot (an empty token
        // inside). Every token is looked at before refusing: an invalid
        // token is refused as invalid even when another is a wildcard.
        // One fold for every flag: the compiler vectorizes only the first of
        // separate folds.
        let Scan {
            bad,
            wild,
            double_dot,
        } = scan(bytes);
        let edge_dot = bytes.first() == Some(&b'.') || bytes.last() == Some(&b'.');
        if bad || double_dot || edge_dot {
            return Err(Refusal::Invalid(shown()));
        }
        // A wildcard byte is a wildcard only as a whole token (`a.*`, not
        // `a*b`); rare, so only then split.
        if wild && tokens(bytes).any(|t| t == b"*" || t == b">") {
            return Err(Refusal::Wildcard(shown()));
        }
        if subject.starts_with('$') {
            return Err(Refusal::System(shown()));
        }
        let n = bytes.len();
        let may_be_own = self.own_lengths[n / 64] & (1 << (n % 64)) != 0;
        if may_be_own && self.own.iter().any(|p| p.matches(bytes)) {
            return Err(Refusal::OwnSubject(shown()));
        }
        if self.allowed.iter().any(|p| p.matches(bytes)) {
            Ok(())
        } else {
            Err(Refusal::NotAllowed(shown()))
        }
    }
}

/// What [`scan`] found in a subject.
struct Scan {
    /// A byte at or below a space, or DEL.
    bad: bool,
    /// A `*` or `>` byte, whether or not it is a whole token.
    wild: bool,
    /// Two dots in a row.
    double_dot: bool,
}

/// [`Scan`] of `bytes`, eight bytes a word. A byte's flag is its high bit
/// in a word, set exactly when the byte is one sought ([`bytes_equal`],
/// [`bytes_below`]: exact per byte, no carries between bytes).
fn scan(bytes: &[u8]) -> Scan {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let (mut bad, mut wild, mut double_dot) = (0u64, 0u64, 0u64);
    let mut look = |w: u64, carried: u64| {
        bad |= bytes_below(w, b'!') | bytes_equal(w, 0x7f * ONES);
        wild |= bytes_equal(w, u64::from(b'*') * ONES) | bytes_equal(w, u64::from(b'>') * ONES);
        let dots = bytes_equal(w, u64::from(b'.') * ONES);
        double_dot |= dots & ((dots << 8) | carried);
        // This word's last dot, in the first byte's place for the next.
        dots >> 56
    };
    let (words, tail) = bytes.as_chunks::<8>();
    let mut carried = 0;
    for word in words {
        carried = look(u64::from_le_bytes(*word), carried);
    }
    if !tail.is_empty() {
        match bytes.last_chunk::<8>() {
            // The last eight bytes, overlapping words already looked at:
            // the pair across the boundary is inside it.
            Some(last) => look(u64::from_le_bytes(*last), 0),
            None => {
                // Under eight bytes: padded with `a`, which is none of them.
                let mut word = [b'a'; 8];
                for (to, from) in word.iter_mut().zip(tail) {
                    *to = *from;
                }
                look(u64::from_le_bytes(word), 0)
            }
        };
    }
    Scan {
        bad: bad != 0,
        wild: wild != 0,
        double_dot: double_dot != 0,
    }
}

/// The high bit of each byte of `w` equal to that byte of `pattern`.
#[inline(always)]
fn bytes_equal(w: u64, pattern: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let x = w ^ pattern;
    !(((x & LOW7) + LOW7) | x | LOW7)
}

/// The high bit of each byte of `w` below `n` (at most 0x80).
#[inline(always)]
fn bytes_below(w: u64, n: u8) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const ONES: u64 = 0x0101_0101_0101_0101;
    // The high bit is set in a byte whose low seven bits are `n` or more,
    // then cleared in the answer for those and for bytes of 0x80 or more.
    let at_least = (w & LOW7) + (0x80 - u64::from(n)) * ONES;
    !(at_least | w) & !LOW7
}

/// [`Pattern::matches`] for any subject, split into tokens first (empty
/// ones too): the reference the policy's own matcher is tested against.
#[cfg(test)]
fn matches_split(pattern: &Pattern, subject: &[&[u8]]) -> bool {
    let mut rest = subject;
    for token in &pattern.tokens {
        let Some((first, after)) = rest.split_first() else {
            return false;
        };
        match token {
            Token::Rest => return true,
            Token::One => {}
            Token::Literal(literal) if *literal.bytes == **first => {}
            Token::Literal(_) => return false,
        }
        rest = after;
    }
    rest.is_empty()
}

/// The dot-separated tokens of a subject (`a..b` has an empty one), like
/// `split(|b| *b == b'.')`. Written out because these run several times per
/// message (the reply subject against every own and allowed pattern), where
/// the generic splitter's overhead was a tenth of a whole result's work.
fn tokens(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(bytes);
    std::iter::from_fn(move || {
        let now = rest?;
        match now.iter().position(|b| *b == b'.') {
            Some(dot) => {
                rest = Some(&now[dot + 1..]);
                Some(&now[..dot])
            }
            None => {
                rest = None;
                Some(now)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::subject::matches;

    fn policy() -> ReplyPolicy {
        let allowed = ["_INBOX.>".to_string(), "llm.replies.>".to_string()];
        let own = [
            "llm.prefill.results".to_string(),
            "llm.gen.jobs".to_string(),
            "llm.handoff.dead".to_string(),
            "llm.handoff.ids".to_string(),
        ];
        ReplyPolicy::new(&allowed, &own).unwrap()
    }

    #[test]
    fn table() {
        let p = policy();
        let cases: &[(&str, bool)] = &[
            ("_INBOX.abc", true),
            ("_INBOX.abc.def", true),
            ("llm.replies.client-7", true),
            ("_INBOX", false),
            ("llm.replies", false),
            ("$JS.API.STREAM.DELETE.X", false),
            ("$SYS.REQ.SERVER.PING", false),
            ("$KV.bucket.key", false),
            ("_INBOX.*", false),
            ("_INBOX.>", false),
            (">", false),
            ("*", false),
            ("llm.gen.jobs", false),
            ("llm.prefill.results", false),
            ("_INBOX..x", false),
            ("_INBOX.a b", false),
            ("_INBOX.a\r\nPUB x", false),
            ("", false),
            ("other.subject", false),
        ];
        for (subject, ok) in cases {
            assert_eq!(p.check(subject).is_ok(), *ok, "{subject:?}");
        }
        assert!(p.check(&format!("_INBOX.{}", "a".repeat(600))).is_err());
    }

    #[test]
    fn own_subjects_win_over_broad_allow_patterns() {
        let p = ReplyPolicy::new(&[">".to_string()], &["llm.gen.jobs".to_string()]).unwrap();
        assert_eq!(
            p.check("llm.gen.jobs"),
            Err(Refusal::OwnSubject("llm.gen.jobs".into()))
        );
        assert!(p.check("$JS.API.INFO").is_err());
        assert!(p.check("anything.else").is_ok());
    }

    /// Own subjects of every length up to the longest reply subject are
    /// refused, literal ones found through their length.
    #[test]
    fn own_subjects_are_refused_at_every_length() {
        for n in [1, 2, 63, 64, 65, 127, 128, 511, 512] {
            let own = "o".repeat(n);
            let others = [
                vec![],
                vec!["a.b".to_string()],
                vec!["x.*".to_string(), "y.>".to_string()],
            ];
            for more in others {
                let mut set = vec![own.clone()];
                set.extend(more.iter().cloned());
                let p = ReplyPolicy::new(&[">".to_string()], &set).unwrap();
                assert_eq!(
                    p.check(&own),
                    Err(Refusal::OwnSubject(own.clone())),
                    "{n} {more:?}"
                );
                assert!(p.check(&"p".repeat(n)).is_ok(), "{n} {more:?}");
                if n < 512 {
                    assert!(p.check(&"o".repeat(n + 1)).is_ok(), "{n} {more:?}");
                }
                let wild = !more.is_empty() && more[0] == "x.*";
                assert_eq!(p.check("x.q").is_err(), wild, "{n} {more:?}");
            }
        }
        // An own subject too long to be a reply subject is never one.
        let p = ReplyPolicy::new(&[">".to_string()], &["o".repeat(600)]).unwrap();
        assert!(p.check("o").is_ok());
    }

    #[test]
    fn matching() {
        assert!(matches("a.*.c", "a.b.c"));
        assert!(!matches("a.*.c", "a.b.d"));
        assert!(matches("a.>", "a.b.c"));
        assert!(!matches("a.>", "a"));
        assert!(!matches("a.b", "a.b.c"));
        assert!(matches("a.b", "a.b"));
    }

    /// Long subjects and patterns (more tokens than real inboxes have)
    /// match as short ones do, directly and through the policy.
    #[test]
    fn long_subjects_and_patterns_match() {
        let long = format!("a{}", ".b".repeat(19));
        let cases: &[(&str, &str, bool)] = &[
            ("a.>", &long, true),
            (&long, &long, true),
            ("*.b.>", &long, true),
            ("a.*", &long, false),
            ("a.b.b", &long, false),
            (&long, "a.b", false),
            ("*.b.>", "a.b.c", true),
            ("*.b.>", "a.b", false),
            ("b.>", "a.b", false),
        ];
        for (pattern, subject, want) in cases {
            assert_eq!(
                matches(pattern, subject),
                *want,
                "{pattern:?} against {subject:?}"
            );
        }
        let p = ReplyPolicy::new(&["a.>".to_string()], std::slice::from_ref(&long)).unwrap();
        assert_eq!(p.check(&long), Err(Refusal::OwnSubject(long.clone())));
        assert!(p.check(&format!("{long}.c")).is_ok());
        assert!(p.check(&format!("x{long}")).is_err());
    }

    #[test]
    fn tokens_split_as_the_standard_splitter_does() {
        for s in ["", ".", "a", "a.b", "a..b", ".a", "a.", "_INBOX.x.y.z"] {
            let want: Vec<&[u8]> = s.as_bytes().split(|b| *b == b'.').collect();
            assert_eq!(tokens(s.as_bytes()).collect::<Vec<_>>(), want, "{s:?}");
        }
    }

    /// The check as it was written before it read the subject's bytes in
    /// place: split into tokens, each looked at, then matched token by token.
    fn reference_check(policy: &ReplyPolicy, subject: &str) -> Result<(), Refusal> {
        if subject.is_empty() {
            return Err(Refusal::Empty);
        }
        if subject.len() > MAX_REPLY_SUBJECT_BYTES {
            return Err(Refusal::TooLong(subject.len()));
        }
        let shown = || subject.to_string();
        let split: Vec<&[u8]> = tokens(subject.as_bytes()).collect();
        let bad = |t: &[u8]| t.is_empty() || t.iter().any(|b| *b <= b' ' || *b == 0x7f);
        if split.iter().any(|t| bad(t)) {
            return Err(Refusal::Invalid(shown()));
        }
        if split.iter().any(|t| *t == b"*" || *t == b">") {
            return Err(Refusal::Wildcard(shown()));
        }
        if subject.starts_with('$') {
            return Err(Refusal::System(shown()));
        }
        if policy.own.iter().any(|p| matches_split(p, &split)) {
            return Err(Refusal::OwnSubject(shown()));
        }
        if policy.allowed.iter().any(|p| matches_split(p, &split)) {
            Ok(())
        } else {
            Err(Refusal::NotAllowed(shown()))
        }
    }

    proptest::proptest! {
        /// The in-place check refuses exactly what the split one refused,
        /// for the same reason, on subjects made of the bytes and tokens
        /// that matter (dots, wildcards, whitespace, `$`, tokens of 7 to 9
        /// bytes around the one-word compare and tokens one byte off them)
        /// against patterns with every kind of token.
        #[test]
        fn the_check_is_the_split_reference(
            pieces in proptest::collection::vec(
                proptest::sample::select(vec![
                    "", ".", "*", ">", " ", "a b", "\r", "\x7f", "$", "$JS", "a", "b",
                    "_INBOX", "abcdefg", "abcdefgh", "abcdefghi", "llm", "replies", "gen",
                    "jobs", "x*y", "é",
                    // One byte off the names above, first or last.
                    "abcdefh", "abcdefgi", "bbcdefgh", "abcdefghj", "_INBOY", "lln", "xlm",
                ]),
                1..7,
            ),
        ) {
            // Tokens joined by dots: an empty or "." piece makes an empty token.
            let subject = pieces.join(".");
            let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            let policies = [
                policy(),
                ReplyPolicy::new(
                    &strings(&["_INBOX.>", "*.abcdefgh.>", "a.*.b", "abcdefghi.*", "a"]),
                    &strings(&["*.gen.>", "abcdefg.abcdefgh", "_INBOX.a.*"]),
                )
                .unwrap(),
                ReplyPolicy::new(&strings(&[">"]), &strings(&["llm.>", "*"])).unwrap(),
            ];
            for p in &policies {
                proptest::prop_assert_eq!(p.check(&subject), reference_check(p, &subject), "{:?}", subject);
            }
        }
    }

    /// Each kind of byte the word-at-a-time scan looks for is found at
    /// every position of subjects of every length up to three words: in a
    /// word, across the boundary between two, and in the tail.
    #[test]
    fn the_scan_finds_each_byte_at_every_position() {
        let flags = |b: &[u8]| {
            let found = scan(b);
            (found.bad, found.wild, found.double_dot)
        };
        for len in 1..=24 {
            for at in 0..len {
                let with = |piece: &[u8]| {
                    let mut subject = vec![b'a'; len];
                    let end = (at + piece.len()).min(len);
                    subject[at..end].copy_from_slice(&piece[..end - at]);
                    subject
                };
                assert_eq!(flags(&with(b"")), (false, false, false));
                for bad in [0u8, b'\t', b'\r', b' ', 0x7f] {
                    let found = flags(&with(&[bad]));
                    assert_eq!(found, (true, false, false), "{bad:#x} at {at} of {len}");
                }
                for fine in [b'!', b'~', 0x80, 0xff, b'.'] {
                    let found = flags(&with(&[fine]));
                    assert_eq!(found, (false, false, false), "{fine:#x} at {at} of {len}");
                }
                assert_eq!(
                    flags(&with(b"*")),
                    (false, true, false),
                    "* at {at} of {len}"
                );
                assert_eq!(
                    flags(&with(b">")),
                    (false, true, false),
                    "> at {at} of {len}"
                );
                if at + 1 < len {
                    let found = flags(&with(b".."));
                    assert_eq!(found, (false, false, true), ".. at {at} of {len}");
                    let found = flags(&with(b".a."));
                    assert_eq!(found, (false, false, false), ".a. at {at} of {len}");
                }
            }
        }
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert!(ReplyPolicy::new(&["a..b".to_string()], &[]).is_err());
        assert!(ReplyPolicy::new(&["a.>.b".to_string()], &[]).is_err());
        assert!(ReplyPolicy::new(&[String::new()], &[]).is_err());
    }
}
