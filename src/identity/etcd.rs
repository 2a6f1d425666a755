//! Talking to etcd: the settings every request of the identity needs,
//! requests bounded in time or failing over to another member, and the
//! error they end in. Below every step of the etcd side (claim, session,
//! floor, lease), which all share it.

use super::registry::{InstanceRecord, Keys};
use crate::config::{ConfigError, EtcdConfig, redact_urls};
use crate::security::{Section, SecurityError, reason};
use std::future::Future;
use std::time::{Duration, Instant};
use tracing::debug;

/// Why the etcd side of the identity could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("{0}")]
    Etcd(String),
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
            Ok(Err(e)) => Err(LeaseError::Etcd(format!(
                "{what} failed at etcd {}: {}",
                redact_urls(&self.etcd.endpoints),
                etcd_reason(&e)
            ))),
            Err(_) => Err(LeaseError::Etcd(format!(
                "{what}: etcd at {} did not answer within {} ms (etcd.request_timeout_ms)",
                redact_urls(&self.etcd.endpoints),
                self.etcd.request_timeout_ms
            ))),
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
        Err(match last {
            Some(e) => LeaseError::Etcd(format!(
                "{what} failed at etcd {} ({attempts} tries): {e}",
                self.etcd.endpoints
            )),
            None => LeaseError::Etcd(format!(
                "{what}: etcd at {} did not answer within {} ms (etcd.request_timeout_ms)",
                self.etcd.endpoints, self.etcd.request_timeout_ms
            )),
        })
    }
}

/// An etcd error in one line: the TLS reason when the handshake failed
/// (tonic nests it a few errors deep), else the error's own text.
pub(super) fn etcd_reason(e: &etcd_client::Error) -> String {
    reason::tls_failure(e, Section::Etcd, true)
        .map(|why| format!("TLS handshake failed: {why}"))
        .unwrap_or_else(|| e.to_string().replace('\n', " "))
}
