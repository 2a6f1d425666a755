//! Every header the worker reads or writes, by the name it goes out under.
//! Incoming names are matched without regard to case ([`super::first`]).

/// The message ID a stream drops a second copy by: a decode job's and a KV
/// release notice's ([`super::msg_id`]).
pub const NATS_MSG_ID: &str = "Nats-Msg-Id";
/// The time after which a stream (nats-server 2.11+, `allow_msg_ttl`) drops
/// a message: a decode job's deadline, in whole seconds.
pub const NATS_TTL: &str = "Nats-TTL";
/// `application/json` on JSON inputs and outputs; none for MessagePack.
pub const CONTENT_TYPE: &str = "Content-Type";
/// A result's deadline (Unix epoch milliseconds), read from the input and
/// written on its decode job.
pub const HANDOFF_DEADLINE: &str = "Handoff-Deadline";
/// When the prefill engine frees a result's KV (Unix epoch milliseconds),
/// read from the input and written on its decode job.
pub const HANDOFF_KV_EXPIRES: &str = "Handoff-KV-Expires";
/// A dead letter's code.
pub const HANDOFF_ERROR_CODE: &str = "Handoff-Error-Code";
/// A dead letter's sentence saying why.
pub const HANDOFF_ERROR: &str = "Handoff-Error";
/// The subject a dead-lettered input arrived on.
pub const HANDOFF_SOURCE_SUBJECT: &str = "Handoff-Source-Subject";
/// A dead letter sent without the input's bytes, because even the input
/// alone does not fit the server's `max_payload` once the dead letter's
/// headers are added: how many bytes the input had.
pub const HANDOFF_PAYLOAD_OMITTED: &str = "Handoff-Payload-Omitted";
/// The W3C `traceparent` header, as written on outputs.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C `tracestate` header, as written on outputs.
pub const TRACESTATE: &str = "tracestate";
