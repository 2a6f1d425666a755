fn main() {
    std::process::exit(prefill_handoff::cli::main());
}
