//! D4: the common decision allocates nothing. A counting global allocator proves it.
#![allow(unsafe_code)] // a GlobalAlloc impl is unsafe by definition; it only counts.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use bus_schemas::WindowSpec;
use gateway_node::Decision;
use support::*;

struct Counting;
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn common_path_allocates_nothing() {
    let windows = [
        WindowSpec {
            length_ms: 1_000,
            limit: 1_000_000,
        },
        WindowSpec {
            length_ms: 60_000,
            limit: 10_000_000,
        },
    ];
    let (mut node, policy) = fixed_node(&windows, 20_000);
    let surface = node.surface().clone();
    for i in 0..10_000 {
        let _ = surface.decide(key(i), T0.wall_ms, &policy);
    }
    node.handle_tick(T0);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let mut admitted = 0u64;
    for i in 0..200_000u64 {
        if surface.decide(key(i % 10_000), T0.wall_ms, &policy) == Decision::Admit {
            admitted += 1;
        }
    }
    let after = ALLOCATIONS.load(Ordering::Relaxed);
    assert_eq!(admitted, 200_000, "every decision ran against held credit");
    assert_eq!(after - before, 0, "the decision path allocated");
}
