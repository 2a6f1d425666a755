//! The decision for the common MessagePack cases without building value
//! trees: the body is validated in one pass that keeps the byte spans of the
//! few maps the decision reads (top level, first frame, its params), the
//! scalars it needs are read in place, and the output is spliced from spans
//! of the input.
//!
//! [`decide_msgpack`] answers only when it is sure its answer is the one the
//! value-tree path would give, byte for byte: a canonically encoded body
//! (see [`scan`]) whose result is a TensorRT-LLM, SGLang, vLLM or opaque
//! decode handoff, its refusal once the params passed validation (with the
//! KV release notice), a terminal response with a string finish reason, or
//! the error response for a prefill error given as a string or a
//! TensorRT-LLM handoff without `ctx_request_id` (the common errors, which
//! would otherwise cost a value tree each). For anything else — other
//! errors, dead letters, duplicate keys, maps wider than [`WIDEST`] — it
//! returns `None` before any side effect (no ID is minted) and the caller
//! takes the value-tree path.
//!
//! Why: walking the body once to validate and again for each map read (the
//! first frame three times) costs several times this one pass, in which
//! spans are compared as raw bytes and the output is copied in contiguous
//! runs. The current cost per decision is in `docs/performance.md`.

use super::deadline;
use super::handoff::{self, DisaggId};
use super::known::{Key, NOT_PASSED_ON, Set, fixstr};
use super::{
    Backend, Decision, ErrorCode, FinishReason, IdSource, Input, Outcome, Release, Rules,
    prefill_failed,
};
use crate::decision::request::MAX_REQUEST_ID_BYTES;
use crate::headers::Headers;
use crate::wire::msgpack::{write_map_len, write_str, write_uint};
use crate::wire::{Encoding, scan};
use smallvec::SmallVec;

/// The most entries a map read here holds inline; a wider one's entries are
/// held on the heap.
const WIDE: usize = 16;
/// The most entries of one map read here; a wider map takes the tree path
/// (and its bound): each entry held is two spans and a kind, and a 1 MiB
/// map of one-byte keys would have hundreds of thousands.
const WIDEST: usize = 4096;

type Span<'a> = &'a [u8];

/// A UTF-8 string value. Request IDs, subjects and the params' strings are
/// ASCII: `is_ascii` checks them inline a word at a time, where each
/// `from_utf8` is a call into its general check, several per result (the
/// figure is in docs/performance.md's "Figures behind choices in the code").
#[inline]
fn utf8(raw: Span<'_>) -> Option<&str> {
    let bytes = scan::str_bytes(raw)?;
    if bytes.is_ascii() {
        // SAFETY: every ASCII byte sequence is valid UTF-8.
        return Some(unsafe { std::str::from_utf8_unchecked(bytes) });
    }
    std::str::from_utf8(bytes).ok()
}

/// A map's entries as spans, in order, with what each key is
/// ([`Key::of`]), and which keys are there. Up to [`WIDE`] entries are held
/// inline (a decision builds several of these per result), a wider map's
/// (at most [`WIDEST`]) on the heap.
struct Fields<'a> {
    entries: SmallVec<[Entry<'a>; WIDE]>,
    /// The keys present, one bit each.
    present: Set,
    /// The buckets of the keys ([`bucket`]), one bit each.
    buckets: u64,
    /// The buckets seen again: a key in one of them may be there twice.
    again: u64,
}

