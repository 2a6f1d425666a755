//! The sections of [`super::Config`]: one struct per table of the file,
//! with its defaults.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `Debug` hides the password, the token and URL credentials.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NatsConfig {
    /// Comma-separated server URLs.
    pub url: String,
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    pub credentials_file: Option<PathBuf>,
    /// Client name shown in the server's connection list.
    pub name: String,
    /// Messages the client buffers per subscription while the worker is
    /// behind; beyond it, core NATS drops them (slow consumer).
    pub subscription_capacity: usize,
    /// `run` exits 1 when no server of `url` answers within this at start.
    pub connect_timeout_secs: u64,
    /// The client pings the server this often and gives the connection up
    /// after three unanswered pings: a link that goes silent without
    /// closing is noticed (not ready, reconnecting) within about three of
    /// these.
    pub ping_interval_secs: u64,
    /// File holding an NKey user seed (`SU...`).
    pub nkey_seed_file: Option<PathBuf>,
    pub tls: NatsTls,
}

/// TLS to NATS. Every file is read and checked at start (`crate::security`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct NatsTls {
    /// PEM CA bundle that signs the server's certificate, instead of the
    /// system roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS; with `key_file`.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Never talk to the server without TLS. In effect also when a TLS file
    /// is set or a URL is `tls://` ([`NatsConfig::tls_required`]).
    pub required: bool,
    /// TLS before the server's INFO (servers with `handshake_first`, 2.10+).
    pub first: bool,
}

/// TLS to etcd (`https://` endpoints).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct EtcdTls {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl NatsConfig {
    /// Whether the connection must be TLS: asked for, implied by a TLS file
    /// or `nats.tls.first`, or by a `tls://` URL. A CA or a client
    /// certificate is pointless over a connection that may stay plaintext,
    /// so `required = false` cannot switch it off.
    pub fn tls_required(&self) -> bool {
        let t = &self.tls;
        t.required
            || t.first
            || t.ca_file.is_some()
            || t.cert_file.is_some()
            || t.key_file.is_some()
            || self
                .url
                .split(',')
                .any(|u| u.trim().to_ascii_lowercase().starts_with("tls://"))
    }
}

impl EtcdConfig {
    /// Whether the endpoints are reached over TLS: any `https://` endpoint
    /// or any etcd TLS file.
    pub fn tls_enabled(&self) -> bool {
        let t = &self.tls;
        t.ca_file.is_some()
            || t.cert_file.is_some()
            || t.key_file.is_some()
            || self
                .endpoints
                .split(',')
                .any(|e| e.trim().to_ascii_lowercase().starts_with("https://"))
    }
}

/// `Debug` hides the password and URL credentials.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EtcdConfig {
    /// Comma-separated endpoints.
    pub endpoints: String,
    pub user: Option<String>,
    pub password: Option<String>,
    pub connect_timeout_ms: u64,
    pub request_timeout_ms: u64,
    pub tls: EtcdTls,
}

/// Subject names; empty means the namespace-derived default.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Subjects {
    pub prefill_results: String,
    #[serde(rename = "gen")]
    pub gen_jobs: String,
    pub dead_letter: String,
    pub ids: String,
    /// Cancels of requests, seen by every worker (`{ns}.handoff.cancel`).
    pub cancel: String,
    /// KV release notices for refused handoffs (`{ns}.kv.release`).
    pub kv_release: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct JetStreamConfig {
    /// Empty means `{NS}_PREFILL`.
    pub prefill_stream: String,
    /// Empty means `{NS}_GEN`.
    pub gen_stream: String,
    /// Stream keeping cancels for `cancel.retention_secs`; empty means
    /// `{NS}_CANCEL`.
    pub cancel_stream: String,
    pub consumer: String,
    /// `run --mode jetstream` creates missing streams and consumer.
    pub create: bool,
    /// Whether decode jobs are published into the GEN stream (waiting for its ack).
    pub gen_is_stream: bool,
    pub ack_wait_secs: u64,
    pub max_deliver: i64,
    /// Deliveries outstanding (not yet acked) across all workers at once;
    /// -1 for no limit.
    pub max_ack_pending: i64,
    pub nak_delay_ms: u64,
    pub duplicate_window_secs: u64,
    pub max_age_secs: u64,
    pub max_bytes: i64,
    /// `file` or `memory`.
    pub storage: String,
    pub batch: usize,
    /// Replicas of both streams (1–5): 3 survives the loss of one server
    /// of a NATS cluster.
    pub replicas: usize,
}

