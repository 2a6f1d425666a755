//! See [`prefill_handoff_fuzz::targets::wire_msgpack`] for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| prefill_handoff_fuzz::targets::wire_msgpack(data));