impl<'a> Fields<'a> {
    // Inlined, so that the entries are not built elsewhere and copied.
    #[inline(always)]
    fn new() -> Fields<'a> {
        Fields {
            entries: SmallVec::new(),
            present: 0,
            buckets: 0,
            again: 0,
        }
    }

    #[cfg(test)]
    fn push(&mut self, entry: (Span<'a>, Span<'a>)) {
        self.push_kind(entry, Key::of(entry.0));
    }

    /// Appends an entry whose key is `kind`. Inlined into the map's read,
    /// its one caller on the hot path.
    #[inline(always)]
    fn push_kind(&mut self, (key, value): (Span<'a>, Span<'a>), kind: Key) {
        self.entries.push(Entry { key, value, kind });
        self.present |= kind.bit();
        let bucket = 1u64 << bucket(key, kind);
        self.again |= self.buckets & bucket;
        self.buckets |= bucket;
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.present = 0;
        self.buckets = 0;
        self.again = 0;
    }

    /// The entries read so far.
    fn all(&self) -> &[Entry<'a>] {
        &self.entries
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    /// Reads and validates the map at `pos` of `b`, which sits in `depth`
    /// containers: its entries, no string key twice. Each
    /// value's end comes from `value`, given the key's kind, where the value starts
    /// and its depth (a reader of its own for the values the decision looks
    /// into, [`scan::value_end`] for the rest). Returns the map's end.
    fn read(
        &mut self,
        b: &'a [u8],
        pos: usize,
        depth: usize,
        mut value: impl FnMut(Key, usize, usize) -> Option<usize>,
    ) -> Option<usize> {
        let (n, start) = scan::map_header(b.get(pos..)?)?;
        if !crate::wire::may_open(depth) {
            return None;
        }
        if n > WIDE {
            // Each entry takes at least two bytes: a length past the input
            // would be refused by the walk, but not before its reservation.
            (n <= WIDEST && n <= b.len() / 2).then_some(())?;
            self.entries.reserve_exact(n);
        }
        let mut p = pos + start;
        for _ in 0..n {
            // A key is nearly always a fixstr: its span without the
            // walker's class table, and with one bound check for its end.
            let rest = b.get(p..)?;
            let marker = *rest.first()?;
            let key = if marker & 0xe0 == 0xa0 {
                rest.get(..1 + usize::from(marker & 0x1f))?
            } else {
                b.get(p..scan::value_end(b, p, depth + 1)?)?
            };
            let key_end = p + key.len();
            let kind = Key::of(key);
            let end = value(kind, key_end, depth + 1)?;
            self.push_kind((key, b.get(key_end..end)?), kind);
            p = end;
        }
        let unique = if self.len() > WIDE {
            self.unique_wide()
        } else {
            self.unique()
        };
        unique.then_some(p)
    }

    /// No string key twice. Spans of equal canonical strings are equal, and
    /// so are their buckets: keys are compared only in a bucket that more
    /// than one key of this map fell in (as [`Fields::push_kind`] notes).
    /// Inlined, so that the common answer (no bucket twice) costs no call.
    #[inline(always)]
    fn unique(&self) -> bool {
        self.again == 0 || self.unique_in_buckets()
    }

    /// [`Fields::unique`] for a map wider than [`WIDE`], where most buckets
    /// hold several keys: a hash set of the string keys, linear in the
    /// entries whatever they are.
    #[inline(never)]
    fn unique_wide(&self) -> bool {
        let mut seen = foldhash::HashSet::with_capacity_and_hasher(
            self.len(),
            foldhash::fast::RandomState::default(),
        );
        self.all()
            .iter()
            .filter(|e| scan::str_bytes(e.key).is_some())
            .all(|e| seen.insert(e.key))
    }

    /// [`Fields::unique`] when some bucket holds more than one key.
    #[inline(never)]
    fn unique_in_buckets(&self) -> bool {
        let entries = self.all();
        !entries
            .iter()
            .enumerate()
            .any(|(i, Entry { key, kind, .. })| {
                self.again & (1u64 << bucket(key, *kind)) != 0
                    && scan::str_bytes(key).is_some()
                    && entries[..i].iter().any(|e| e.key == *key)
            })
    }

    fn iter(&self) -> std::slice::Iter<'_, Entry<'a>> {
        self.all().iter()
    }

    /// The value under `key`.
    fn get(&self, key: Key) -> Option<Span<'a>> {
        if !key.is_in(self.present) {
            return None;
        }
        self.iter().find(|e| e.kind == key).map(|e| e.value)
    }

    /// Like [`Fields::get`], with a present `nil` counted as absent.
    fn get_non_nil(&self, key: Key) -> Option<Span<'a>> {
        self.get(key).filter(|v| !scan::is_nil(v))
    }

    /// Whether a key of `set` is there.
    fn has_any(&self, set: Set) -> bool {
        self.present & set != 0
    }
}

/// A map entry: the spans of its key and value, and what the key is.
struct Entry<'a> {
    key: Span<'a>,
    value: Span<'a>,
    kind: Key,
}

