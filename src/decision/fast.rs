//! The decision for the common MessagePack cases without building value
//! trees: the body is scanned once, the few scalars the decision needs are
//! read in place, and the output is spliced from byte spans of the input.
//!
//! [`decide`] answers only when it is sure its answer is the one the
//! value-tree path would give, byte for byte: a canonically encoded body
//! (see [`scan`]) whose result is a TensorRT-LLM or opaque decode
//! handoff or a terminal response with a string finish reason. For anything
//! else — errors, dead letters, SGLang and vLLM handoffs, duplicate keys,
//! maps wider than [`WIDE`] — it returns `None` before any side effect (no
//! ID is minted) and the caller takes the value-tree path.

use super::handoff::{TRTLLM_KEYS, VLLM_KEYS};
use super::{Backend, Decision, FinishReason, IdSource, Input, Outcome, Rules, msg_id};
use crate::decision::request::MAX_REQUEST_ID_BYTES;
use crate::wire::messages::DECODE_JOB_KEYS;
use crate::wire::msgpack::{write_map_len, write_str, write_uint};
use crate::wire::{Encoding, scan};

/// The most entries a map read here may have; wider ones take the tree path.
const WIDE: usize = 16;
const MAX_I63: u64 = (1 << 63) - 1;

type Span<'a> = &'a [u8];

/// A map's entries as spans, in order.
struct Fields<'a> {
    entries: [(Span<'a>, Span<'a>); WIDE],
    len: usize,
}

impl<'a> Fields<'a> {
    /// The entries of a map span with at most [`WIDE`] entries and no string
    /// key twice.
    fn of(raw: Span<'a>) -> Option<Fields<'a>> {
        let (n, mut spans) = scan::entries(raw)?;
        if n > WIDE {
            return None;
        }
        let mut fields = Fields::new();
        for _ in 0..n {
            fields.push(spans.next()?, spans.next()?)?;
        }
        fields.unique()
    }

    /// The entries of a whole body, validated in the same pass (see
    /// [`scan::validate_entries`]).
    fn of_body(body: Span<'a>) -> Option<Fields<'a>> {
        let mut fields = Fields::new();
        scan::validate_entries(body, |k, v| fields.push(k, v))?;
        fields.unique()
    }

    fn new() -> Fields<'a> {
        Fields {
            entries: [(&[][..], &[][..]); WIDE],
            len: 0,
        }
    }

    fn push(&mut self, key: Span<'a>, value: Span<'a>) -> Option<()> {
        *self.entries.get_mut(self.len)? = (key, value);
        self.len += 1;
        Some(())
    }

    /// The fields, when no string key appears twice.
    fn unique(self) -> Option<Fields<'a>> {
        let fields = self;
        let keys = || fields.iter().filter_map(|(k, _)| scan::str_bytes(k));
        for (i, key) in keys().enumerate() {
            if keys().take(i).any(|other| other == key) {
                return None;
            }
        }
        Some(fields)
    }

    fn iter(&self) -> impl Iterator<Item = &(Span<'a>, Span<'a>)> {
        self.entries[..self.len].iter()
    }

    /// The value under a string key.
    fn get(&self, key: &str) -> Option<Span<'a>> {
        self.iter()
            .find(|(k, _)| scan::str_bytes(k) == Some(key.as_bytes()))
            .map(|(_, v)| *v)
    }

    /// Like [`Fields::get`], with a present `nil` counted as absent.
    fn get_non_nil(&self, key: &str) -> Option<Span<'a>> {
        self.get(key).filter(|v| !scan::is_nil(v))
    }
}

fn is_key(key: Span<'_>, names: &[&str]) -> bool {
    scan::str_bytes(key).is_some_and(|k| names.iter().any(|n| n.as_bytes() == k))
}

/// A UTF-8 string value.
fn utf8(raw: Span<'_>) -> Option<&str> {
    std::str::from_utf8(scan::str_bytes(raw)?).ok()
}

