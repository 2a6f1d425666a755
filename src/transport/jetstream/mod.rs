//! JetStream delivery mode (contract 7): a work-queue stream over the prefill
//! subjects, one durable pull consumer shared by all workers, and an ack only
//! after the message's output is published (and stored, when GEN is a stream).
//! A worker killed mid-flight loses nothing: the server redelivers what it
//! never acked, and `Nats-Msg-Id` makes the GEN stream drop a repeated job.
//!
//! The data's path: [`consume`] pulls → [`handle`] decides and publishes →
//! [`settle`] says ack, term or nak.
//!
//! - [`setup`]: the streams and the consumer, created or checked idempotently.
//! - [`consume`]: the pull loop, bounded by free processing slots; survives
//!   server restarts.
//! - [`handle`]: one message: decide, publish, settle.
//! - [`publish`]: outputs known to have reached the server (stream ack, or
//!   a confirmed core publish).
//! - [`confirm`]: one server round trip confirms every core publish enqueued
//!   before it, shared by the handlers.
//! - [`settle`]: the pure rules for ack, term, and nak with backoff.
//! - [`sweep`]: removes acked messages a restarted old server kept.

pub mod confirm;
pub mod consume;
pub mod handle;
pub mod publish;
pub mod settle;
pub mod setup;
pub mod sweep;

use crate::config::{Config, ConfigError};
use crate::identity::Identity;
use crate::metrics::{Metrics, Readiness};
use async_nats::Client;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// What can go wrong talking to JetStream.
#[derive(Debug, thiserror::Error)]
pub enum JetStreamError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A JetStream API request failed (server unreachable, permission, ...).
    #[error("JetStream: {0}")]
    Api(String),
    /// A stream or consumer exists with settings that cannot be changed in place.
    #[error("{0}")]
    Incompatible(String),
    /// The stream or consumer does not exist and may not be created.
    #[error("{0}")]
    Missing(String),
}

/// Runs the durable mode until `shutdown` completes: opens (with
/// `jetstream.create`: creates) the consumer, pulls, handles, and on shutdown
/// finishes in-flight messages within `shutdown_timeout_secs`. `readiness`,
/// when given, is marked consuming while messages are pulled.
///
/// Fails at start when the stream or consumer is missing (and may not be
/// created) or incompatible; an unreachable server is waited for. Later
/// failures (server restarts, a deleted consumer) are retried until shutdown.
pub async fn serve(
    client: Client,
    config: &Config,
    identity: Identity,
    metrics: Metrics,
    readiness: Option<Readiness>,
    telemetry: Option<crate::telemetry::Telemetry>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), JetStreamError> {
    // The NATS reply subject of a JetStream message is its ack subject: the
    // reply subject comes from `reply_to` only, whatever `mode` says.
    let mut rules = config.rules()?;
    rules.use_nats_reply = false;
    let js_config = &config.jetstream;
    let js = async_nats::jetstream::new(client.clone());
    let puller = consume::Puller {
        client: client.clone(),
        js: js.clone(),
        config: config.clone(),
        max_in_flight: config.max_in_flight,
        batch: js_config.batch,
        budget: crate::transport::budget::ByteBudget::new(config.max_in_flight_bytes),
        readiness,
    };
    tokio::pin!(shutdown);
    let Some(mut consumer) = open_at_start(&puller, shutdown.as_mut()).await? else {
        return Ok(());
    };
    // The server's ack wait rules the in-progress acks, whatever the config says.
    let ack_wait = consumer
        .info()
        .await
        .map_or(Duration::from_secs(js_config.ack_wait_secs), |info| {
            info.config.ack_wait
        });
    let gen_stream = if js_config.gen_is_stream {
        let window = match js.get_stream(&js_config.gen_stream).await {
            Ok(mut gen_stream) => gen_stream
                .info()
                .await
                .ok()
                .map(|i| i.config.duplicate_window),
            Err(_) => None,
        };
        Some(handle::GenStream {
            name: js_config.gen_stream.clone(),
            duplicate_window: window
                .or_else(|| setup::duplicate_window(config).ok())
                .unwrap_or(Duration::from_secs(js_config.duplicate_window_secs)),
        })
    } else {
        None
    };
    let handler = Arc::new(handle::Handler {
        publisher: publish::Publisher {
            client: client.clone(),
            js,
            confirmer: confirm::Confirmer::new(client.clone()),
        },
        rules,
        identity,
        metrics,
        gen_is_stream: js_config.gen_is_stream,
        redelivery: settle::Redelivery {
            nak_delay: Duration::from_millis(js_config.nak_delay_ms),
            max_deliver: consumer.cached_info().config.max_deliver,
        },
        ack_wait,
        gen_stream,
        telemetry,
    });
    tracing::info!(
        stream = %js_config.prefill_stream,
        consumer = %js_config.consumer,
        ack_wait_ms = ack_wait.as_millis() as u64,
        "consuming from JetStream"
    );
    let drain_timeout = Duration::from_secs(config.shutdown_timeout_secs);
    puller.run(consumer, handler, shutdown, drain_timeout).await;
    if let Err(e) = client.flush().await {
        tracing::warn!(error = %e, "flush at shutdown failed");
    }
    Ok(())
}

/// Opens the consumer, waiting for a server that does not answer yet
/// (`None`: shutdown came first). Missing or incompatible objects fail at once.
async fn open_at_start(
    puller: &consume::Puller,
    mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Result<Option<async_nats::jetstream::consumer::PullConsumer>, JetStreamError> {
    loop {
        match puller.open().await {
            Ok(consumer) => return Ok(Some(consumer)),
            Err(JetStreamError::Api(e)) => {
                tracing::warn!(error = %e, "JetStream is not answering yet; retrying");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = shutdown.as_mut() => return Ok(None),
                }
            }
            Err(e) => return Err(e),
        }
    }
}