/// A key's bucket for the duplicate-key check, one of 64: the same for
/// equal spans (and so equal keys). A name has one of its own; other keys
/// share the upper 32 by their length and last byte.
#[inline(always)]
fn bucket(key: Span<'_>, kind: Key) -> u32 {
    match kind {
        Key::Other => 32 | (key.len() as u32 + key.last().map_or(0, |b| u32::from(*b))) & 31,
        name => name as u32,
    }
}

/// The parts of a body the decision reads, from one validating pass.
struct Body<'a> {
    top: Fields<'a>,
    /// How many frames, when `frames` is an array whose first item is a map
    /// read into `frame`.
    frames: Option<usize>,
    frame: Fields<'a>,
    /// The first frame's `disaggregated_params`, when `has_params`: a map
    /// with no key twice (else the tree path decides a handoff; a terminal
    /// response never looks into it).
    params: Fields<'a>,
    has_params: bool,
    /// The params' `kv_transfer_params` (Dynamo's nesting of vLLM's), when
    /// `has_nested`: a map with no key twice.
    nested: Fields<'a>,
    has_nested: bool,
}

impl<'a> Body<'a> {
    #[inline(always)]
    fn new() -> Body<'a> {
        Body {
            top: Fields::new(),
            frames: None,
            frame: Fields::new(),
            params: Fields::new(),
            has_params: false,
            nested: Fields::new(),
            has_nested: false,
        }
    }

    /// Reads the body into `self` (read in place: moving the [`Fields`]
    /// out of a constructor copied kilobytes per decision), when it is one
    /// valid, canonical map with no key twice, whose `frames` (if it is an
    /// array with items) starts with such a map and holds only maps.
    fn read(&mut self, b: &'a [u8]) -> Option<()> {
        let Body {
            top,
            frames,
            frame,
            params,
            has_params,
            nested,
            has_nested,
        } = self;
        let end = top.read(b, 0, 0, |kind, p, depth| {
            if kind != Key::Frames || frames.is_some() {
                return scan::value_end(b, p, depth);
            }
            let Some((n, start)) = scan::array_header(b.get(p..)?) else {
                return scan::value_end(b, p, depth);
            };
            if n == 0 {
                return Some(p + start);
            }
            *frames = Some(n);
            let mut p = frame.read(b, p + start, depth + 1, |kind, p, depth| {
                if kind != Key::DisaggregatedParams {
                    return scan::value_end(b, p, depth);
                }
                // Twice in the frame: the frame's duplicate-key check
                // declines the body after this.
                params.clear();
                *has_params = false;
                nested.clear();
                *has_nested = false;
                let params_value = |kind: Key, p: usize, depth: usize| {
                    if kind != Key::KvTransferParams {
                        return scan::value_end(b, p, depth);
                    }
                    // Twice in the params: their duplicate-key check
                    // declines the body after this.
                    nested.clear();
                    let read = nested.read(b, p, depth, |_, p, depth| scan::value_end(b, p, depth));
                    *has_nested = read.is_some();
                    read.or_else(|| scan::value_end(b, p, depth))
                };
                match params.read(b, p, depth, params_value) {
                    Some(end) => {
                        *has_params = true;
                        Some(end)
                    }
                    None => scan::value_end(b, p, depth),
                }
            })?;
            for _ in 1..n {
                scan::map_header(b.get(p..)?)?;
                p = scan::value_end(b, p, depth + 1)?;
            }
            Some(p)
        })?;
        (end == b.len()).then_some(())
    }

    /// The first frame's `disaggregated_params`, when read.
    fn params(&self) -> Option<&Fields<'a>> {
        self.has_params.then_some(&self.params)
    }

    /// The params' `kv_transfer_params` map, when read.
    fn nested(&self) -> Option<&Fields<'a>> {
        self.has_nested.then_some(&self.nested)
    }
}

