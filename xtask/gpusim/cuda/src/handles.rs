//! Opaque handles for driver objects.
//!
//! A handle is never a pointer to our memory: it encodes an object kind, a
//! generation and a slot index, and every use looks it up. A stale, foreign
//! or garbage handle therefore yields `CUDA_ERROR_INVALID_HANDLE` (or the
//! code the caller names) instead of undefined behaviour.
//!
//! Bit layout: `kind (16) | generation (24) | index + 1 (24)`. The kinds
//! leave the top bit clear, so a handle is positive as the signed integer
//! (`intptr_t`) that bindings such as CuPy's hold it in, as a real
//! driver's handles (user-space addresses) are: CuPy's own tests check
//! `memPoolCreate(...) > 0`.

use crate::status::{CUDA_ERROR_INVALID_HANDLE, CUresult};

/// Object kinds, the top 16 bits of a handle (top bit clear).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    /// `CUcontext`.
    Context = 0x47C1,
    /// `CUmodule`.
    Module = 0x47C2,
    /// `CUfunction`.
    Function = 0x47C3,
    /// `CUstream`.
    Stream = 0x47C4,
    /// `CUevent`.
    Event = 0x47C5,
    /// `CUgraph`.
    Graph = 0x47C6,
    /// `CUgraphNode`.
    GraphNode = 0x47C7,
    /// `CUgraphExec`.
    GraphExec = 0x47C8,
    /// `CUmemoryPool`.
    Pool = 0x47C9,
    /// `CUarray`.
    Array = 0x47CA,
    /// `CUmipmappedArray`.
    Mipmapped = 0x47CB,
    /// `CUmemGenericAllocationHandle`.
    Physical = 0x47CC,
    /// `CUlibrary`.
    Library = 0x47CD,
    /// `CUkernel`.
    Kernel = 0x47CE,
}

/// Objects of one kind.
pub struct Registry<T> {
    kind: Kind,
    slots: Vec<(u32, Option<T>)>,
    free: Vec<usize>,
    reuse: bool,
}

const INDEX_BITS: u32 = 24;
const GEN_BITS: u32 = 24;
const MASK24: u64 = (1 << 24) - 1;

impl<T> Registry<T> {
    /// An empty registry for `kind`.
    pub const fn new(kind: Kind) -> Self {
        Self {
            kind,
            slots: Vec::new(),
            free: Vec::new(),
            reuse: false,
        }
    }

    /// From now on a freed slot's next object gets the same handle, as the
    /// driver's handles (pointers to freed memory) may be reused: a stale
    /// handle then names the new object.
    pub fn reuse_handles(&mut self) {
        self.reuse = true;
    }

    fn encode(&self, index: usize, generation: u32) -> u64 {
        ((self.kind as u64) << (INDEX_BITS + GEN_BITS))
            | ((u64::from(generation) & MASK24) << INDEX_BITS)
            | (index as u64 + 1)
    }

    fn decode(&self, h: u64) -> Option<usize> {
        if h >> (INDEX_BITS + GEN_BITS) != self.kind as u64 {
            return None;
        }
        let index = (h & MASK24).checked_sub(1)? as usize;
        let generation = ((h >> INDEX_BITS) & MASK24) as u32;
        let (g, v) = self.slots.get(index)?;
        (*g & MASK24 as u32 == generation && v.is_some()).then_some(index)
    }

    /// Stores `value` and returns its handle.
    pub fn insert(&mut self, value: T) -> u64 {
        match self.free.pop() {
            Some(i) => {
                let slot = &mut self.slots[i];
                if !self.reuse {
                    slot.0 = slot.0.wrapping_add(1);
                }
                slot.1 = Some(value);
                let generation = slot.0;
                self.encode(i, generation)
            }
            None => {
                self.slots.push((0, Some(value)));
                self.encode(self.slots.len() - 1, 0)
            }
        }
    }

