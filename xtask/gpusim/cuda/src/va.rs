//! The simulated device address space: where device pointers point.
//!
//! Device memory holds no data (the simulator models time and capacity, not
//! contents), so addresses are numbers in a range no host mapping uses
//! (`0x3000_0000_0000` up). Sizes are rounded to 512 bytes, or to 2 MiB
//! from 2 MiB on, like the real driver's alignment; freed ranges are reused
//! for requests of the same rounded size.

use std::collections::HashMap;

/// First device address.
pub const BASE: u64 = 0x3000_0000_0000;
/// End of the device range.
pub const LIMIT: u64 = 0x4000_0000_0000;
const SMALL_ALIGN: u64 = 512;
const LARGE_ALIGN: u64 = 2 << 20;

/// A bump allocator with exact-size reuse.
pub struct AddressSpace {
    next: u64,
    free: HashMap<u64, Vec<u64>>,
}

impl AddressSpace {
    /// An empty address space.
    pub fn new() -> Self {
        Self {
            next: BASE,
            free: HashMap::new(),
        }
    }

    /// The rounded length and alignment for a request of `size` bytes.
    pub fn round(size: u64, alignment: u64) -> (u64, u64) {
        let align = if size >= LARGE_ALIGN {
            LARGE_ALIGN
        } else {
            SMALL_ALIGN
        }
        .max(alignment.next_power_of_two());
        (size.max(1).div_ceil(align) * align, align)
    }

    /// Reserves `size` bytes aligned to at least `alignment`.
    pub fn alloc(&mut self, size: u64, alignment: u64) -> Option<u64> {
        let (len, align) = Self::round(size, alignment);
        if let Some(a) = self.free.get_mut(&len).and_then(|v| {
            let pos = v.iter().position(|a| a % align == 0)?;
            Some(v.swap_remove(pos))
        }) {
            return Some(a);
        }
        let start = self.next.div_ceil(align) * align;
        let end = start.checked_add(len)?;
        if end > LIMIT {
            return None;
        }
        self.next = end;
        Some(start)
    }

    /// Returns a range obtained from [`alloc`](Self::alloc) with `size`.
    pub fn free(&mut self, addr: u64, size: u64) {
        let (len, _) = Self::round(size, 1);
        self.free.entry(len).or_default().push(addr);
    }

    /// Whether `addr` lies in the device range.
    pub fn is_device(addr: u64) -> bool {
        (BASE..LIMIT).contains(&addr)
    }
}

impl Default for AddressSpace {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_and_reuse() {
        let mut a = AddressSpace::new();
        let x = a.alloc(100, 1).unwrap();
        assert_eq!(x % 512, 0);
        let y = a.alloc(3 << 20, 1).unwrap();
        assert_eq!(y % (2 << 20), 0);
        assert!(y >= x + 512);
        a.free(x, 100);
        assert_eq!(a.alloc(200, 1), Some(x), "same rounded size is reused");
        let z = a.alloc(4096, 65536).unwrap();
        assert_eq!(z % 65536, 0);
        assert!(AddressSpace::is_device(z));
    }
}
