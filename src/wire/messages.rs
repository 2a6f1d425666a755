//! The messages the worker publishes (contract 4.3), built as value trees so
//! that passed-on parts keep every field they came with.

use super::map::from_pairs;
use crate::ids::{IdLayout, MachineId};
use rmpv::Value;

/// The longest accepted `request_id`, in bytes. Defined here, beside the
/// messages that carry it, for the readers below the decision (a refused
/// body's peek); the decision re-exports it.
pub const MAX_REQUEST_ID_BYTES: usize = 256;

/// Which engine's handoff shape a decode job carries (its `backend` field).
/// Defined here with the message it names; the decision re-exports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backend {
    Trtllm,
    Sglang,
    Vllm,
    Opaque,
}

impl Backend {
    pub const ALL: [Backend; 4] = [
        Backend::Trtllm,
        Backend::Sglang,
        Backend::Vllm,
        Backend::Opaque,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Trtllm => "trtllm",
            Backend::Sglang => "sglang",
            Backend::Vllm => "vllm",
            Backend::Opaque => "opaque",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `{"request_id", "kind": "error", "error": {"code", "message"}}`.
pub fn error_response(request_id: Option<&str>, code: &str, message: &str) -> Value {
    from_pairs([
        ("request_id", request_id.map_or(Value::Nil, Value::from)),
        ("kind", Value::from("error")),
        (
            "error",
            from_pairs([
                ("code", Value::from(code)),
                ("message", Value::from(message)),
            ]),
        ),
    ])
}

/// `{"request_id", "kind": "terminal", "output": <first frame>}`.
pub fn terminal_response(request_id: &str, output: Value) -> Value {
    from_pairs([
        ("request_id", Value::from(request_id)),
        ("kind", Value::from("terminal")),
        ("output", output),
    ])
}

/// A decode job for the GEN subject.
#[derive(Debug)]
pub struct DecodeJob<'a> {
    pub request_id: &'a str,
    pub reply_to: &'a str,
    pub backend: Backend,
    /// TensorRT-LLM only (`Some`): the kept or minted ID, or `None` when it
    /// is passed on null.
    pub disagg_request_id: Option<Option<u64>>,
    pub handoff: Vec<(Value, Value)>,
    /// The first frame without `disaggregated_params`.
    pub prefill_output: Vec<(Value, Value)>,
    pub request: Option<Value>,
    pub instance_id: InstanceId,
    pub machine_id: Option<MachineId>,
    /// The result's effective deadline (contract 10), when it has one.
    pub deadline_ms: Option<u64>,
    /// When the prefill engine frees the KV, when known.
    pub kv_expires_ms: Option<u64>,
    /// The input's other top-level entries, passed on after the job's own
    /// fields. An entry under one of the job's own keys is dropped: the job's
    /// fields are what decode workers read.
    pub extra: Vec<(Value, Value)>,
}

/// The keys of a decode job; input entries under these names are not passed on.
pub const DECODE_JOB_KEYS: [&str; 10] = [
    "request_id",
    "reply_to",
    "backend",
    "disagg_request_id",
    "handoff",
    "prefill_output",
    "request",
    "worker",
    "deadline_ms",
    "kv_expires_ms",
];

impl DecodeJob<'_> {
    pub fn into_value(self) -> Value {
        let mut job = Vec::with_capacity(8 + self.extra.len());
        let mut put = |k: &str, v: Value| job.push((Value::from(k), v));
        put("request_id", Value::from(self.request_id));
        put("reply_to", Value::from(self.reply_to));
        put("backend", Value::from(self.backend.as_str()));
        if let Some(id) = self.disagg_request_id {
            put("disagg_request_id", id.map_or(Value::Nil, Value::from));
        }
        put("handoff", Value::Map(self.handoff));
        put("prefill_output", Value::Map(self.prefill_output));
        if let Some(request) = self.request {
            put("request", request);
        }
        put("worker", worker(self.instance_id, self.machine_id));
        if let Some(ms) = self.deadline_ms {
            put("deadline_ms", Value::from(ms));
        }
        if let Some(ms) = self.kv_expires_ms {
            put("kv_expires_ms", Value::from(ms));
        }
        job.extend(self.extra.into_iter().filter(|(k, _)| {
            k.as_str()
                .is_none_or(|name| !DECODE_JOB_KEYS.contains(&name))
        }));
        Value::Map(job)
    }
}

/// `{"instance_id": "<lease hex>", "machine_id": N or null}`: who handled a
/// result, in decode jobs and KV release notices.
fn worker(instance_id: InstanceId, machine_id: Option<MachineId>) -> Value {
    from_pairs([
        ("instance_id", Value::from(instance_id.as_str())),
        (
            "machine_id",
            machine_id.map_or(Value::Nil, |m| Value::from(m.get())),
        ),
    ])
}

/// A KV release notice (contract 10): `{"request_id", "reason", "backend",
/// "handoff": <the engine's params as received>, "worker"}`, for a handoff
/// refused as `cancelled` or `deadline_exceeded`, so that the prefill
/// engine frees the KV blocks at once.
pub fn release_notice(
    request_id: &str,
    reason: &str,
    backend: Backend,
    handoff: Value,
    instance_id: InstanceId,
    machine_id: Option<MachineId>,
) -> Value {
    from_pairs([
        ("request_id", Value::from(request_id)),
        ("reason", Value::from(reason)),
        ("backend", Value::from(backend.as_str())),
        ("handoff", handoff),
        ("worker", worker(instance_id, machine_id)),
    ])
}

/// The ID mint service's answer: `{"ids": [..], "machine_id": N, "layout": "rc22"}`.
pub fn mint_response(ids: &[u64], machine_id: MachineId, layout: IdLayout) -> Value {
    from_pairs([
        (
            "ids",
            Value::Array(ids.iter().map(|id| Value::from(*id)).collect()),
        ),
        ("machine_id", Value::from(machine_id.get())),
        ("layout", Value::from(layout.as_str())),
    ])
}

/// Formats a lease ID as the contract's instance ID: 16 lower-case hex digits.
pub fn instance_id(lease_id: i64) -> String {
    InstanceId::of(lease_id).as_str().to_owned()
}

/// The contract's instance ID, as digits on the stack: a decode job writes
/// it without allocating a string per message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceId([u8; 16]);

impl InstanceId {
    pub fn of(lease_id: i64) -> InstanceId {
        // By hand: `format!("{:016x}")` pads one character at a time through
        // the formatter, a visible share of every decode job's cost.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let v = lease_id as u64;
        let mut digits = [0u8; 16];
        for (i, digit) in digits.iter_mut().enumerate() {
            *digit = HEX[((v >> (60 - 4 * i)) & 0xf) as usize];
        }
        InstanceId(digits)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn as_str(&self) -> &str {
        // Hex digits are ASCII: the conversion cannot fail.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn instance_ids_are_16_lower_case_hex_digits() {
        for lease in [0, 1, 0x7fff_ffff_ffff_ffff, -1, 0x0123_4567_89ab_cdef] {
            assert_eq!(super::instance_id(lease), format!("{:016x}", lease as u64));
        }
    }
}
