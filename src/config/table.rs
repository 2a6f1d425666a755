//! The key table: every configuration key, what it takes, the range it must
//! lie in and what it means. The loader (`keys.rs`), the range checks
//! (`validate.rs`) and the generated reference (`reference.rs`,
//! `docs/configuration.md`) all read this table.
//!
//! To add a key: add its field (with its default) to the struct in `mod.rs`,
//! add its row here in file order, and regenerate the reference
//! (`prefill-handoff config-reference > docs/configuration.md`). Tests fail
//! until all three agree.

/// One configuration key: its dotted name, the kind of value it takes, the
/// range that value must lie in, and what it means. The rows are in
/// `table.rs`.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    pub name: &'static str,
    pub kind: Kind,
    pub range: Range,
    /// Why the range is what it is; empty when the range says it all.
    pub why: &'static str,
    /// One or two sentences for the reference.
    pub meaning: &'static str,
}

/// What a key accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Str,
    /// An optional string; the empty string means unset.
    OptStr,
    /// An optional string that is never shown in messages.
    Secret,
    /// A non-negative integer.
    UInt,
    Int,
    /// A finite number (an integer is taken as a number too).
    Float,
    Bool,
    /// A list of strings; from the environment or a flag, comma-separated.
    List,
    /// One of the listed words (matched ignoring case, stored in lower case).
    Enum(&'static [&'static str]),
}

/// The values a key's kind allows that it also accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// Every value of the kind.
    Any,
    /// An integer of at least this.
    AtLeast(u64),
    /// An integer from the first to the second, both included.
    Between(u64, u64),
    /// -1 (no limit) or a positive integer.
    MinusOneOrPositive,
    /// A number from 0 to 1.
    Fraction,
}

const fn key(name: &'static str, kind: Kind, meaning: &'static str) -> Key {
    Key {
        name,
        kind,
        range: Range::Any,
        why: "",
        meaning,
    }
}

impl Key {
    /// The same key, limited to `range`; `why` says why (for messages and
    /// the reference).
    const fn within(self, range: Range, why: &'static str) -> Key {
        Key { range, why, ..self }
    }
}

use Kind::{Bool, Enum, Float, Int, List, OptStr, Secret, Str, UInt};
use Range::{AtLeast, Between, Fraction, MinusOneOrPositive};

