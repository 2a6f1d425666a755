//! The baselines the worker is measured against: programs that do the same
//! NATS work as the worker minus the decision.
//!
//! - [`CoreRelay`]: queue-subscribes to the prefill subject and republishes
//!   each message's bytes unchanged to GEN — the ceiling for any
//!   NATS-in/NATS-out worker in core mode.
//! - [`JsRelay`]: a durable pull consumer on a work-queue stream over the
//!   prefill subject; publishes each message's bytes into the GEN stream,
//!   waits for the store ack, then acks — the durable worker's I/O.
//!
//! They live in this crate so that `examples/raw_relay.rs`,
//! `examples/raw_js_relay.rs` and the integration tests share one
//! implementation.

use async_nats::jetstream::{self, consumer, stream};
use async_nats::{Client, HeaderMap, Subject, Subscriber};
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("subscribing to {subject}: {why}")]
    Subscribe { subject: String, why: String },
    #[error("setting up JetStream {what}: {why}")]
    Setup { what: String, why: String },
    #[error("relaying: {0}")]
    Io(String),
}

/// Messages relayed so far, readable while the relay runs.
#[derive(Debug, Default, Clone)]
pub struct Relayed(Arc<AtomicU64>);

impl Relayed {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn add(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// A core NATS relay, subscribed and ready once [`CoreRelay::start`] returns.
pub struct CoreRelay {
    client: Client,
    subscriber: Subscriber,
    to: Subject,
    pub relayed: Relayed,
}

impl CoreRelay {
    /// Subscribes to `from` (in queue group `queue`, if any) and waits until
    /// the server has registered the subscription.
    pub async fn start(
        client: Client,
        from: &str,
        queue: Option<&str>,
        to: &str,
    ) -> Result<CoreRelay, RelayError> {
        let fail = |e: &dyn std::fmt::Display| RelayError::Subscribe {
            subject: from.to_string(),
            why: e.to_string(),
        };
        let subscriber = match queue {
            Some(q) => {
                client
                    .queue_subscribe(from.to_string(), q.to_string())
                    .await
            }
            None => client.subscribe(from.to_string()).await,
        }
        .map_err(|e| fail(&e))?;
        client.flush().await.map_err(|e| fail(&e))?;
        Ok(CoreRelay {
            client,
            subscriber,
            to: Subject::from(to),
            relayed: Relayed::default(),
        })
    }

    /// Relays until the subscription ends (the client drains or closes).
    pub async fn run(mut self) -> Result<u64, RelayError> {
        while let Some(msg) = self.subscriber.next().await {
            self.client
                .publish(self.to.clone(), msg.payload)
                .await
                .map_err(|e| RelayError::Io(e.to_string()))?;
            self.relayed.add();
        }
        Ok(self.relayed.get())
    }
}

/// Where a [`JsRelay`] reads and writes; the names default like the worker's.
#[derive(Debug, Clone)]
pub struct JsRelaySettings {
    pub prefill_subject: String,
    pub gen_subject: String,
    pub prefill_stream: String,
    pub gen_stream: String,
    pub consumer: String,
    /// Messages pulled per request.
    pub batch: usize,
    /// Bytes pulled per request (the stream's `max_bytes_per_batch`); 0
    /// for no bound.
    pub max_bytes: usize,
    /// Messages being published (awaiting the GEN store ack) at once.
    pub max_in_flight: usize,
    /// File storage, like the worker's default; memory when false.
    pub file_storage: bool,
}

impl JsRelaySettings {
    /// The worker's default names for a namespace (contract 2), with the
    /// consumer called `relay`.
    pub fn for_namespace(ns: &str) -> JsRelaySettings {
        let upper = ns.to_uppercase();
        JsRelaySettings {
            prefill_subject: format!("{ns}.prefill.results"),
            gen_subject: format!("{ns}.gen.jobs"),
            prefill_stream: format!("{upper}_PREFILL"),
            gen_stream: format!("{upper}_GEN"),
            consumer: "relay".into(),
            batch: 128,
            max_bytes: 0,
            max_in_flight: 1024,
            file_storage: true,
        }
    }
}

/// A JetStream relay whose streams and durable consumer exist once
/// [`JsRelay::start`] returns.
pub struct JsRelay {
    js: jetstream::Context,
    consumer: consumer::PullConsumer,
    settings: JsRelaySettings,
    pub relayed: Relayed,
}

impl JsRelay {
    /// Creates (or reuses) the work-queue prefill stream, the GEN stream with
    /// a duplicate window, and the durable pull consumer.
    pub async fn start(client: Client, settings: JsRelaySettings) -> Result<JsRelay, RelayError> {
        let js = jetstream::new(client);
        let storage = if settings.file_storage {
            stream::StorageType::File
        } else {
            stream::StorageType::Memory
        };
        let setup = |what: &str, e: &dyn std::fmt::Display| RelayError::Setup {
            what: what.to_string(),
            why: e.to_string(),
        };
        let prefill = js
            .get_or_create_stream(stream::Config {
                name: settings.prefill_stream.clone(),
                subjects: vec![settings.prefill_subject.clone()],
                retention: stream::RetentionPolicy::WorkQueue,
                storage,
                ..Default::default()
            })
            .await
            .map_err(|e| setup(&format!("stream {}", settings.prefill_stream), &e))?;
        js.get_or_create_stream(stream::Config {
            name: settings.gen_stream.clone(),
            subjects: vec![settings.gen_subject.clone()],
            storage,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .map_err(|e| setup(&format!("stream {}", settings.gen_stream), &e))?;
        let consumer = prefill
            .get_or_create_consumer(
                &settings.consumer,
                consumer::pull::Config {
                    durable_name: Some(settings.consumer.clone()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: Duration::from_secs(30),
                    max_deliver: 20,
                    // The worker's default: a relay as deep as the worker.
                    max_ack_pending: 4096,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| setup(&format!("consumer {}", settings.consumer), &e))?;
        Ok(JsRelay {
            js,
            consumer,
            settings,
            relayed: Relayed::default(),
        })
    }

    /// Relays until the consumer's message stream ends. A message whose GEN
    /// publish fails is left unacked and comes back after the ack wait.
    pub async fn run(self) -> Result<u64, RelayError> {
        let messages = self
            .consumer
            .stream()
            .max_messages_per_batch(self.settings.batch)
            .max_bytes_per_batch(self.settings.max_bytes)
            .messages()
            .await
            .map_err(|e| RelayError::Io(format!("pull consumer: {e}")))?;
        let gen_subject = Subject::from(self.settings.gen_subject.as_str());
        let js = &self.js;
        let relayed = &self.relayed;
        messages
            .for_each_concurrent(self.settings.max_in_flight, |msg| {
                let gen_subject = gen_subject.clone();
                async move {
                    let Ok(msg) = msg else { return };
                    let mut headers = HeaderMap::new();
                    if let Ok(info) = msg.info() {
                        // Like the worker's `Nats-Msg-Id`, so the GEN stream
                        // does the same duplicate tracking.
                        headers.insert("Nats-Msg-Id", format!("relay-{}", info.stream_sequence));
                    }
                    let stored = match js
                        .publish_with_headers(gen_subject, headers, msg.payload.clone())
                        .await
                    {
                        Ok(ack) => ack.await.is_ok(),
                        Err(_) => false,
                    };
                    if stored && msg.ack().await.is_ok() {
                        relayed.add();
                    }
                }
            })
            .await;
        Ok(self.relayed.get())
    }
}
