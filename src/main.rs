// mimalloc: the worker allocates and frees a few buffers per message on every
// runtime thread; measured faster and with a lower peak RSS than the system
// allocator (see the benchmark notes in the README).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(prefill_handoff::cli::main());
}