/// Every key, in the order of `config/handoff.toml`.
pub const KEYS: &[Key] = &[
    key("nats.url", Str, "NATS server URL(s), comma-separated. Credentials may be written in the URL (`nats://user:password@host:4222`, `nats://token@host:4222`); they are then the one authentication method, the same in every URL, and never logged."),
    key("nats.user", OptStr, "NATS user name; with `nats.password`."),
    key("nats.password", Secret, "NATS password; with `nats.user`. Prefer the environment variable to the file."),
    key("nats.token", Secret, "NATS token. At most one authentication method is set."),
    key("nats.credentials_file", OptStr, "Path to a NATS `.creds` file (JWT and NKey seed); must be a readable file."),
    key("nats.name", Str, "Client name shown in the server's connection list."),
    key("nats.subscription_capacity", UInt, "Messages the client buffers per subscription while the worker is behind; beyond it core NATS drops them (slow consumer).")
        .within(AtLeast(1), "the client needs room for at least one message"),
    key("nats.connect_timeout_secs", UInt, "Seconds `run` waits for its first NATS connection before exiting 1; after it, the worker reconnects forever.")
        .within(AtLeast(1), "0 would give up on NATS before trying"),
    key("nats.ping_interval_secs", UInt, "Seconds between the client's pings; after three unanswered ones it drops the connection (the worker turns not ready) and reconnects, so a link that goes silent without closing is noticed within about three intervals.")
        .within(AtLeast(1), "the client needs a period to ping at"),
    key("nats.nkey_seed_file", OptStr, "Path to a file holding an NKey user seed (`SU...`), read and checked at start."),
    key("nats.tls.ca_file", OptStr, "PEM CA bundle that signs the NATS server's certificate, instead of the system roots."),
    key("nats.tls.cert_file", OptStr, "Client certificate (PEM) for mutual TLS to NATS; with `nats.tls.key_file`."),
    key("nats.tls.key_file", OptStr, "Client key (PEM) for mutual TLS to NATS; with `nats.tls.cert_file`."),
    key("nats.tls.required", Bool, "Never talk to NATS without TLS. In effect anyway when a `nats.tls.*` file is set or a URL is `tls://`."),
    key("nats.tls.first", Bool, "TLS before the server's INFO (servers with `handshake_first`, nats-server 2.10 and later); implies `nats.tls.required`. Not with websocket URLs."),
    key("etcd.endpoints", Str, "etcd endpoints, comma-separated. With etcd TLS in use every endpoint must be `https://`."),
    key("etcd.user", OptStr, "etcd user; with `etcd.password`."),
    key("etcd.password", Secret, "etcd password; with `etcd.user`."),
    key("etcd.connect_timeout_ms", UInt, "Milliseconds to wait for a connection to etcd.")
        .within(AtLeast(1), "0 would never wait for etcd"),
    key("etcd.request_timeout_ms", UInt, "Milliseconds to wait for one etcd request.")
        .within(AtLeast(1), "0 would never wait for etcd"),
    key("etcd.tls.ca_file", OptStr, "PEM CA bundle that signs the etcd server's certificate, instead of the system roots."),
    key("etcd.tls.cert_file", OptStr, "Client certificate (PEM) for etcd (`--client-cert-auth`); with `etcd.tls.key_file`."),
    key("etcd.tls.key_file", OptStr, "Client key (PEM) for etcd; with `etcd.tls.cert_file`."),
    key("mode", Enum(&["core", "jetstream"]), "Delivery mode: `core` (queue group, at most once) or `jetstream` (work-queue stream and durable pull consumer, at least once, acked after the output is published)."),
    key("metrics_addr", Str, "IP:PORT of the HTTP server for Prometheus metrics, `/healthz` and `/readyz`."),
    key("shutdown_timeout_secs", UInt, "Seconds to finish in-flight results after SIGTERM/SIGINT before exiting.")
        .within(AtLeast(1), "0 would abandon in-flight results without an output"),
    key("namespace", Str, "The namespace `{ns}`: prefix of every default subject, stream and etcd key. Letters, digits, `_` and `-`."),
    key("subjects.prefill_results", Str, "Prefill result subjects to consume, comma-separated, wildcards allowed. Empty: `{ns}.prefill.results`."),
    key("subjects.gen", Str, "Subject of decode jobs (GEN); literal. Empty: `{ns}.gen.jobs`."),
    key("subjects.dead_letter", Str, "Subject of dead letters; literal. Empty: `{ns}.handoff.dead`."),
    key("subjects.ids", Str, "Subject of the ID mint service (request/reply); literal. Empty: `{ns}.handoff.ids`."),
    key("subjects.cancel", Str, "Subject of cancels (`{\"request_id\", \"reason\"}`); every worker subscribes, not in the queue group; literal. Empty: `{ns}.handoff.cancel`."),
    key("subjects.kv_release", Str, "Subject of the KV release notices of refused handoffs (every error after the handoff parameters validated); literal. Empty: `{ns}.kv.release`."),
    key("queue_group", Str, "Queue group shared by the workers in core mode. Empty: `{ns}-handoff`."),
    key("jetstream.prefill_stream", Str, "Work-queue stream over the prefill subjects. Empty: `{NS}_PREFILL`."),
    key("jetstream.gen_stream", Str, "Stream over the GEN subject. Empty: `{NS}_GEN`."),
    key("jetstream.cancel_stream", Str, "Stream over the cancel subject, keeping cancels for `cancel.retention_secs`: a worker loads them before it pulls. Empty: `{NS}_CANCEL`."),
    key("jetstream.consumer", Str, "The durable pull consumer all workers share."),
    key("jetstream.create", Bool, "Whether `run` creates missing streams and the consumer."),
    key("jetstream.gen_is_stream", Bool, "Whether decode jobs go into the GEN stream: the worker waits for its ack before acking the prefill result, and `Nats-Msg-Id` drops duplicates within the duplicate window."),
    key("jetstream.ack_wait_secs", UInt, "Seconds before an unacked message is redelivered.")
        .within(AtLeast(1), "it is how long a worker may hold a message before it is redelivered"),
    key("jetstream.max_deliver", Int, "Deliveries before a message is given up; -1 for unlimited (refused while `jetstream.gen_is_stream` is true).")
        .within(MinusOneOrPositive, ""),
    key("jetstream.max_ack_pending", Int, "Deliveries not yet acked across all workers sharing the consumer; -1 for no limit. Size it to workers × `max_in_flight`.")
        .within(MinusOneOrPositive, ""),
    key("jetstream.nak_delay_ms", UInt, "Milliseconds before a message that could not be handled now is redelivered; doubles with each delivery, up to 32 times this."),
    key("jetstream.duplicate_window_secs", UInt, "Seconds in which the GEN stream drops a decode job whose `Nats-Msg-Id` it already stored; `setup` uses the redelivery span instead when that is longer. At most `jetstream.max_age_secs` (when set).")
        .within(AtLeast(1), "the GEN stream needs a window so redelivered decode jobs are dropped"),
    key("jetstream.max_age_secs", UInt, "Oldest message the streams keep, in seconds; 0 for no limit."),
    key("jetstream.max_bytes", Int, "Largest size of each stream in bytes; -1 for no limit.")
        .within(MinusOneOrPositive, ""),
    key("jetstream.storage", Enum(&["file", "memory"]), "Stream storage."),
    key("jetstream.batch", UInt, "Messages fetched per pull request.")
        .within(AtLeast(1), "a pull asks for at least one message"),
    key("jetstream.replicas", UInt, "Replicas of both streams; 3 on a cluster of at least three JetStream servers survives the loss of one. `setup` changes existing streams in place.")
        .within(Between(1, 5), "NATS keeps at most 5 replicas of a stream"),
    key("id_service.ids_per_sec", UInt, "IDs per second the ID mint service hands out (bursts up to a tenth of a second of it); beyond, requests are answered `rate_limited`. Decode jobs never wait for it.")
        .within(Between(1, 512_000), "at most half of what a slot mints in rc22 (1,024 IDs per millisecond), so decode jobs always keep the other half"),
    key("id_service.max_count", UInt, "The most IDs one request may ask for; larger requests are answered `rate_limited` (above 1024: `malformed`).")
        .within(Between(1, 1024), "a request asks for at least one ID, and the contract's largest request is 1024"),
    key("deadline.clock_skew_ms", UInt, "Milliseconds a result's deadline may lie behind this worker's clock before a decode-bound result is refused `deadline_exceeded`: room for clocks that disagree.")
        .within(Between(0, 3_600_000), "an hour; clocks further apart than that need fixing, not tolerating"),
    key("trtllm.missing_disagg_request_id", Enum(&["refuse", "pass", "mint"]), "What a decode-bound TensorRT-LLM result without `disagg_request_id` gets: `refuse` (error `missing_disagg_request_id`; the producer mints the ID from the ID service before the context phase), `pass` (the decode job goes on with the ID null), `mint` (the worker mints one: only for transceivers that ignore the ID)."),
    key("kv_hold_ms.trtllm", UInt, "Milliseconds TensorRT-LLM's prefill side keeps a request's KV after publishing its result, for results without `kv_expires_ms` or `Handoff-KV-Expires`; counted from the result's publication (JetStream's stored time) or receipt. 0: no expiry.")
        .within(Between(0, 86_400_000), "a day; no engine holds KV for longer"),
    key("kv_hold_ms.vllm", UInt, "The same for vLLM (its NIXL connector's abort timeout).")
        .within(Between(0, 86_400_000), "a day; no engine holds KV for longer"),
    key("kv_hold_ms.sglang", UInt, "The same for SGLang (its bootstrap timeout).")
        .within(Between(0, 86_400_000), "a day; no engine holds KV for longer"),
    key("kv_hold_ms.opaque", UInt, "The same for handoffs of no recognised engine.")
        .within(Between(0, 86_400_000), "a day; no engine holds KV for longer"),
    key("cancel.max_entries", UInt, "Cancels a worker holds at most; the oldest are evicted (and counted) beyond.")
        .within(Between(1, 10_000_000), "0 would forget every cancel at once"),
    key("cancel.max_bytes", UInt, "Bytes the held cancels may take, each charged with its bookkeeping (about 200 bytes for a 45-byte request ID); the oldest are evicted (and counted) beyond.")
        .within(AtLeast(1024), "a cancel of a 256-byte request ID with its bookkeeping needs about 400 bytes"),
    key("cancel.retention_secs", UInt, "Seconds a cancel is held, and kept by the JetStream cancel stream.")
        .within(Between(1, 86_400), "a day; a request waits for its handoff seconds, not days"),
    key("allowed_reply_subjects", List, "Reply subjects a prefill result may name in `reply_to`; wildcards allowed. `$` subjects, wildcards and the worker's own subjects are refused regardless. Empty: `_INBOX.>`, `{ns}.replies.>`."),
    key("lease_ttl_secs", UInt, "etcd lease TTL in seconds. The machine-ID slot lives as long as the lease, renewed every TTL/3; a worker that loses it stops minting at once.")
        .within(Between(2, 9_000_000_000), "the lease is renewed every TTL/3, and etcd never grants less than about 2 s (it would silently extend a shorter lease, and the worker would fence its slot while etcd still holds it) nor more than 9,000,000,000 s"),
    key("id_layout", Enum(&["rc21", "rc22"]), "Request-ID layout TensorRT-LLM expects."),
    key("id_epoch", Str, "The instant IDs count milliseconds from: RFC 3339 in UTC, in the past. Every worker and every decoder of IDs of a fleet must use the same one."),
    key("max_payload_bytes", UInt, "Largest prefill result accepted, in bytes; larger ones are dead-lettered as `too_large`.")
        .within(AtLeast(1024), "a prefill result with its frames and handoff parameters needs at least 1 KiB"),
    key("max_in_flight", UInt, "Results one worker processes concurrently.")
        .within(AtLeast(1), "at least one result must be processed at a time"),
    key("max_in_flight_bytes", UInt, "Bytes of prefill results one worker holds at once (taken from NATS, not yet answered). In core mode a result beyond it is dead-lettered `over_budget` without its bytes; in JetStream mode pulls ask for at most the bytes free. At least `max_payload_bytes`.")
        .within(Between(1, 4_294_967_295), "the budget is counted in 32 bits (4 GiB - 1)"),
    key("log_format", Enum(&["text", "json"]), "Log line format on stderr; levels come from `RUST_LOG` (default `info`)."),
    key("otel.endpoint", OptStr, "The OTLP collector, `http://host:port` (no TLS: use a collector agent on the node). Unset: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`, and with neither no tracing at all."),
    key("otel.protocol", OptStr, "`grpc` (port 4317) or `http` (OTLP/HTTP with protobuf, 4318; `/v1/traces` is appended). Unset: `OTEL_EXPORTER_OTLP_PROTOCOL`, else `grpc`."),
    key("otel.sampling_ratio", Float, "Share of new traces (results without a `traceparent`) recorded; a result with a `traceparent` follows its sampled flag.")
        .within(Fraction, "0 records no new traces, 1 all"),
    key("otel.queue_spans", UInt, "Finished spans waiting for export, at most (about 1 KiB each); more are dropped and counted.")
        .within(Between(1, 1_000_000), "each waiting span holds about 1 KiB"),
    key("otel.export_timeout_ms", UInt, "Longest one export request may take, in milliseconds; its spans are then dropped and counted.")
        .within(AtLeast(1), "0 would drop every export"),
];
