//! The decision for one received message: the header block checked, then
//! [`decision::decide`], beside the runtime for large inputs.
//!
//! ## Messages whose NATS header block could not be parsed
//!
//! The header block comes verbatim from whoever published; the client
//! delivers one it could not parse marked ([`headers::block_error`]). The
//! pipeline dead-letters such a message as `malformed`, whatever its body;
//! the ID service (`crate::id_service`) answers it `malformed`.
//!
//! ## Deciding a large result without stalling the connection
//!
//! The decision is linear in the input's bytes, so a large result holds a
//! thread for a while (`docs/performance.md`), and the worker loop runs a
//! batch of up to 32 results in one task. On the runtime's threads, a burst
//! of large results keeps the NATS connection and the intake from running,
//! and the server cuts the worker off as a slow consumer (every message it
//! had buffered for the worker lost, uncounted). With a `block_in_place`
//! thread each, dozens compete with them for the CPUs and the client's
//! subscription buffer grows behind them.
//!
//! So a result of at least [`LARGE`] bytes waits (asynchronously) for one of
//! a few decision slots — one fewer than the CPUs, at least one — and is
//! decided in `block_in_place`, which hands this runtime thread's other tasks
//! to another thread meanwhile. The connection and the intake always keep a
//! CPU's worth of room.

use crate::decision::{self, Decision, IdSource, Input, Rules};
use crate::headers;
use async_nats::HeaderMap;
use std::sync::OnceLock;
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::Semaphore;

/// Results at least this large are decided beside the runtime. Typical
/// results are a few KiB and never pay for the hand-off.
pub const LARGE: usize = 64 * 1024;

/// Large decisions running at once, across the process (one delivery mode
/// runs per process; a static keeps both modes' handlers on one limit).
fn slots() -> &'static Semaphore {
    static SLOTS: OnceLock<Semaphore> = OnceLock::new();
    SLOTS.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(2, usize::from);
        Semaphore::new(cpus.saturating_sub(1).max(1))
    })
}

/// [`decide_received_inline`] (the header block checked, then the
/// decision); beside the runtime, a few at a time, for large inputs.
pub async fn decide_received<I: IdSource + Send>(
    input: Input<'_>,
    headers: Option<&HeaderMap>,
    rules: &Rules,
    ids: &mut I,
) -> Decision {
    // Looked up only for a large input: a thread-local access per message.
    let multi_thread = || {
        Handle::try_current()
            .is_ok_and(|runtime| runtime.runtime_flavor() == RuntimeFlavor::MultiThread)
    };
    if input.payload.len() < LARGE || !multi_thread() {
        return decide_received_inline(input, headers, rules, ids);
    }
    // Never closed: on error, decide without a slot rather than not at all.
    let _slot = slots().acquire().await;
    tokio::task::block_in_place(|| decide_received_inline(input, headers, rules, ids))
}

/// The decision for one received message, in both modes, on the caller's
/// thread: a `malformed` dead letter when the client could not parse its
/// header block, otherwise [`decision::decide`].
pub fn decide_received_inline(
    input: Input<'_>,
    headers: Option<&HeaderMap>,
    rules: &Rules,
    ids: &mut dyn IdSource,
) -> Decision {
    match headers::block_error(headers) {
        Some(what) => decision::unreadable_headers(input, rules, what),
        None => decision::decide(input, rules, ids),
    }
}
