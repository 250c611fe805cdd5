//! The programs' `bpf_rdonly_cast` kfunc calls. Rust eBPF cannot emit a
//! kfunc relocation, so each call is spelt out in the object as a
//! `BPF_PSEUDO_KFUNC_CALL` instruction whose immediate is
//! [`RDONLY_CAST_MARK`]; before loading, [`patch_rdonly_cast`] writes the
//! kfunc's id in the running kernel's BTF there. The kernel's verifier
//! then checks the call like any other (and replaces it by a register
//! move). Where the kernel has no such kfunc (before 6.2), the agent loads
//! the `*_probe` programs instead, which make no kfunc call.

use tessera_ebpf_common::config::{RDONLY_CAST_MARK, kfunc_call};

/// The kfunc's name in the kernel's BTF.
pub const RDONLY_CAST: &str = "bpf_rdonly_cast";

/// Replaces the immediate of every marked kfunc call instruction in
/// `object` (the ELF file's bytes) with `btf_id`; returns how many there
/// were. Instructions are 8-byte aligned in their sections, and sections
/// in the file, so only aligned positions are looked at.
pub fn patch_rdonly_cast(object: &mut [u8], btf_id: u32) -> usize {
    let marked = kfunc_call(RDONLY_CAST_MARK).to_le_bytes();
    let patched = kfunc_call(btf_id).to_le_bytes();
    let mut count = 0;
    for insn in object.chunks_exact_mut(8) {
        if *insn == marked {
            insn.copy_from_slice(&patched);
            count += 1;
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_aligned_marked_calls_are_patched() {
        let marked = kfunc_call(RDONLY_CAST_MARK).to_le_bytes();
        let mut object = vec![0u8; 40];
        object[8..16].copy_from_slice(&marked);
        object[32..40].copy_from_slice(&marked);
        // Unaligned: not an instruction.
        let mut unaligned = vec![0u8; 4];
        unaligned.extend_from_slice(&marked);
        unaligned.extend_from_slice(&[0u8; 4]);
        assert_eq!(patch_rdonly_cast(&mut object, 65_406), 2);
        assert_eq!(object[8..16], kfunc_call(65_406).to_le_bytes());
        assert_eq!(object[32..40], kfunc_call(65_406).to_le_bytes());
        assert_eq!(object[..8], [0u8; 8]);
        assert_eq!(patch_rdonly_cast(&mut unaligned, 65_406), 0);
        assert_eq!(patch_rdonly_cast(&mut object, 1), 0, "already patched");
    }
}
