//! The process's allocator: mimalloc, called the way the system allocator
//! is. The `mimalloc` crate's `MiMalloc` passes every allocation through
//! `mi_malloc_aligned`, whose checks for the alignment cost about 30
//! instructions more than `mi_malloc` per call; the worker makes about nine
//! allocations per result, so that was ~270 instructions per result in
//! bursts (callgrind). Here, as Rust's system allocator does with `malloc`,
//! an alignment `mi_malloc` already guarantees goes to `mi_malloc`, and only
//! larger ones to the aligned entry points.

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

#[cfg(test)]
mod tests {
    use super::*;

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
