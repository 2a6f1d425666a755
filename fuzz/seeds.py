#!/usr/bin/env python3
"""Writes the curated seed corpus of the fuzz targets (fuzz/corpus/<target>/).

The seeds are what the fuzzers start from: prefill results shaped like the
ones Dynamo's TensorRT-LLM, SGLang and vLLM prefill workers emit (handoffs and
terminals, as src/loadgen/payload.rs and tests/offline/decision_support build them),
in MessagePack and in JSON, and hostile ones (refused reply subjects, header
injection attempts, lying lengths, undefined markers, nesting past the depth
limit, non-canonical encodings). Deterministic: running it again rewrites the
same bytes. Files other generators or the fuzzers add (crash reproducers kept
as regression seeds) are left alone.

    python3 fuzz/seeds.py
"""

import json
import os
import struct

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
REPLY = "_INBOX.client.1"


def pack(value):
    return msgpack.packb(value, use_bin_type=True)


def frame(finish_reason=None, params=None, **extra):
    f = {
        "token_ids": [791],
        "text": " the",
        "completion_usage": {"prompt_tokens": 512, "completion_tokens": 1, "total_tokens": 513},
    }
    if finish_reason is not None:
        f["finish_reason"] = finish_reason
    if params is not None:
        f["disaggregated_params"] = params
    f.update(extra)
    return f


def result(frames, request_id="req-1", reply_to=REPLY, **extra):
    r = {"request_id": request_id, "reply_to": reply_to, "frames": frames}
    r.update(extra)
    return r


def request():
    return {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "token_ids": [128000, 791, 4062, 14198, 39935],
        "sampling_options": {"temperature": 0.7, "top_p": 0.9},
        "stop_conditions": {"max_tokens": 256},
    }


def trt(ctx=1000007, opaque=bytes(range(48)), **extra):
    p = {
        "request_type": "context_only",
        "first_gen_tokens": [791],
        "ctx_request_id": ctx,
        "opaque_state": opaque,
        "draft_tokens": None,
    }
    p.update(extra)
    return p


def sglang(**extra):
    p = {"bootstrap_host": "10.0.0.7", "bootstrap_port": 8998, "bootstrap_room": 12345}
    p.update(extra)
    return p


def vllm(**extra):
    p = {
        "do_remote_prefill": True,
        "remote_engine_id": "prefill-engine-0",
        "remote_block_ids": list(range(16)),
        "remote_host": "10.0.0.8",
        "remote_port": 5600,
    }
    p.update(extra)
    return p


def handoff(params, **extra):
    return result([frame("length", params)], request=request(), **extra)


# Results that are valid as JSON as well as MessagePack (no binary values).
def json_able():
    return {
        "trtllm_handoff": handoff(trt(opaque=None)),
        "trtllm_kept_id": handoff(trt(opaque=None, disagg_request_id=42)),
        "trtllm_no_ctx_id": handoff(trt(ctx=None, opaque=None)),
        "trtllm_ctx_id_too_big": handoff(trt(ctx=2**63, opaque=None)),
        "trtllm_ctx_id_float": handoff(trt(ctx=7.0, opaque=None)),
        "trtllm_generation_only": handoff(trt(opaque=None, request_type="generation_only")),
        "sglang_handoff": handoff(sglang()),
        "sglang_bad_port": handoff(sglang(bootstrap_port=70000)),
        "vllm_handoff": handoff(vllm()),
        "vllm_negative_block": handoff(vllm(remote_block_ids=[1, -2])),
        "opaque_handoff": handoff({"kv_handle": "kv://pool-3/1f", "node": 3}),
        "not_finished_handoff": result([frame("not_finished", sglang())]),
        "no_finish_reason_handoff": result([frame(None, vllm())]),
        "terminal_stop": result([frame("stop", trt(opaque=None))]),
        "terminal_eos": result([frame("eos")]),
        "terminal_cancelled": result([frame("cancelled")]),
        "terminal_error_map": result([frame({"error": "engine died"})]),
        "terminal_unknown_reason": result([frame("tool_calls")]),
        "prefill_error": result([frame("error", error="prefill engine failed: CUDA error: out of memory")]),
        "prefill_error_map": result([frame(None, trt(opaque=None), error={"message": "oom", "code": 2})]),
        "trailing_frames": result([frame("length", trt(opaque=None)), frame("stop"), frame(None, error="late")]),
        "no_frames": result([]),
        "no_params": result([frame("length")]),
        "params_not_a_map": result([frame("length", [1, 2])]),
        "frame_not_a_map": result(["x"]),
        "frames_not_an_array": result({"0": frame("stop")}),
        "no_request_id": {"reply_to": REPLY, "frames": [frame("stop")]},
        "long_request_id": result([frame("stop")], request_id="x" * 257),
        "request_id_crlf": result([frame("length", sglang())], request_id="a\r\nNats-Msg-Id: forged"),
        "request_id_unicode": result([frame("length", sglang())], request_id="r\u00e9q \u2028 %41\u0085"),
        "no_reply_to": {"request_id": "req-1", "frames": [frame("stop")]},
        "reply_to_js_api": result([frame("stop")], reply_to="$JS.API.STREAM.DELETE.LLM_PREFILL"),
        "reply_to_sys": result([frame("stop")], reply_to="$SYS.REQ.SERVER.PING"),
        "reply_to_wildcard": result([frame("stop")], reply_to="_INBOX.>"),
        "reply_to_own_subject": result([frame("stop")], reply_to="llm.gen.jobs"),
        "reply_to_crlf": result([frame("stop")], reply_to="_INBOX.a\r\nHPUB x 0 0"),
        "reply_to_space": result([frame("stop")], reply_to="_INBOX.a b"),
        "reply_to_null": result([frame("stop")], reply_to=None),
        "reply_to_number": result([frame("stop")], reply_to=5),
        "replies_namespace": result([frame("stop")], reply_to="llm.replies.client-7.42"),
        "not_a_map": [1, 2, 3],
        "extra_top_level_keys": result([frame("length", trt(opaque=None))], priority=3, tenant={"id": "t1"}),
    }