/// [`super::decide`] on a MessagePack input's bytes in place, or `None`
/// (with no ID minted) when the input is not one of the cases handled that
/// way and the value-tree path must decide.
pub(super) fn decide_msgpack(
    input: Input<'_>,
    rules: &Rules,
    ids: &mut dyn IdSource,
) -> Option<Decision> {
    let body = input.payload;
    if input.encoding != Encoding::MsgPack || body.len() > rules.max_payload_bytes {
        return None;
    }
    let mut read = Body::new();
    read.read(body)?;
    let (top, frame) = (&read.top, &read.frame);
    let (reply_to, reply_to_raw) = match top.get_non_nil(Key::ReplyTo) {
        Some(raw) => (utf8(raw)?, Some(raw)),
        None => (input.nats_reply.filter(|_| rules.use_nats_reply)?, None),
    };
    rules.reply_policy.check(reply_to).ok()?;
    let request_id_raw = top.get(Key::RequestId)?;
    let request_id = utf8(request_id_raw)?;
    if !(1..=MAX_REQUEST_ID_BYTES).contains(&request_id.len()) {
        return None;
    }
    let count = read.frames?;
    let request = match top.get(Key::Request) {
        Some(raw) if scan::is_nil(raw) => None,
        Some(raw) => {
            scan::map_header(raw)?;
            Some(raw)
        }
        None => None,
    };
    // The deadline (`deadline::effective`) and the KV's expiry
    // (`deadline::kv_expires`). Not a time: the tree path describes it.
    let deadline = epoch_ms(top.get(Key::DeadlineMs), input.deadline_header)?;
    let kv_expires = epoch_ms(top.get(Key::KvExpiresMs), input.kv_expires_header)?;
    // Rule 2, for an error given as a string (the tree path renders
    // anything else).
    let error = match frame.get_non_nil(Key::Error) {
        Some(raw) => Some(utf8(raw)?),
        None => None,
    };
    let answer = Answer {
        body,
        request_id,
        request_id_raw,
        reply_to,
        reply_to_raw,
        frame,
        trailing: count - 1,
        capacity: body.len() + 128,
        deadline,
        kv_expires,
    };
    if let Some(text) = error {
        return Some(answer.error(ErrorCode::PrefillFailed, prefill_failed(text)));
    }
    match frame.get_non_nil(Key::FinishReason) {
        Some(reason) => match utf8(reason)? {
            "length" | "not_finished" => answer.handoff(&read, request, input, rules, ids),
            label => Some(answer.terminal(FinishReason::from_label(label))),
        },
        None => answer.handoff(&read, request, input, rules, ids),
    }
}

/// A time in a top-level field and a header, the earlier of the two
/// (`deadline::effective`, `deadline::kv_expires`): `None` when either is not
/// a time (the tree path describes it).
fn epoch_ms(field: Option<Span<'_>>, header: Option<&str>) -> Option<Option<u64>> {
    let from_field = match field {
        Some(raw) if !scan::is_nil(raw) => {
            Some(scan::uint(raw).filter(|ms| *ms <= deadline::MAX_DEADLINE_MS)?)
        }
        _ => None,
    };
    let Some(raw) = header else {
        return Some(from_field);
    };
    let header = deadline::parse_header(raw)?;
    Some(Some(from_field.map_or(header, |field| field.min(header))))
}

/// The output: bytes written here, and spans of the input copied as they
/// are, entries read one after the other from one map in one piece.
///
/// Spans are written as they come. Gathering spans that happen to follow
/// each other in the input into one pending run would save a copy now and
/// then, but its bookkeeping on every write costs more than it saves.
struct Out<'a> {
    buf: Vec<u8>,
    input: &'a [u8],
}

