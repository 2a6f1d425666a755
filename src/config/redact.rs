//! Secrets never reach a log line or an error message: `Debug` of the NATS and
//! etcd sections hides passwords, tokens and credentials inside URLs.

use super::{EtcdConfig, NatsConfig};
use std::fmt;

const HIDDEN: &str = "<redacted>";

fn hidden(secret: &Option<String>) -> Option<&'static str> {
    secret.as_ref().map(|_| HIDDEN)
}

/// A comma-separated URL list with the password (or a lone token) of every
/// `scheme://user:password@host` removed.
pub fn redact_urls(list: &str) -> String {
    list.split(',')
        .map(redact_url)
        .collect::<Vec<_>>()
        .join(",")
}

fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    let user = match rest[..at].split_once(':') {
        Some((user, _)) => format!("{user}:{HIDDEN}"),
        // A lone value before '@' is a token.
        None => HIDDEN.to_string(),
    };
    format!("{scheme}{user}{}", &rest[at..])
}

impl fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsConfig")
            .field("url", &redact_urls(&self.url))
            .field("user", &self.user)
            .field("password", &hidden(&self.password))
            .field("token", &hidden(&self.token))
            .field("credentials_file", &self.credentials_file)
            .field("name", &self.name)
            .field("subscription_capacity", &self.subscription_capacity)
            .field("connect_timeout_secs", &self.connect_timeout_secs)
            .field("ping_interval_secs", &self.ping_interval_secs)
            .field("nkey_seed_file", &self.nkey_seed_file)
            .field("tls", &self.tls)
            .finish()
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &redact_urls(&self.endpoints))
            .field("user", &self.user)
            .field("password", &hidden(&self.password))
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("tls", &self.tls)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let cases = [
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
            ("nats://u:pw@h:4222", "nats://u:<redacted>@h:4222"),
            ("nats://tok@h:4222", "nats://<redacted>@h:4222"),
            ("u:p@w@h:4222/x@y", "u:<redacted>@h:4222/x@y"),
            (
                "nats://a:b@h1,nats://h2",
                "nats://a:<redacted>@h1,nats://h2",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(redact_urls(input), want, "{input}");
        }
    }
}
