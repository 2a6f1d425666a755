//! One lease's keepalive: a request/answer round trip on etcd's keepalive
//! stream, and the validity it proves.
//!
//! The lease is valid until *the instant the request was sent* plus the TTL
//! the server answered: the server restarts its countdown when it receives
//! the request, which is later, so this never overestimates.

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use std::time::{Duration, Instant};
use tracing::debug;

/// How many streams one keepalive may open when they fail fast: two per
/// member of a 3-member cluster.
const FAILOVER_TRIES: u32 = 6;

/// Why a keepalive round trip proved nothing; the caller tries again.
#[derive(Debug, thiserror::Error)]
pub enum KeepAliveError {
    #[error("cannot open the keepalive stream: {0}")]
    Open(#[source] etcd_client::Error),
    #[error("cannot send the keepalive: {0}")]
    Send(#[source] etcd_client::Error),
    #[error("keepalive failed: {0}")]
    Answer(#[source] etcd_client::Error),
    #[error("etcd closed the keepalive stream")]
    Closed,
    #[error("etcd did not answer the keepalive in time")]
    TimedOut,
    #[error("etcd answered an unusable TTL of {0} s")]
    UnusableTtl(i64),
}

/// What one keepalive round trip proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Beat {
    /// The lease lives at least until this instant.
    Alive { valid_until: Instant },
    /// The server answered TTL 0: the lease expired or was revoked.
    Gone,
}

pub(super) struct KeepAlive {
    client: Client,
    lease_id: i64,
    /// The open keepalive stream; reopened after any failure so an answer
    /// to an abandoned request can never be taken for a fresh one.
    channel: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
}

impl KeepAlive {
    pub(super) fn new(client: Client, lease_id: i64) -> KeepAlive {
        KeepAlive {
            client,
            lease_id,
            channel: None,
        }
    }

    /// One round trip, abandoned at `deadline`. `Err` means etcd gave no
    /// answer (unreachable, timed out, stream closed): the caller retries.
    ///
    /// A stream that fails fast (its member died: "channel closed",
    /// "connection refused") is reopened and the keepalive sent again at
    /// once, up to [`FAILOVER_TRIES`] times before `deadline`: the client
    /// opens the new stream on another endpoint, so losing the member the
    /// stream ran on costs milliseconds, not a keepalive period.
    pub(super) async fn beat(&mut self, deadline: Instant) -> Result<Beat, KeepAliveError> {
        let mut tries = 0;
        loop {
            tries += 1;
            let sent = Instant::now();
            return match tokio::time::timeout_at(deadline.into(), self.round_trip()).await {
                Ok(Ok(ttl)) if ttl > 0 => sent
                    .checked_add(Duration::from_secs(ttl.unsigned_abs()))
                    .map(|valid_until| Beat::Alive { valid_until })
                    .ok_or(KeepAliveError::UnusableTtl(ttl)),
                Ok(Ok(_)) => Ok(Beat::Gone),
                Ok(Err(e)) => {
                    self.channel = None;
                    if tries < FAILOVER_TRIES && Instant::now() < deadline {
                        debug!(error = %e, tries, "keepalive stream failed; reopening it at once");
                        continue;
                    }
                    Err(e)
                }
                Err(_) => {
                    self.channel = None;
                    Err(KeepAliveError::TimedOut)
                }
            };
        }
    }

    async fn round_trip(&mut self) -> Result<i64, KeepAliveError> {
        let (keeper, stream) = match &mut self.channel {
            Some(channel) => channel,
            None => {
                let opened = self
                    .client
                    .lease_keep_alive(self.lease_id)
                    .await
                    .map_err(KeepAliveError::Open)?;
                self.channel.insert(opened)
            }
        };
        keeper.keep_alive().await.map_err(KeepAliveError::Send)?;
        match stream.message().await {
            Ok(Some(answer)) => Ok(answer.ttl()),
            Ok(None) => Err(KeepAliveError::Closed),
            Err(e) => Err(KeepAliveError::Answer(e)),
        }
    }
}
