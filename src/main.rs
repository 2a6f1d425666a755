// mimalloc: the worker allocates and frees a few buffers per message on every
// runtime thread; measured faster and with a lower peak RSS than the system
// allocator (see the benchmark notes in the README).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// mimalloc's `mi_option_set` (from the mimalloc library `mimalloc` links in;
// libmimalloc-sys declares it only behind its `extended` feature).
unsafe extern "C" {
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// `mi_option_purge_delay` in `mi_option_e` (mimalloc v2 and v3 include/mimalloc.h
/// of libmimalloc-sys 0.1.49): milliseconds before freed memory is given back
/// to the OS (default 10, and 10 times that for arenas).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

fn main() {
    // Give freed memory back at once. A burst of 2,000 results of 1 MiB
    // (tests/worker_bounds.rs, nats-server 2.9.10, debug build) peaked at
    // 209-214 MiB with the default delay and 132 MiB without: results are
    // allocated by the NATS connection's thread and freed on others, and the
    // delayed purges kept ~80 MiB of them resident against the 256 MiB limit.
    // SAFETY: called first thing, before any other thread exists (the
    // function is not thread safe); an unknown option is ignored.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    std::process::exit(prefill_handoff::cli::main());
}