/// The decision for `input`, or `None` when the value-tree path must decide.
pub(super) fn decide(input: Input<'_>, rules: &Rules, ids: &mut dyn IdSource) -> Option<Decision> {
    let body = input.payload;
    if input.encoding != Encoding::MsgPack || body.len() > rules.max_payload_bytes {
        return None;
    }
    let top = Fields::of_body(body)?;
    let reply_to = match top.get_non_nil("reply_to") {
        Some(raw) => utf8(raw)?,
        None => input.nats_reply.filter(|_| rules.use_nats_reply)?,
    };
    rules.reply_policy.check(reply_to).ok()?;
    let request_id = utf8(top.get("request_id")?)?;
    if !(1..=MAX_REQUEST_ID_BYTES).contains(&request_id.len()) {
        return None;
    }
    let (count, mut frames) = scan::items(top.get("frames")?)?;
    let first = frames.next()?;
    for frame in frames {
        scan::entries(frame)?;
    }
    let request = match top.get("request") {
        Some(raw) if scan::is_nil(raw) => None,
        Some(raw) => Some(raw).filter(|raw| scan::entries(raw).is_some()),
        None => None,
    };
    if request.is_none() && top.get_non_nil("request").is_some() {
        return None;
    }
    let frame = Fields::of(first)?;
    if frame.get_non_nil("error").is_some() {
        return None;
    }
    let answer = Answer {
        request_id,
        reply_to,
        frame: &frame,
        trailing: count - 1,
        capacity: body.len() + 128,
    };
    match frame.get_non_nil("finish_reason") {
        Some(reason) => match utf8(reason)? {
            "length" | "not_finished" => answer.handoff(&top, request, rules, ids),
            label => Some(answer.terminal(FinishReason::from_label(label))),
        },
        None => answer.handoff(&top, request, rules, ids),
    }
}

/// What every output of one input shares.
struct Answer<'a, 'f> {
    request_id: &'a str,
    reply_to: &'a str,
    frame: &'f Fields<'a>,
    trailing: usize,
    capacity: usize,
}

impl Answer<'_, '_> {
    /// The first frame without `disaggregated_params`.
    fn write_output(&self, out: &mut Vec<u8>) {
        let is_params = |k: &[u8]| is_key(k, &["disaggregated_params"]);
        let kept = self.frame.iter().filter(|(k, _)| !is_params(k)).count();
        write_map_len(out, kept);
        for (k, v) in self.frame.iter().filter(|(k, _)| !is_params(k)) {
            out.extend_from_slice(k);
            out.extend_from_slice(v);
        }
    }

    fn terminal(self, finish_reason: FinishReason) -> Decision {
        let mut out = Vec::with_capacity(self.capacity);
        write_map_len(&mut out, 3);
        write_str(&mut out, b"request_id");
        write_str(&mut out, self.request_id.as_bytes());
        write_str(&mut out, b"kind");
        write_str(&mut out, b"terminal");
        write_str(&mut out, b"output");
        self.write_output(&mut out);
        Decision {
            outcome: Outcome::Terminal { finish_reason },
            request_id: Some(self.request_id.to_string()),
            subject: self.reply_to.to_string(),
            headers: Vec::new(),
            payload: out,
            trailing_frames: self.trailing,
            detail: None,
        }
    }