def json_only():
    """Byte-level JSON: duplicate keys and forms a dict cannot hold."""
    dup = b'{"request_id": "r", "reply_to": "_INBOX.a", "reply_to": "_INBOX.b", "frames": []}'
    dup_frame = (
        b'{"request_id": "r", "reply_to": "_INBOX.a", "frames": '
        b'[{"finish_reason": "length", "finish_reason": "stop"}]}'
    )
    deep = b'{"request_id": "r", "reply_to": "_INBOX.a", "frames": ' + b"[" * 70 + b"]" * 70 + b"}"
    return {
        "duplicate_reply_to": dup,
        "duplicate_frame_key": dup_frame,
        "too_deep": deep,
        "empty": b"",
        "truncated": json.dumps(json_able()["trtllm_handoff"]).encode()[:60],
        "trailing_garbage": json.dumps(json_able()["terminal_stop"]).encode() + b" x",
        "big_numbers": b'{"request_id": "r", "reply_to": "_INBOX.a", "frames": [{"finish_reason": "length", '
        b'"disaggregated_params": {"ctx_request_id": 1e300, "disagg_request_id": 18446744073709551616}}]}',
        "escaped_strings": b'{"request_id": "\\u0000\\r\\n\\ud83d\\ude00", "reply_to": "_INBOX.\\u0041", '
        b'"frames": [{"finish_reason": "length", "disaggregated_params": {"bootstrap_host": "h", '
        b'"bootstrap_port": 1, "bootstrap_room": 0}}]}',
    }


