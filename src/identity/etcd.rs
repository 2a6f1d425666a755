//! Talking to etcd: the settings every request of the identity needs,
//! requests bounded in time or failing over to another member, and the
//! error they end in. Below every step of the etcd side (claim, session,
//! floor, lease), which all share it.

use super::keepalive::KeepAliveError;
use super::registry::{InstanceRecord, Keys};
use crate::config::{ConfigError, EtcdConfig, redact_urls};
use crate::security::{Section, SecurityError, reason};
use std::future::Future;
use std::time::{Duration, Instant};
use tracing::debug;

/// Why the etcd side of the identity could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// etcd could not be reached, refused or did not answer a request, or
    /// answered one in a way that leaves the claim unusable.
    #[error("{0}")]
    Etcd(EtcdError),
    #[error(
        "all 1021 machine-ID slots under {prefix} are held by live leases; stop a worker or use another namespace"
    )]
    SlotsExhausted { prefix: String },
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The etcd TLS files cannot be used (`etcd.tls.*`).
    #[error(transparent)]
    Security(#[from] SecurityError),
}

/// What went wrong talking to etcd. The client's error, where there is one,
/// is kept as it came (`error`), and written into the message in one line
/// ([`etcd_reason`]); it is not the error's `source`, which `{:#}` would
/// print a second time.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("etcd.endpoints is empty; expected comma-separated URLs such as http://127.0.0.1:2379")]
    NoEndpoints,
    #[error("cannot connect to etcd at {endpoints}: {}", etcd_reason(.error))]
    Connect {
        endpoints: String,
        error: etcd_client::Error,
    },
    #[error("cannot connect to etcd at {endpoints} within {ms} ms")]
    ConnectTimeout { endpoints: String, ms: u128 },
    #[error("TLS to etcd at {endpoints} failed: {why}")]
    Tls { endpoints: String, why: String },
    #[error("{what} failed at etcd {endpoints}: {}", etcd_reason(.error))]
    Request {
        what: String,
        endpoints: String,
        error: etcd_client::Error,
    },
    #[error("{what} failed at etcd {endpoints} ({attempts} tries): {error}")]
    Retried {
        what: String,
        endpoints: String,
        attempts: usize,
        error: etcd_client::Error,
    },
    #[error("{what}: etcd at {endpoints} did not answer within {ms} ms (etcd.request_timeout_ms)")]
    Timeout {
        what: String,
        endpoints: String,
        ms: u64,
    },
    #[error("etcd granted lease {lease} with TTL {ttl}; expected a positive TTL")]
    NonPositiveTtl { lease: String, ttl: i64 },
    #[error("etcd granted lease {lease} with an unusable TTL of {ttl} s")]
    UnusableTtl { lease: String, ttl: i64 },
    #[error("lease {lease} expired while claiming a slot")]
    ExpiredWhileClaiming { lease: String },
    #[error("lease {lease} may have expired while claiming a slot: {error}")]
    MayHaveExpired {
        lease: String,
        error: KeepAliveError,
    },
    #[error("the ID floor {floor} was not written: slot {slot} is no longer held by lease {lease}")]
    FloorNotWritten {
        floor: String,
        slot: String,
        lease: String,
    },
}

impl From<EtcdError> for LeaseError {
    fn from(e: EtcdError) -> LeaseError {
        LeaseError::Etcd(e)
    }
}

/// Everything a claim needs that does not change between recoveries.
pub(super) struct Settings {
    pub etcd: EtcdConfig,
    pub keys: Keys,
    pub ttl_secs: i64,
    /// The instance record; `machine_id` is filled in per claim.
    pub record: InstanceRecord,
}

impl Settings {
    pub(super) fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.etcd.request_timeout_ms.max(1))
    }

    pub(super) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.etcd.connect_timeout_ms.max(1))
    }

    pub(super) fn endpoints(&self) -> Vec<String> {
        self.etcd
            .endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// Runs one etcd request, giving up after `etcd.request_timeout_ms`.
    pub(super) async fn bounded<T>(
        &self,
        what: &str,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, LeaseError> {
        match tokio::time::timeout(self.request_timeout(), request).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(error)) => Err(EtcdError::Request {
                what: what.to_string(),
                endpoints: redact_urls(&self.etcd.endpoints),
                error,
            }
            .into()),
            Err(_) => Err(EtcdError::Timeout {
                what: what.to_string(),
                endpoints: redact_urls(&self.etcd.endpoints),
                ms: self.etcd.request_timeout_ms,
            }
            .into()),
        }
    }
}

impl Settings {
    /// Runs one idempotent etcd request, sent again at once when it fails
    /// while time is left, up to twice per endpoint. The client spreads
    /// requests over every endpoint, so a repeat reaches another member than
    /// the one that is down or lost its leader: failing over takes
    /// milliseconds, not a keepalive period. Bounded as a whole by
    /// `etcd.request_timeout_ms`.
    pub(super) async fn failing_over<T, F, Fut>(
        &self,
        what: &str,
        mut request: F,
    ) -> Result<T, LeaseError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.request_timeout();
        let attempts = self.endpoints().len().max(1) * 2;
        let mut last = None;
        for attempt in 1..=attempts {
            match tokio::time::timeout_at(deadline.into(), request()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => {
                    debug!(what, attempt, error = %e, "etcd request failed; sending it again");
                    last = Some(e);
                }
                Err(_) => break,
            }
        }
        let what = what.to_string();
        let endpoints = self.etcd.endpoints.clone();
        Err(match last {
            Some(error) => EtcdError::Retried {
                what,
                endpoints,
                attempts,
                error,
            },
            None => EtcdError::Timeout {
                what,
                endpoints,
                ms: self.etcd.request_timeout_ms,
            },
        }
        .into())
    }
}

/// An etcd error in one line: the TLS reason when the handshake failed
/// (tonic nests it a few errors deep), else the error's own text.
pub(super) fn etcd_reason(e: &etcd_client::Error) -> String {
    reason::tls_failure(e, Section::Etcd, true)
        .map(|why| format!("TLS handshake failed: {why}"))
        .unwrap_or_else(|| e.to_string().replace('\n', " "))
}
