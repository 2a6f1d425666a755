//! The process's allocator: mimalloc, called the way the system allocator
//! is. The `mimalloc` crate's `MiMalloc` passes every allocation through
//! `mi_malloc_aligned`, whose alignment checks cost more than `mi_malloc`
//! on each of the several allocations a result makes. Here, as Rust's
//! system allocator does with `malloc`, an alignment `mi_malloc` already
//! guarantees goes to `mi_malloc`, and only larger ones to the aligned entry
//! points (the figure: `docs/performance.md`).
//!
//! It also decides how long memory freed after a burst is kept for the next
//! one ([`keep_freed_memory`], [`give_back_freed_memory`]).

use libmimalloc_sys as mi;
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// The alignment every `mi_malloc` block of at least this size has: blocks
/// of 16 bytes or more start on a 16-byte boundary, smaller ones on their
/// size's (mimalloc's `MI_MAX_ALIGN_SIZE`; see its `alloc.c`, which asserts
/// it for every block it hands out).
const GUARANTEED: usize = 16;

/// mimalloc as the global allocator (`#[global_allocator]` in the binary and
/// the benches).
pub struct MiMalloc;

/// Whether `mi_malloc` (or `mi_realloc`) of `size` bytes is aligned enough
/// for `align`: as std's `System` decides for `malloc`.
#[inline(always)]
fn plain(align: usize, size: usize) -> bool {
    align <= GUARANTEED && align <= size
}

// SAFETY: each method hands the request to mimalloc, which returns null on
// failure (as `GlobalAlloc` requires) and memory of at least `size` bytes;
// `plain` sends a request to the unaligned entry points only when their
// guaranteed alignment (`GUARANTEED`, or the block size below it) covers
// the layout's. Every block is freed with `mi_free`, whichever entry
// point made it.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc's allocation functions accept any size.
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the caller's contract).
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` (the
        // caller's contract); the new block keeps the layout's alignment.
        unsafe {
            if plain(layout.align(), new_size) {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

/// mimalloc v3's `mi_option_purge_delay`: the 16th entry of `mi_option_e`
/// in its `mimalloc.h` (libmimalloc-sys names no constant for it; the test
/// `the_purge_delay_option_is_the_one_set` checks the index).
const PURGE_DELAY: mi::mi_option_t = 15;

/// How long freed memory stays mapped for reuse before mimalloc gives it
/// back to the system: a minute, where mimalloc's default is a second.
///
/// A burst fills the byte budget with results waiting to be decided (about
/// 1 KiB each, most of it their bytes in the client's read buffer); once
/// they are published that memory is free again. Given back a second
/// later, the next burst takes every page of it again as a fresh page
/// fault, zeroed by the kernel; kept a minute, it is reused without one
/// (page faults per burst: `docs/performance.md`). What it costs: up to a
/// burst's peak of memory stays with the worker for a minute after the
/// burst (the peak itself does not change).
/// `MIMALLOC_PURGE_DELAY`, when set, decides instead.
pub const KEEP_FREED_MS: std::ffi::c_long = 60_000;

/// How often the worker asks mimalloc to give back what it has kept past
/// [`KEEP_FREED_MS`]: mimalloc looks only when a page is freed, so an idle
/// worker would keep a burst's memory for good.
pub const GIVE_BACK_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Sets how long freed memory is kept ([`KEEP_FREED_MS`]) unless the
/// environment sets mimalloc's purge delay. Call it first thing in `main`,
/// before any thread starts: mimalloc's options are not thread-safe.
pub fn keep_freed_memory() {
    let set_by_env = std::env::vars_os().any(|(name, _)| {
        name.to_str().is_some_and(|name| {
            name.eq_ignore_ascii_case("MIMALLOC_PURGE_DELAY")
                || name.eq_ignore_ascii_case("MIMALLOC_RESET_DELAY")
        })
    });
    if !set_by_env {
        // SAFETY: sets one integer option; `main` calls this before it
        // starts any thread.
        unsafe { mi::mi_option_set(PURGE_DELAY, KEEP_FREED_MS) };
    }
}

/// Gives back to the system the freed memory kept longer than the purge
/// delay, and this thread's empty pages. Cheap (it visits the calling
/// thread's pages that are not full); the worker calls it every
/// [`GIVE_BACK_EVERY`] on its runtime's thread. Does nothing to memory of
/// another allocator.
pub fn give_back_freed_memory() {
    // SAFETY: `mi_collect` takes no pointers and may be called on any thread.
    unsafe { mi::mi_collect(false) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `PURGE_DELAY` names the purge delay: it reads mimalloc v3's default
    /// for it, one second (no option next to it defaults to that), unless the
    /// environment set it; and setting it reads back.
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        // SAFETY: reads and sets one integer option; no other test touches
        // mimalloc's options.
        unsafe {
            let env = std::env::var("MIMALLOC_PURGE_DELAY").ok();
            let now = mi::mi_option_get(PURGE_DELAY);
            match env.and_then(|v| v.parse::<std::ffi::c_long>().ok()) {
                Some(v) => assert_eq!(now, v),
                None => assert_eq!(now, 1000),
            }
            mi::mi_option_set(PURGE_DELAY, 1234);
            assert_eq!(mi::mi_option_get(PURGE_DELAY), 1234);
            mi::mi_option_set(PURGE_DELAY, now);
        }
    }

    /// Every layout gets memory of its alignment and size through each entry
    /// point, and keeps its bytes and alignment when it grows and shrinks,
    /// across the 16-byte boundary where the plain calls stop.
    #[test]
    fn blocks_have_their_layouts_alignment() {
        let a = MiMalloc;
        let aligned = |p: *mut u8, align: usize| !p.is_null() && (p as usize).is_multiple_of(align);
        for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for size in [1, 8, 16, 24, 48, 80, 1000, 70_000] {
                let size = size.max(align);
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: non-zero sizes; each block is used within its size
                // and freed once, with the layout it has then.
                unsafe {
                    let z = a.alloc_zeroed(layout);
                    assert!(aligned(z, align), "zeroed {size}/{align}");
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|b| *b == 0));
                    a.dealloc(z, layout);

                    let mut p = a.alloc(layout);
                    assert!(aligned(p, align), "{size}/{align}");
                    p.write_bytes(7, size);
                    let mut now = size;
                    for next in [align, size * 3, 64 * 1024 + align, 8, size] {
                        let next = next.max(align);
                        p = a.realloc(p, Layout::from_size_align(now, align).unwrap(), next);
                        assert!(aligned(p, align), "{now} -> {next} / {align}");
                        let kept = std::slice::from_raw_parts(p, now.min(next));
                        assert!(kept.iter().all(|b| *b == 7), "{now} -> {next} / {align}");
                        p.write_bytes(7, next);
                        now = next;
                    }
                    a.dealloc(p, Layout::from_size_align(now, align).unwrap());
                }
            }
        }
    }
}