impl<'a> Out<'a> {
    fn new(input: &'a [u8], capacity: usize) -> Out<'a> {
        Out {
            buf: Vec::with_capacity(capacity),
            input,
        }
    }

    /// Appends a span of the input.
    fn span(&mut self, span: Span<'a>) {
        self.buf.extend_from_slice(span);
    }

    /// Appends an entry, its key and value in one piece.
    fn entry(&mut self, entry: &Entry<'a>) {
        self.entries(std::slice::from_ref(entry));
    }

    /// Appends entries read one after the other from one map: one piece of
    /// the input, from the first key to the last value (one copy instead
    /// of a span per key and value).
    fn entries(&mut self, entries: &[Entry<'a>]) {
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return;
        };
        debug_assert!(entries.windows(2).all(|pair| {
            let end = self.offset(pair[0].value) + pair[0].value.len();
            self.offset(pair[0].value) == self.offset(pair[0].key) + pair[0].key.len()
                && end == self.offset(pair[1].key)
        }));
        self.piece(
            self.offset(first.key),
            self.offset(last.value) + last.value.len(),
        );
    }

    /// Appends entries read one after the other from one map and then the
    /// key of the next one (whose value is replaced): one piece of the
    /// input.
    fn entries_and_key(&mut self, entries: &[Entry<'a>], next: &Entry<'a>) {
        debug_assert!(entries.last().is_none_or(|last| {
            self.offset(last.value) + last.value.len() == self.offset(next.key)
        }));
        let start = match entries.first() {
            Some(first) => self.offset(first.key),
            None => self.offset(next.key),
        };
        self.piece(start, self.offset(next.key) + next.key.len());
    }

    /// Appends the input's bytes `start..end`.
    fn piece(&mut self, start: usize, end: usize) {
        self.buf.extend_from_slice(&self.input[start..end]);
    }

    /// Where a span of the input starts in it.
    fn offset(&self, span: Span<'a>) -> usize {
        span.as_ptr() as usize - self.input.as_ptr() as usize
    }

    /// The writer for bytes that are not the input's.
    fn own(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Appends bytes already encoded (a constant key, `nil`), their length
    /// known when compiled: the copy is a few moves.
    #[inline(always)]
    fn put<const N: usize>(&mut self, encoded: &[u8; N]) {
        self.buf.extend_from_slice(encoded);
    }

    fn str(&mut self, s: &[u8]) {
        write_str(&mut self.buf, s);
    }

    fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// What every output of one input shares.
struct Answer<'a, 'f> {
    body: &'a [u8],
    request_id: &'a str,
    /// `request_id` as the input has it: canonical, so written as it is.
    request_id_raw: Span<'a>,
    reply_to: &'a str,
    /// `reply_to` as the input has it, when it came from the input.
    reply_to_raw: Option<Span<'a>>,
    frame: &'f Fields<'a>,
    trailing: usize,
    capacity: usize,
    /// The effective deadline, read before any rule.
    deadline: Option<u64>,
    /// When the KV is freed, as the result says (field or header).
    kv_expires: Option<u64>,
}

impl<'a> Answer<'a, '_> {
    /// The first frame without `disaggregated_params`.
    fn write_output(&self, out: &mut Out<'a>) {
        let entries = self.frame.all();
        // No key twice: at most one entry is the params.
        match entries
            .iter()
            .position(|e| e.kind == Key::DisaggregatedParams)
        {
            Some(i) => {
                write_map_len(out.own(), entries.len() - 1);
                out.entries(&entries[..i]);
                out.entries(&entries[i + 1..]);
            }
            None => {
                write_map_len(out.own(), entries.len());
                out.entries(entries);
            }
        }
    }

    /// An error response: `{request_id, kind: "error", error: {code,
    /// message}}`, as `messages::error_response` has it.
    fn error(self, code: ErrorCode, message: String) -> Decision {
        let mut out = Vec::with_capacity(64 + self.request_id.len() + message.len());
        write_map_len(&mut out, 3);
        out.extend_from_slice(fixstr!("request_id"));
        write_str(&mut out, self.request_id.as_bytes());
        out.extend_from_slice(fixstr!("kind"));
        out.extend_from_slice(fixstr!("error"));
        out.extend_from_slice(fixstr!("error"));
        write_map_len(&mut out, 2);
        out.extend_from_slice(fixstr!("code"));
        write_str(&mut out, code.as_str().as_bytes());
        out.extend_from_slice(fixstr!("message"));
        write_str(&mut out, message.as_bytes());
        Decision {
            outcome: Outcome::Error { code },
            request_id: Some(self.request_id.to_string()),
            subject: self.reply_to.into(),
            headers: Headers::new(),
            payload: out,
            trailing_frames: self.trailing,
            detail: Some(message),
            deadline_ms: self.deadline,
            kv_expires_ms: None,
            release: None,
        }
    }

    /// The error response for a handoff refused after its parameters passed
    /// validation, with its KV release notice (as `Reply::refused` has it):
    /// `{request_id, reason, backend, handoff: <the params as received>,
    /// worker}`.
    fn refused(
        self,
        (code, message): (ErrorCode, String),
        backend: Backend,
        params: Span<'a>,
        ids: &dyn IdSource,
        rules: &Rules,
    ) -> Decision {
        let mut out = Vec::with_capacity(96 + self.request_id_raw.len() + params.len());
        write_map_len(&mut out, 5);
        out.extend_from_slice(fixstr!("request_id"));
        out.extend_from_slice(self.request_id_raw);
        out.extend_from_slice(fixstr!("reason"));
        write_str(&mut out, code.as_str().as_bytes());
        out.extend_from_slice(fixstr!("backend"));
        write_str(&mut out, backend.as_str().as_bytes());
        out.extend_from_slice(fixstr!("handoff"));
        out.extend_from_slice(params);
        write_worker(&mut out, ids.instance_id(), ids.machine_id());
        let release = Release {
            subject: rules.release_subject.clone(),
            headers: Headers::release(self.request_id),
            payload: out,
        };
        Decision {
            release: Some(Box::new(release)),
            ..self.error(code, message)
        }
    }

    fn terminal(self, finish_reason: FinishReason) -> Decision {
        let mut out = Out::new(self.body, self.capacity);
        write_map_len(out.own(), 3);
        out.put(fixstr!("request_id"));
        out.span(self.request_id_raw);
        out.put(fixstr!("kind"));
        out.put(fixstr!("terminal"));
        out.put(fixstr!("output"));
        self.write_output(&mut out);
        Decision {
            outcome: Outcome::Terminal { finish_reason },
            request_id: Some(self.request_id.to_string()),
            subject: self.reply_to.into(),
            headers: Headers::new(),
            payload: out.finish(),
            trailing_frames: self.trailing,
            detail: None,
            deadline_ms: self.deadline,
            kv_expires_ms: None,
            release: None,
        }
    }

    /// The decode job, or the refusal of a handoff that was cancelled or
    /// came past its deadline. Long, and not split: the job's fields are
    /// written in their wire order in one pass over the input's spans, each
    /// a few lines; pieces would hand the same borrowed spans, the minted ID
    /// and the output buffer from one to the next.
    #[expect(clippy::too_many_lines, reason = "one pass in wire order; see above")]
    fn handoff(
        self,
        read: &Body<'a>,
        request: Option<Span<'a>>,
        input: Input<'_>,
        rules: &Rules,
        ids: &mut dyn IdSource,
    ) -> Option<Decision> {
        let top = &read.top;
        let params = InPlace {
            fields: read.params()?,
            nested: read.nested(),
        };
        let (backend, kept) = match handoff::check_params(&params) {
            Ok(checked) => checked,
            // The one refusal answered here; the tree path describes the rest.
            Err((code @ ErrorCode::MissingCtxRequestId, why)) => {
                return Some(self.error(code, why));
            }
            Err(_) => return None,
        };
        let params = params.fields;
        // From here on every refusal frees the KV: its notice names the
        // params map as received (the frame holds its span).
        let raw_params = self.frame.get(Key::DisaggregatedParams)?;
        let pending = handoff::Pending {
            request_id: self.request_id,
            backend,
            deadline: self.deadline,
            kv_expires: self.kv_expires,
            kept,
        };
        // The last step: nothing after this may decline (an ID may be
        // minted here).
        let (kv_expires, disagg) = match handoff::admit(pending, input, rules, ids) {
            (kv_expires, Ok(disagg)) => (kv_expires, disagg),
            (_, Err(refusal)) => {
                return Some(self.refused(refusal, backend, raw_params, ids, rules));
            }
        };
        let minted = match disagg {
            Some(DisaggId::Minted(minted)) => Some(minted),
            _ => None,
        };
        let disagg = disagg.map(DisaggId::id);
        let (machine_id, instance_id) = match minted {
            Some(job) => (job.machine_id, job.instance_id),
            None => (ids.machine_id(), ids.instance_id()),
        };
        // The input's other top-level entries, passed on after the job's own.
        let passed_on = |kind: Key| !kind.is_in(NOT_PASSED_ON);
        // No key twice: each kind present is one entry.
        let extras = top.len() - (top.present & NOT_PASSED_ON).count_ones() as usize;
        let own = 6
            + usize::from(disagg.is_some())
            + usize::from(request.is_some())
            + usize::from(self.deadline.is_some())
            + usize::from(kv_expires.is_some());
        let mut out = Out::new(self.body, self.capacity);
        write_map_len(out.own(), own + extras);
        // `"request_id": …, "reply_to": …`. A value's key is the name it
        // was recognized by, byte for byte, just before it: when the input
        // has these two entries one after the other (as dispatchers write
        // them), they are one piece of it, keys included: one copy
        // instead of four.
        let request_id_key = fixstr!("request_id");
        let reply_to_key = fixstr!("reply_to");
        let id = out.offset(self.request_id_raw);
        let id_end = id + self.request_id_raw.len();
        match self.reply_to_raw {
            Some(raw) if out.offset(raw) == id_end + reply_to_key.len() => {
                let start = id - request_id_key.len();
                debug_assert_eq!(&self.body[start..id], request_id_key);
                debug_assert_eq!(&self.body[id_end..out.offset(raw)], reply_to_key);
                out.piece(start, out.offset(raw) + raw.len());
            }
            reply_to_raw => {
                out.put(request_id_key);
                out.span(self.request_id_raw);
                out.put(reply_to_key);
                match reply_to_raw {
                    Some(raw) => out.span(raw),
                    None => out.str(self.reply_to.as_bytes()),
                }
            }
        }
        out.put(fixstr!("backend"));
        out.str(backend.as_str().as_bytes());
        if let Some(id) = disagg {
            out.put(fixstr!("disagg_request_id"));
            match id {
                Some(id) => write_uint(out.own(), id),
                None => out.put(&[0xc0]),
            }
        }
        out.put(fixstr!("handoff"));
        write_params(&mut out, params, disagg);
        out.put(fixstr!("prefill_output"));
        self.write_output(&mut out);
        if let Some(request) = request {
            out.put(fixstr!("request"));
            out.span(request);
        }
        write_worker(out.own(), instance_id, machine_id);
        if let Some(ms) = self.deadline {
            out.put(fixstr!("deadline_ms"));
            write_uint(out.own(), ms);
        }
        if let Some(ms) = kv_expires {
            out.put(fixstr!("kv_expires_ms"));
            write_uint(out.own(), ms);
        }
        if extras > 0 {
            for entry in top.iter().filter(|e| passed_on(e.kind)) {
                out.entry(entry);
            }
        }
        Some(Decision {
            outcome: Outcome::Decode {
                backend,
                minted: minted.is_some(),
            },
            request_id: Some(self.request_id.to_string()),
            subject: rules.gen_subject.clone(),
            headers: Headers::job(self.request_id, self.deadline, kv_expires),
            payload: out.finish(),
            trailing_frames: self.trailing,
            detail: None,
            deadline_ms: self.deadline,
            kv_expires_ms: kv_expires,
            release: None,
        })
    }
}

/// `"worker": {"instance_id": …, "machine_id": …}`.
fn write_worker(
    out: &mut Vec<u8>,
    instance_id: super::InstanceId,
    machine_id: Option<crate::ids::MachineId>,
) {
    out.extend_from_slice(fixstr!("worker"));
    write_map_len(out, 2);
    out.extend_from_slice(fixstr!("instance_id"));
    write_str(out, instance_id.as_bytes());
    out.extend_from_slice(fixstr!("machine_id"));
    match machine_id {
        Some(m) => write_uint(out, u64::from(m.get())),
        None => out.push(0xc0),
    }
}

/// A params map read in place, as `handoff`'s checks read it.
struct InPlace<'f, 'a> {
    fields: &'f Fields<'a>,
    /// Its `kv_transfer_params` map, when read (the params' own only).
    nested: Option<&'f Fields<'a>>,
}

impl<'a> handoff::Params<'a> for InPlace<'_, 'a> {
    type Value = Span<'a>;

    fn get(&self, key: Key) -> Option<Span<'a>> {
        self.fields.get(key)
    }

    fn has_any(&self, set: Set) -> bool {
        self.fields.has_any(set)
    }

    fn has_prefix(&self, prefix: &str) -> bool {
        self.fields
            .iter()
            .any(|e| utf8(e.key).is_some_and(|k| k.starts_with(prefix)))
    }

    /// The params' own nested map; one nested deeper is not read here
    /// (the checks refuse it, and the caller declines).
    fn nested(&self, _: Span<'a>) -> Option<Self> {
        let fields = self.nested?;
        Some(InPlace {
            fields,
            nested: None,
        })
    }

    fn is_nil(value: Span<'a>) -> bool {
        scan::is_nil(value)
    }

    fn uint(value: Span<'a>) -> Option<u64> {
        scan::uint(value)
    }

    fn str(value: Span<'a>) -> Option<&'a str> {
        utf8(value)
    }

    /// The items of an array of a validated body: every item is there.
    fn items(value: Span<'a>) -> Option<impl Iterator<Item = Span<'a>>> {
        scan::items(value).map(|(_, items)| items)
    }

    fn describe(value: Span<'a>) -> String {
        crate::wire::decode(value, Encoding::MsgPack)
            .map_or_else(|e| e.to_string(), |value| crate::wire::describe(&value))
    }
}

/// The params as they go to decode: for TensorRT-LLM (`disagg` is
/// `Some`), `request_type` set to `"generation_only"` and, for a kept or
/// minted ID, `disagg_request_id` set, each in place or appended in that
/// order; otherwise unchanged.
fn write_params<'a>(out: &mut Out<'a>, params: &Fields<'a>, disagg: Option<Option<u64>>) {
    let entries = params.all();
    let Some(id) = disagg else {
        write_map_len(out.own(), entries.len());
        out.entries(entries);
        return;
    };
    let has_type = params.get(Key::RequestType).is_some();
    let set_id = id.is_some() && params.get(Key::DisaggRequestId).is_none();
    write_map_len(
        out.own(),
        entries.len() + usize::from(!has_type) + usize::from(set_id),
    );
    // The entries as they are, but for the values of these two.
    let mut from = 0;
    for (i, entry) in entries.iter().enumerate() {
        let request_type = entry.kind == Key::RequestType;
        let disagg_id = entry.kind == Key::DisaggRequestId && id.is_some();
        if !request_type && !disagg_id {
            continue;
        }
        out.entries_and_key(&entries[from..i], entry);
        match id {
            Some(id) if disagg_id => write_uint(out.own(), id),
            _ => out.put(fixstr!("generation_only")),
        }
        from = i + 1;
    }
    out.entries(&entries[from..]);
    if !has_type {
        out.put(fixstr!("request_type"));
        out.put(fixstr!("generation_only"));
    }
    if let (true, Some(id)) = (set_id, id) {
        out.put(fixstr!("disagg_request_id"));
        write_uint(out.own(), id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields<'a>(keys: &[&'a [u8]]) -> Fields<'a> {
        let mut fields = Fields::new();
        for key in keys {
            fields.push((key, &[0xc0][..]));
        }
        fields
    }

    #[test]
    fn a_string_key_twice_is_found_whatever_shares_its_bucket() {
        // "ab", "!b" and "\xa1b" share a bucket (same length and last byte).
        let (ab, cb, zb): (&[u8], &[u8], &[u8]) = (b"\xa2ab", b"\xa2!b", b"\xa2\xa1b");
        let bucket_of = |key| bucket(key, Key::of(key));
        assert_eq!(bucket_of(ab), bucket_of(cb));
        assert_eq!(bucket_of(ab), bucket_of(zb));
        assert!(fields(&[ab, cb, zb]).unique());
        assert!(!fields(&[ab, cb, zb, cb]).unique());
        assert!(!fields(&[ab, b"\xa1x", ab]).unique());
        // A name has a bucket of its own.
        assert!(!fields(&[b"\xa6frames", ab, b"\xa6frames"]).unique());
        // Sixteen distinct keys, then each of them again at the end.
        let names: Vec<Vec<u8>> = (0..WIDE)
            .map(|i| [&[0xa3u8][..], format!("k{i:02}").as_bytes()].concat())
            .collect();
        let keys: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
        assert!(fields(&keys).unique());
        for i in 0..WIDE - 1 {
            let mut twice = keys[..WIDE - 1].to_vec();
            twice.push(keys[i]);
            assert!(!fields(&twice).unique(), "key {i} twice");
        }
        // Only string keys count (as in the tree path's check).
        assert!(fields(&[b"\x01", b"\x01"]).unique());
    }
}