    /// A handle for an object to come ([`Registry::fill`]): until then,
    /// and after [`Registry::vacate`], it names nothing; its slot is never
    /// given to another object.
    pub fn reserve(&mut self) -> u64 {
        self.slots.push((0, None));
        self.encode(self.slots.len() - 1, 0)
    }

    /// Stores `value` under reserved handle `h` (empty).
    pub fn fill(&mut self, h: u64, value: T) -> Result<(), CUresult> {
        let index = (h & MASK24)
            .checked_sub(1)
            .filter(|_| h >> (INDEX_BITS + GEN_BITS) == self.kind as u64)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)? as usize;
        let generation = self.slots.get(index).map(|(g, _)| *g);
        if generation.map(|g| self.encode(index, g)) != Some(h) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        match &mut self.slots[index].1 {
            slot @ None => {
                *slot = Some(value);
                Ok(())
            }
            Some(_) => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// Takes the object out of reserved handle `h`, keeping the handle for
    /// the next [`Registry::fill`].
    pub fn vacate(&mut self, h: u64) -> Result<T, CUresult> {
        let i = self.decode(h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        self.slots[i].1.take().ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// The object behind `h`.
    pub fn get(&self, h: u64) -> Result<&T, CUresult> {
        self.get_or(h, CUDA_ERROR_INVALID_HANDLE)
    }

    /// The object behind `h`, or `err`.
    pub fn get_or(&self, h: u64, err: CUresult) -> Result<&T, CUresult> {
        let i = self.decode(h).ok_or(err)?;
        self.slots[i].1.as_ref().ok_or(err)
    }

    /// The object behind `h`, mutably.
    pub fn get_mut(&mut self, h: u64) -> Result<&mut T, CUresult> {
        let i = self.decode(h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        self.slots[i].1.as_mut().ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// Removes and returns the object behind `h`.
    pub fn remove(&mut self, h: u64) -> Result<T, CUresult> {
        let i = self.decode(h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let v = self.slots[i].1.take().ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        self.free.push(i);
        Ok(v)
    }

    /// Whether `h` names a live object.
    pub fn contains(&self, h: u64) -> bool {
        self.decode(h).is_some()
    }

    /// Handles and objects.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, (g, v))| v.as_ref().map(|v| (self.encode(i, *g), v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_and_foreign_handles_are_rejected() {
        let mut a: Registry<u32> = Registry::new(Kind::Stream);
        let b: Registry<u32> = Registry::new(Kind::Event);
        let h = a.insert(7);
        assert_eq!(*a.get(h).unwrap(), 7);
        assert!(b.get(h).is_err());
        a.remove(h).unwrap();
        assert!(a.get(h).is_err());
        let h2 = a.insert(8);
        assert_ne!(h, h2, "a reused slot gets a new generation");
        assert!(a.get(h).is_err());
        assert!(a.get(0).is_err());
        assert!(a.get(u64::MAX).is_err());
        assert_eq!(a.iter().count(), 1);
    }

    #[test]
    fn reserved_handles_stay_put() {
        let mut a: Registry<u32> = Registry::new(Kind::Context);
        let r = a.reserve();
        assert!(a.get(r).is_err(), "nothing there yet");
        a.fill(r, 1).unwrap();
        assert_eq!(*a.get(r).unwrap(), 1);
        assert!(a.fill(r, 2).is_err(), "already full");
        assert_eq!(a.vacate(r).unwrap(), 1);
        assert!(a.get(r).is_err());
        let other = a.insert(3);
        assert_ne!(other, r, "a reserved slot is not reused");
        a.fill(r, 4).unwrap();
        assert_eq!(*a.get(r).unwrap(), 4);
    }

    #[test]
    fn reused_handles_repeat() {
        let mut a: Registry<u32> = Registry::new(Kind::Context);
        a.reuse_handles();
        let h = a.insert(1);
        a.remove(h).unwrap();
        assert_eq!(a.insert(2), h);
        assert_eq!(*a.get(h).unwrap(), 2);
    }
}
