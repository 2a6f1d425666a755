//! NATS subject syntax, for the configuration's subjects and for the reply
//! policy's patterns (`crate::decision::reply`), which share these rules.

/// A token of a NATS subject: non-empty, no whitespace or control characters.
pub fn is_token(t: &str) -> bool {
    !t.is_empty() && t.bytes().all(|b| b > b' ' && b != 0x7f)
}

/// A subject one can subscribe to: `*` for one token, a final `>` for the rest.
pub fn is_pattern(s: &str) -> bool {
    let tokens: Vec<&str> = s.split('.').collect();
    tokens
        .iter()
        .enumerate()
        .all(|(i, t)| is_token(t) && (*t != ">" || i + 1 == tokens.len()))
}

/// A subject one can publish to: a pattern without wildcards.
pub fn is_literal(s: &str) -> bool {
    is_pattern(s) && s.split('.').all(|t| t != "*" && t != ">")
}

/// NATS subject matching: `*` matches one token, a final `>` one or more.
/// Plain and slow: for configuration checks, and the reference the reply
/// policy's compiled matcher is tested against.
pub fn matches(pattern: &str, subject: &str) -> bool {
    let mut rest = subject.split('.');
    for token in pattern.split('.') {
        let Some(got) = rest.next() else {
            return false;
        };
        match token {
            ">" => return true,
            "*" => {}
            literal if literal == got => {}
            _ => return false,
        }
    }
    rest.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_and_matching() {
        assert!(is_pattern("a.*.>") && !is_pattern("a.>.b") && !is_pattern("a..b"));
        assert!(is_literal("a.b") && !is_literal("a.*") && !is_literal(""));
        let rows = [
            ("a.*.c", "a.b.c", true),
            ("a.*.c", "a.b.d", false),
            ("a.>", "a.b.c", true),
            ("a.>", "a", false),
            ("a.b", "a.b.c", false),
            ("a.b", "a.b", true),
            ("a.b.c", "a.b", false),
        ];
        for (pattern, subject, want) in rows {
            assert_eq!(matches(pattern, subject), want, "{pattern} {subject}");
        }
    }
}