/// OpenTelemetry traces exported over OTLP (`crate::telemetry`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OtelConfig {
    /// The OTLP collector, `http://host:port`. Unset: the standard
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// and with neither no tracing at all.
    pub endpoint: Option<String>,
    /// `grpc` or `http` (OTLP/HTTP with protobuf). Unset: the standard
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`, else `grpc`.
    pub protocol: Option<String>,
    /// Share of new traces (results without a sampled-or-not `traceparent`)
    /// recorded, 0 to 1. A result with a `traceparent` follows its flag.
    pub sampling_ratio: f64,
    /// Finished spans waiting for export, at most; more are dropped and counted.
    pub queue_spans: usize,
    /// Longest one export may take before its spans are dropped.
    pub export_timeout_ms: u64,
}

impl Default for OtelConfig {
    fn default() -> Self {
        OtelConfig {
            endpoint: None,
            protocol: None,
            sampling_ratio: 1.0,
            queue_spans: 2048,
            export_timeout_ms: 5000,
        }
    }
}

/// The ID mint service's own budget, apart from the decode jobs' minting.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IdServiceConfig {
    /// IDs per second the service hands out; requests beyond are refused
    /// with `rate_limited`.
    pub ids_per_sec: u64,
    /// The most IDs one request may ask for (at most the contract's 1024).
    pub max_count: u64,
}

impl Default for IdServiceConfig {
    fn default() -> Self {
        IdServiceConfig {
            ids_per_sec: 100_000,
            max_count: 1024,
        }
    }
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: "nats://127.0.0.1:4222".into(),
            user: None,
            password: None,
            token: None,
            credentials_file: None,
            name: "prefill-handoff".into(),
            subscription_capacity: 262_144,
            connect_timeout_secs: 10,
            ping_interval_secs: 5,
            nkey_seed_file: None,
            tls: NatsTls::default(),
        }
    }
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: "http://127.0.0.1:2379".into(),
            user: None,
            password: None,
            connect_timeout_ms: 2000,
            request_timeout_ms: 2000,
            tls: EtcdTls::default(),
        }
    }
}

impl Default for JetStreamConfig {
    fn default() -> Self {
        JetStreamConfig {
            prefill_stream: String::new(),
            gen_stream: String::new(),
            cancel_stream: String::new(),
            consumer: "handoff".into(),
            create: true,
            gen_is_stream: true,
            ack_wait_secs: 30,
            max_deliver: 20,
            max_ack_pending: 4096,
            nak_delay_ms: 1000,
            duplicate_window_secs: 120,
            max_age_secs: 24 * 3600,
            max_bytes: -1,
            storage: "file".into(),
            batch: 128,
            replicas: 1,
        }
    }
}

/// Deadlines of prefill results (`deadline_ms`, `Handoff-Deadline`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct DeadlineConfig {
    /// Milliseconds a deadline may lie behind this worker's clock before a
    /// decode-bound result is refused `deadline_exceeded`.
    pub clock_skew_ms: u64,
}

/// TensorRT-LLM handoffs (`trtllm.*`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TrtllmConfig {
    /// What a decode-bound TensorRT-LLM result without `disagg_request_id`
    /// gets.
    pub missing_disagg_request_id: MissingDisaggRequestId,
}

/// The policy for a decode-bound TensorRT-LLM result whose
/// `disagg_request_id` is absent or null. TensorRT-LLM keys the KV transfer
/// session by the ID its context phase ran with, so an ID minted after that
/// phase names a session the context side never opened.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum MissingDisaggRequestId {
    /// Error `missing_disagg_request_id`: the producer must mint the ID
    /// before the context phase.
    #[default]
    Refuse,
    /// The decode job goes on with the ID null (the generation side keys
    /// the transfer by `ctx_request_id`).
    Pass,
    /// The worker mints one, for transceivers that ignore the ID.
    Mint,
}

/// How long each engine's prefill side keeps a request's KV after it
/// published the result (`kv_hold_ms.*`), for results that do not say so
/// themselves; 0: not known, no expiry.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct KvHoldConfig {
    pub trtllm: u64,
    pub vllm: u64,
    pub sglang: u64,
    pub opaque: u64,
}

/// The set of cancelled request IDs each worker holds.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CancelConfig {
    /// Cancels held at most; the oldest are evicted (and counted) beyond.
    pub max_entries: u64,
    /// Bytes the held cancels may take, counted with their bookkeeping.
    pub max_bytes: u64,
    /// Seconds a cancel is held (and kept by the JetStream cancel stream).
    pub retention_secs: u64,
}

impl Default for CancelConfig {
    fn default() -> Self {
        CancelConfig {
            max_entries: 50_000,
            max_bytes: 8 * 1024 * 1024,
            retention_secs: 600,
        }
    }
}
