//! What `nats.url` means: server addresses, and credentials written into the
//! URLs (`nats://user:password@host`, `nats://token@host`).
//!
//! Other NATS clients (Go, Python, the `nats` CLI) accept credentials there;
//! async-nats ignores them, so the server answered "authorization violation".
//! They are taken out of the addresses and passed as connect options instead,
//! which also keeps them out of every address async-nats logs (it logs the
//! server address with `Debug` at debug level, password included).
//!
//! async-nats has one set of credentials per connection, so every URL that
//! carries credentials must carry the same ones (URLs without any use them
//! too), and they cannot be combined with `nats.user`/`nats.password`,
//! `nats.token` or `nats.credentials_file`.

use super::ConfigError;
use super::redact::redact_urls;
use async_nats::ServerAddr;
use percent_encoding::percent_decode_str;

/// Credentials found in `nats.url`, percent-decoded as URLs encode them.
#[derive(Clone, PartialEq, Eq)]
pub enum UrlCredentials {
    UserPassword { user: String, password: String },
    Token(String),
}

impl std::fmt::Debug for UrlCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UrlCredentials::UserPassword { user, .. } => f
                .debug_struct("UserPassword")
                .field("user", user)
                .field("password", &"<redacted>")
                .finish(),
            UrlCredentials::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

/// `nats.url` parsed: the addresses without credentials, and the credentials.
#[derive(Debug, Clone)]
pub struct NatsServers {
    pub addrs: Vec<ServerAddr>,
    pub credentials: Option<UrlCredentials>,
}

fn err(why: String) -> ConfigError {
    ConfigError::new(format!("nats.url: {why}"))
}

/// Parses a comma-separated `nats.url`. Errors name `nats.url` and never show
/// a password or token.
pub fn parse(urls: &str) -> Result<NatsServers, ConfigError> {
    let mut addrs = Vec::new();
    let mut credentials: Option<UrlCredentials> = None;
    for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let bad = |reason: String| {
            err(format!(
                "{:?} is not a NATS server URL: {reason}",
                redact_urls(url)
            ))
        };
        let addr: ServerAddr = url
            .parse()
            .map_err(|e: std::io::Error| bad(e.to_string()))?;
        let mut parsed = addr.into_inner();
        let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
        // As the Go client reads them: `user:password@`, or a lone `token@`.
        let found = match (parsed.username(), parsed.password()) {
            ("", None) => None,
            (user, Some(password)) => Some(UrlCredentials::UserPassword {
                user: decode(user),
                password: decode(password),
            }),
            (token, None) => Some(UrlCredentials::Token(decode(token))),
        };
        if let Some(found) = found {
            if credentials.as_ref().is_some_and(|c| *c != found) {
                return Err(err(format!(
                    "{:?} holds credentials that differ from another URL's; a connection has one set of credentials, so write the same ones in every URL (or in nats.user/nats.password or nats.token)",
                    redact_urls(url)
                )));
            }
            credentials = Some(found);
            // Cannot fail for a URL with a host, which every NATS URL has.
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
        }
        addrs.push(ServerAddr::from_url(parsed).map_err(|e| bad(e.to_string()))?);
    }
    if addrs.is_empty() {
        return Err(err(
            "empty; expected one or more comma-separated NATS server URLs, e.g. nats://127.0.0.1:4222".into(),
        ));
    }
    Ok(NatsServers { addrs, credentials })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(user: &str, password: &str) -> Option<UrlCredentials> {
        Some(UrlCredentials::UserPassword {
            user: user.into(),
            password: password.into(),
        })
    }

    #[test]
    fn table() {
        // (nats.url, addresses as async-nats gets them, credentials; None: refused)
        type Row = (
            &'static str,
            Option<(Vec<&'static str>, Option<UrlCredentials>)>,
        );
        let rows: Vec<Row> = vec![
            (
                "nats://127.0.0.1:4222",
                Some((vec!["nats://127.0.0.1:4222"], None)),
            ),
            (
                "127.0.0.1:4222",
                Some((vec!["nats://127.0.0.1:4222"], None)),
            ),
            (
                "nats://a:4222, nats://b:4223,,",
                Some((vec!["nats://a:4222", "nats://b:4223"], None)),
            ),
            (
                "nats://u:pw@h:4222",
                Some((vec!["nats://h:4222"], up("u", "pw"))),
            ),
            (
                "nats://tok@h:4222",
                Some((
                    vec!["nats://h:4222"],
                    Some(UrlCredentials::Token("tok".into())),
                )),
            ),
            (
                "nats://u%40x:p%3Aw%2C@h:1",
                Some((vec!["nats://h:1"], up("u@x", "p:w,"))),
            ),
            (
                "tls://u:pw@h:4222",
                Some((vec!["tls://h:4222"], up("u", "pw"))),
            ),
            (
                "nats://u:pw@a:1,nats://u:pw@b:2",
                Some((vec!["nats://a:1", "nats://b:2"], up("u", "pw"))),
            ),
            (
                "nats://u:pw@a:1,nats://b:2",
                Some((vec!["nats://a:1", "nats://b:2"], up("u", "pw"))),
            ),
            ("nats://u:pw@a:1,nats://u:other@b:2", None),
            ("nats://u:pw@a:1,nats://tok@b:2", None),
            ("", None),
            (" , ", None),
            ("nats://a:notaport", None),
            ("http://a:4222", None),
        ];
        for (url, want) in rows {
            let got = parse(url).ok().map(|s| {
                let addrs: Vec<String> =
                    s.addrs.iter().map(|a| a.as_url_str().to_string()).collect();
                (addrs, s.credentials)
            });
            let want = want.map(|(a, c)| (a.into_iter().map(String::from).collect::<Vec<_>>(), c));
            assert_eq!(got, want, "{url}");
        }
    }

    #[test]
    fn errors_name_the_key_and_never_show_the_secret() {
        for url in [
            "nats://u:secret@a:1,nats://u:other@b:2",
            "nats://u:secret@a:notaport",
            "nats://secret@a:1,nats://u:p@b:2",
        ] {
            let e = parse(url).unwrap_err().to_string();
            assert!(e.starts_with("nats.url: "), "{e}");
            assert!(!e.contains("secret"), "{e}");
        }
        let shown = format!("{:?}", parse("nats://u:secret@a:1").unwrap());
        assert!(!shown.contains("secret"), "{shown}");
    }
}
