//! Tessera's eBPF programs, linked into one object, `tessera.bpf.o`.
//!
//! They count, per cgroup, the ioctls issued on watched devices (the
//! NVIDIA device nodes, or stand-ins named in configuration) and the access
//! checks (opens) of those devices. The agent fills the watched-device map
//! and the `TESSERA_CONFIG` global, loads one of the ioctl programs
//! (whichever the kernel supports best) and the device program, and reads
//! the per-CPU count maps. Names and layouts are in `tessera-ebpf-common`.
//!
//! - [`tracepoint`]: `syscalls/sys_enter_ioctl`, any kernel;
//! - [`raw_tracepoint`]: `sys_enter`, cheaper per ioctl, runs on every syscall;
//! - [`kprobe`]: `nvidia_unlocked_ioctl` / `uvm_unlocked_ioctl_entry`, only
//!   NVIDIA ioctls pay anything;
//! - [`device`]: cgroup device programs, count opens and never deny (one
//!   also reports bypasses, one only counts, for older kernels);
//! - [`exit`]: `sched/sched_process_exit`, forgets exited processes.
//!
//! The ioctl programs walk from the fd to its device number with plain
//! loads ([`kernel`]) and reject what is not a watched device: non-devices
//! at once, devices from a per-CPU cache ([`verdict`]). Each ioctl program
//! comes in two builds: the `bpf_rdonly_cast` walk, and `*_probe` with
//! `bpf_probe_read_kernel` for kernels without that kfunc. Both the ioctl and the open paths report the first access of an
//! unregistered process in a watched cgroup ([`bypass`]); the ioctl path
//! also records UVM GPU registrations and estimates video memory
//! ([`track`]). The per-pod device guard is a separate object
//! (`src/guard/main.rs`), loaded once per pod.
#![no_std]
#![no_main]
// BPF inline assembly: the atomic add (`counters::add`) and the kfunc call
// (`kernel::rdonly_cast`).
#![feature(asm_experimental_arch)]

mod bypass;
mod config;
mod counters;
mod device;
mod exit;
mod ioctl;
mod kernel;
mod kprobe;
mod maps;
mod raw_tracepoint;
mod tracepoint;
mod track;
mod user;
mod verdict;

/// GPL-compatible, as helpers such as `bpf_probe_read_kernel` require.
/// Matches the crate's licence (GPL-2.0 OR MIT).
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program with a reachable panic path
    // (the loop below would never terminate), so this is never reached.
    unsafe { core::hint::unreachable_unchecked() }
}
