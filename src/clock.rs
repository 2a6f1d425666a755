//! The wall clock, read only at the edge and passed into the pure core.

/// Milliseconds since the Unix epoch. A clock set before 1970 reads as 0.
///
/// `clock_gettime` itself, not `SystemTime::now().duration_since(UNIX_EPOCH)`:
/// every minted ID reads the clock, and std's checked subtraction of two
/// timespecs and the `Duration` built from it are work the decision's hot
/// path does not need. Same answer: whole seconds times 1000 plus the
/// milliseconds of the nanoseconds, and 0 before 1970.
pub fn unix_ms() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write to, and CLOCK_REALTIME is
    // always supported; std reads the wall clock the same way.
    let failed = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut now) } != 0;
    if failed || now.tv_sec < 0 {
        return 0;
    }
    now.tv_sec as u64 * 1000 + now.tv_nsec as u64 / 1_000_000
}

/// Milliseconds since an ID epoch (given in Unix milliseconds), 0 before it.
pub fn since_epoch_ms(epoch_unix_ms: u64) -> u64 {
    unix_ms().saturating_sub(epoch_unix_ms)
}