def msgpack_only():
    """Binary values, and byte-level MessagePack that no packer writes."""
    good = pack(handoff(trt()))
    at = good.index(b"ctx_request_id") + len(b"ctx_request_id")
    # ctx_request_id 1000007 is uint32 (0xce); the same number as uint64.
    non_canonical = good[:at] + b"\xcf" + struct.pack(">Q", 1000007) + good[at + 5:]
    assert good[at] == 0xCE
    rid = good.index(b"req-1")
    bad_utf8 = good[:rid] + b"r\xff\xfe1\x80" + good[rid + 5:]
    c1 = good[:at] + b"\xc1" + good[at + 5:]
    return {
        "trtllm_handoff_opaque_bin": good,
        "trtllm_loadgen_shape": pack(
            result(
                [frame(None, trt(ctx=1000042, opaque=bytes((i * 37) & 0xFF for i in range(256))))],
                request_id="lg-run1-42",
                reply_to="_INBOX.loadgen.run1",
                request=request(),
            )
        ),
        "terminal_with_bin_params": pack(result([frame("stop", trt())])),
        "ext_and_bin_everywhere": pack(
            result(
                [frame("length", {"kv": msgpack.ExtType(5, b"\x00" * 16), "blob": b"\x01\x02"})],
                request={"raw": msgpack.ExtType(100, b"\x00" * 12)},
            )
        ),
        "non_string_keys": pack({1: 2, b"k": "v", "request_id": "r", "reply_to": REPLY, "frames": [frame("stop")]}),
        "non_canonical_ctx_id": non_canonical,
        "invalid_utf8_request_id": bad_utf8,
        "undefined_marker_c1": c1,
        "trailing_bytes": good + b"\xc0",
        "truncated": good[: len(good) // 2],
        "lying_array32": pack(result([]))[:-1] + b"\xdd\xff\xff\xff\xff",
        "lying_map32": b"\xdf\xff\xff\xff\xff\xa1a\x01",
        "lying_str32": b"\x81\xa1a\xdb\x7f\xff\xff\xff",
        "deep_arrays": b"\x91" * 65 + b"\x01",
        "depth_64": b"\x81\xa6frames" + b"\x91" * 62 + b"\x01",
        "float_ctx_id": pack(handoff(trt(ctx=7.0))),
        "negative_ctx_id": pack(handoff(trt(ctx=-1))),
        "max_ctx_id": pack(handoff(trt(ctx=2**63 - 1, disagg_request_id=2**63 - 2))),
        "wide_map": pack(result([frame("length", trt())], **{f"k{i}": i for i in range(20)})),
        "empty": b"",
        "nil": b"\xc0",
    }


# Edge encodings for the reader and the scanner, beyond whole results.
def wire_only():
    cases = {
        "ints_every_width": pack([0, 127, 128, 255, 256, 65535, 65536, 2**32, 2**64 - 1, -1, -32, -33, -128, -129, -32769, -(2**63)]),
        "int_non_canonical": b"\x94\xcc\x05\xcd\x00\xff\xd0\x05\xd1\xff\x80",
        "floats": pack([1.5, float("nan"), float("-inf"), -0.0]) + b"",
        "float32": b"\x92\xca\x3f\xc0\x00\x00\xca\x7f\xc0\x00\x00",
        "str8_short": b"\xd9\x01a",
        "bin_and_ext_forms": b"\x96\xc4\x00\xc5\x00\x01a\xd4\x01\x00\xd8\x02" + b"\x00" * 16 + b"\xc7\x03\x05abc\xc7\x01\x05a",
        "array16_small": b"\xdc\x00\x01\x01",
        "map16": b"\xde\x00\x10" + b"".join(pack(f"k{i}") + pack(i) for i in range(16)),
        "bool_nil": b"\x93\xc2\xc3\xc0",
    }
    return cases


def hmsg(headers, payload, subject="llm.prefill.results", reply="_INBOX.client.1", status=b""):
    """An HMSG op as the server sends it: a header block and a body."""
    block = b"NATS/1.0" + status + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"
    args = [subject.encode(), b"7"] + ([reply.encode()] if reply else [])
    args += [str(len(block)).encode(), str(len(block) + len(payload)).encode()]
    return b"HMSG " + b" ".join(args) + b"\r\n" + block + payload + b"\r\n"


def msg(payload, subject="llm.prefill.results", reply="_INBOX.client.1"):
    args = [subject.encode(), b"7"] + ([reply.encode()] if reply else []) + [str(len(payload)).encode()]
    return b"MSG " + b" ".join(args) + b"\r\n" + payload + b"\r\n"


# What the NATS server sends a subscriber, for the client's server-op parser
# and our header handling behind it.
def server_ops():
    mp = pack(handoff(trt()))
    js = json.dumps(json_able()["sglang_handoff"]).encode()
    trace = b"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    info = (
        b'INFO {"server_id":"NDUMMY","server_name":"n1","version":"2.10.22","proto":1,'
        b'"host":"127.0.0.1","port":4222,"headers":true,"max_payload":1048576,"client_id":3}\r\n'
    )
    return {
        "msgpack_with_trace": hmsg([trace, b"tracestate: congo=t61rcWkgMzE"], mp),
        "json_content_type": hmsg([b"Content-Type: application/json", trace], js),
        "json_content_type_params": hmsg([b"content-type: Application/JSON; charset=utf-8"], js),
        "json_body_no_content_type": msg(js),
        "plain_msg": msg(mp),
        "no_reply": hmsg([trace], pack(result([frame("stop")]))),
        "trace_two_spellings": hmsg([trace, b"TraceParent: 00-x-y-01", b"TRACESTATE: a=b"], mp),
        "multi_value": hmsg([b"Content-Type: application/json", b"Content-Type: text/plain"], js),
        "lone_cr_in_value": hmsg([b"traceparent: 00-abc\r-01", b"Content-Type: application/json"], js),
        "no_colon": hmsg([b"traceparent 00-abc-01"], mp),
        "non_utf8_value": hmsg([b"tracestate: \xff\xfe"], mp),
        "forged_block_error": hmsg([b"Async-Nats-Header-Block-Error: forged"], mp),
        "status_503": hmsg([], b"", subject="_INBOX.x.1", reply=None, status=b" 503"),
        "status_with_description": hmsg([b"Nats-Pending-Messages: 3"], b"", reply=None, status=b" 408 Request Timeout"),
        "session": info + b"+OK\r\nPING\r\n" + hmsg([trace], mp) + msg(js) + b"PONG\r\n",
        "err": b"-ERR 'Authorization Violation'\r\n",
        "bare_err": b"-ERR\r\n",
        "lengths_lie": b"HMSG llm.prefill.results 7 18446744073709551615 18446744073709551615\r\nNATS/1.0\r\n\r\n",
        "header_longer_than_total": b"HMSG a 1 20 10\r\nNATS/1.0\r\n\r\n0123456789\r\n",
    }


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    for name, value in json_able().items():
        write("decide_json", name + ".json", json.dumps(value, ensure_ascii=False).encode())
        write("decide_msgpack", name + ".mp", pack(value))
    for name, data in json_only().items():
        write("decide_json", name + ".json", data)
    for name, data in msgpack_only().items():
        write("decide_msgpack", name + ".mp", data)
        write("wire_msgpack", name + ".mp", data)
    for name, data in wire_only().items():
        write("wire_msgpack", name + ".mp", data)
    for name, data in server_ops().items():
        write("nats_headers", name + ".ops", data)
    for name in ("trtllm_handoff", "vllm_handoff", "terminal_error_map", "request_id_crlf"):
        write("wire_msgpack", name + ".mp", pack(json_able()[name]))


if __name__ == "__main__":
    main()