    fn handoff(
        self,
        top: &Fields<'_>,
        request: Option<Span<'_>>,
        rules: &Rules,
        ids: &mut dyn IdSource,
    ) -> Option<Decision> {
        let params = Fields::of(self.frame.get("disaggregated_params")?)?;
        let has_any = |keys: &[&str]| params.iter().any(|(k, _)| is_key(k, keys));
        let trtllm = has_any(&TRTLLM_KEYS);
        let other_engine = params
            .iter()
            .any(|(k, _)| scan::str_bytes(k).is_some_and(|k| k.starts_with(b"bootstrap_")))
            || has_any(&VLLM_KEYS);
        if !trtllm && other_engine {
            return None;
        }
        let mut minted = (false, None);
        let disagg = if trtllm {
            scan::uint(params.get_non_nil("ctx_request_id")?).filter(|id| *id <= MAX_I63)?;
            if let Some(kind) = params.get_non_nil("request_type") {
                (utf8(kind)? == "context_only").then_some(())?;
            }
            Some(match params.get_non_nil("disagg_request_id") {
                Some(raw) => scan::uint(raw).filter(|id| (1..MAX_I63).contains(id))?,
                None => {
                    // The last check: nothing after this may decline.
                    let (id, slot) = ids.mint_in_slot().ok()?;
                    minted = (true, slot);
                    id
                }
            })
        } else {
            None
        };
        let machine_id = if minted.0 { minted.1 } else { ids.machine_id() };
        let instance_id = ids.instance_id();
        let backend = if trtllm {
            Backend::Trtllm
        } else {
            Backend::Opaque
        };
        let taken = ["frames", "request", "request_id", "reply_to"];
        let extra = || {
            top.iter()
                .filter(|(k, _)| !is_key(k, &taken) && !is_key(k, &DECODE_JOB_KEYS))
        };
        let own = 6 + usize::from(disagg.is_some()) + usize::from(request.is_some());
        let mut out = Vec::with_capacity(self.capacity);
        write_map_len(&mut out, own + extra().count());
        for (key, value) in [
            ("request_id", self.request_id),
            ("reply_to", self.reply_to),
            ("backend", backend.as_str()),
        ] {
            write_str(&mut out, key.as_bytes());
            write_str(&mut out, value.as_bytes());
        }
        if let Some(id) = disagg {
            write_str(&mut out, b"disagg_request_id");
            write_uint(&mut out, id);
        }
        write_str(&mut out, b"handoff");
        write_params(&mut out, &params, disagg);
        write_str(&mut out, b"prefill_output");
        self.write_output(&mut out);
        if let Some(request) = request {
            write_str(&mut out, b"request");
            out.extend_from_slice(request);
        }
        write_str(&mut out, b"worker");
        write_map_len(&mut out, 2);
        write_str(&mut out, b"instance_id");
        write_str(&mut out, instance_id.as_bytes());
        write_str(&mut out, b"machine_id");
        match machine_id {
            Some(m) => write_uint(&mut out, u64::from(m.get())),
            None => out.push(0xc0),
        }
        for (k, v) in extra() {
            out.extend_from_slice(k);
            out.extend_from_slice(v);
        }
        Some(Decision {
            outcome: Outcome::Decode {
                backend,
                minted: minted.0,
            },
            request_id: Some(self.request_id.to_string()),
            subject: rules.gen_subject.clone(),
            headers: vec![("Nats-Msg-Id", msg_id(self.request_id))],
            payload: out,
            trailing_frames: self.trailing,
            detail: None,
        })
    }
}

/// The params as they go to decode: for TensorRT-LLM (`disagg` is `Some`),
/// `request_type` and `disagg_request_id` set in place or appended in that
/// order; otherwise unchanged.
fn write_params(out: &mut Vec<u8>, params: &Fields<'_>, disagg: Option<u64>) {
    let Some(id) = disagg else {
        write_map_len(out, params.len);
        for (k, v) in params.iter() {
            out.extend_from_slice(k);
            out.extend_from_slice(v);
        }
        return;
    };
    let has_type = params.get("request_type").is_some();
    let has_id = params.get("disagg_request_id").is_some();
    write_map_len(
        out,
        params.len + usize::from(!has_type) + usize::from(!has_id),
    );
    for (k, v) in params.iter() {
        out.extend_from_slice(k);
        if is_key(k, &["request_type"]) {
            write_str(out, b"generation_only");
        } else if is_key(k, &["disagg_request_id"]) {
            write_uint(out, id);
        } else {
            out.extend_from_slice(v);
        }
    }
    if !has_type {
        write_str(out, b"request_type");
        write_str(out, b"generation_only");
    }
    if !has_id {
        write_str(out, b"disagg_request_id");
        write_uint(out, id);
    }
}
