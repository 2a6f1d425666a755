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
}

/// A subject pattern split into tokens once, when the policy is made: the
/// check runs for every message, against every own and allowed pattern
/// (tokenizing them each time was about 4% of the worker's CPU in bursts).
#[derive(Debug, Clone)]
struct Pattern(Vec<Token>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(Box<[u8]>),
    /// `*`: any one token.
    One,
    /// A final `>`: one or more tokens.
    Rest,
}

impl Pattern {
    fn new(pattern: &str) -> Pattern {
        Pattern(
            tokens(pattern.as_bytes())
                .map(|t| match t {
                    b"*" => Token::One,
                    b">" => Token::Rest,
                    literal => Token::Literal(literal.into()),
                })
                .collect(),
        )
    }

    /// Whether a subject, already split into tokens, matches: `*` one
    /// token, a final `>` one or more, anything else itself.
    fn matches(&self, subject: &[&[u8]]) -> bool {
        let mut rest = subject;
        for token in &self.0 {
            let Some((first, after)) = rest.split_first() else {
                return false;
            };
            match token {
                Token::Rest => return true,
                Token::One => {}
                Token::Literal(literal) if **literal == **first => {}
                Token::Literal(_) => return false,
            }
            rest = after;
        }
        rest.is_empty()
    }
}

/// Most tokens a reply subject is split into on the stack; longer ones
/// (rare: real inboxes have three) are matched token by token from the
/// string.
const STACK_TOKENS: usize = 16;

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
            if !is_valid_pattern(p) {
                return Err(BadPattern(p.clone()));
            }
        }
        Ok(ReplyPolicy {
            allowed: allowed.iter().map(|p| Pattern::new(p)).collect(),
            own: own.iter().map(|p| Pattern::new(p)).collect(),
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
        // Every token is looked at before refusing: an invalid token is
        // refused as invalid even when another is a wildcard.
        let (mut invalid, mut wildcard) = (false, false);
        let mut split: [&[u8]; STACK_TOKENS] = [&[]; STACK_TOKENS];
        let mut count = 0;
        // Bad bytes in one branch-free pass (the compiler vectorizes it),
        // then the tokens.
        let bytes = subject.as_bytes();
        invalid |= bytes
            .iter()
            .fold(false, |bad, &b| bad | (b <= b' ') | (b == 0x7f));
        for token in tokens(bytes) {
            invalid |= token.is_empty();
            wildcard |= token == b"*" || token == b">";
            if let Some(slot) = split.get_mut(count) {
                *slot = token;
            }
            count += 1;
        }
        if invalid {
            return Err(Refusal::Invalid(shown()));
        }
        if wildcard {
            return Err(Refusal::Wildcard(shown()));
        }
        if subject.starts_with('$') {
            return Err(Refusal::System(shown()));
        }
        let long: Vec<&[u8]>;
        let split = match split.get(..count) {
            Some(split) => split,
            None => {
                long = tokens(subject.as_bytes()).collect();
                &long
            }
        };
        if self.own.iter().any(|p| p.matches(split)) {
            return Err(Refusal::OwnSubject(shown()));
        }
        if self.allowed.iter().any(|p| p.matches(split)) {
            Ok(())
        } else {
            Err(Refusal::NotAllowed(shown()))
        }
    }
}

fn is_valid_pattern(p: &str) -> bool {
    let tokens: Vec<&str> = p.split('.').collect();
    !p.is_empty()
        && tokens.iter().enumerate().all(|(i, t)| {
            !t.is_empty()
                && t.bytes().all(|b| b > b' ' && b != 0x7f)
                && (*t != ">" || i == tokens.len() - 1)
        })
}

/// NATS subject matching: `*` matches one token, a final `>` one or more.
/// The policy's own matcher ([`Pattern`]), for callers off the hot path
/// (configuration checks).
pub fn matches(pattern: &str, subject: &str) -> bool {
    let subject: Vec<&[u8]> = tokens(subject.as_bytes()).collect();
    Pattern::new(pattern).matches(&subject)
}

/// The dot-separated tokens of a subject (`a..b` has an empty one), like
/// `split(|b| *b == b'.')`. Written out because these run several times per
/// message (the reply subject against every own and allowed pattern) and the
/// generic splitter cost ~1,000 instructions of a ~10,000-instruction
/// decision.
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

    #[test]
    fn matching() {
        assert!(matches("a.*.c", "a.b.c"));
        assert!(!matches("a.*.c", "a.b.d"));
        assert!(matches("a.>", "a.b.c"));
        assert!(!matches("a.>", "a"));
        assert!(!matches("a.b", "a.b.c"));
        assert!(matches("a.b", "a.b"));
    }

    /// Subjects and patterns longer than the tokens split on the stack
    /// match as short ones do, directly and through the policy.
    #[test]
    fn long_subjects_and_patterns_match() {
        let long = format!("a{}", ".b".repeat(STACK_TOKENS + 3));
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

    #[test]
    fn bad_patterns_are_refused() {
        assert!(ReplyPolicy::new(&["a..b".to_string()], &[]).is_err());
        assert!(ReplyPolicy::new(&["a.>.b".to_string()], &[]).is_err());
        assert!(ReplyPolicy::new(&[String::new()], &[]).is_err());
    }
}
