//! An allocator that survives hostile length prefixes.
//!
//! The generated decoders size vectors from the element count a request claims before reading
//! any element, so a 30-byte frame claiming two billion topics asks for hundreds of gigabytes.
//! The system allocator refuses, and Rust aborts the process. This allocator serves large
//! requests with address space reserved lazily (`MAP_NORESERVE`): nothing is committed until
//! written, the decode fails on the missing bytes, and the mapping is returned unused. Small
//! allocations go to the system allocator untouched.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations at or above this size are mapped lazily.
const LAZY_FROM: usize = 1 << 30;
const PAGE: usize = 4096;

/// The global allocator for binaries that decode untrusted requests.
pub struct HostileLengthAllocator;

fn lazy(layout: &Layout) -> bool {
    layout.size() >= LAZY_FROM && layout.align() <= PAGE
}

// SAFETY: every pointer returned comes from System or from a private anonymous mapping of at
// least `layout.size()` bytes aligned to a page; each is released by the matching call.
unsafe impl GlobalAlloc for HostileLengthAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !lazy(&layout) {
            return unsafe { System.alloc(layout) };
        }
        // SAFETY: an anonymous private mapping has no preconditions; failure is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            std::ptr::null_mut()
        } else {
            p.cast()
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if lazy(&layout) {
            // SAFETY: `ptr` is a mapping of `layout.size()` bytes made by `alloc`.
            unsafe { libc::munmap(ptr.cast(), layout.size()) };
        } else {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` with `layout.align()` is a valid layout.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if !lazy(&layout) && !lazy(&new_layout) {
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are valid for the smaller of the two sizes and distinct.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_allocation_is_lazily_mapped_and_released() {
        let layout = Layout::from_size_align(300 << 30, 8).unwrap();
        let a = HostileLengthAllocator;
        // SAFETY: layout is non-zero; the block is written within bounds and freed once.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            *p = 7;
            *p.add((300 << 30) - 1) = 9;
            let p = a.realloc(p, layout, 2 << 30);
            assert_eq!(*p, 7);
            a.dealloc(p, Layout::from_size_align(2 << 30, 8).unwrap());
        }
    }
}
