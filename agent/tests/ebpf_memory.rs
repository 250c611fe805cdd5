//! Privileged tests of what the programs read from NVIDIA ioctl
//! parameters, with hand-made parameter blocks on stand-in devices
//! (`/dev/null` as nvidiactl, `/dev/zero` as nvidia-uvm): the RM_ALLOC
//! video-memory estimate for both driver layouts (NVOS64 of 48 bytes from
//! 535, 40 before; NVOS21; XFER-wrapped; FINN-serialised and other classes
//! left out), RM_FREE of an object and of a whole client, and the GPU
//! UUID of UVM_REGISTER_GPU. Skipped (with the reason) without root or the
//! object.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod ebpf_support;
use ebpf_support as support;

use std::fs::File;

use support::{
    Child, TestCgroup, answer, child_role, devices, object, skip_if, skip_reason, sys, wait_line,
};
use tessera_agent::ebpf::{Observer, ObserverConfig};
use tessera_ebpf_common::{
    ioctl::{NV_ESC_IOCTL_XFER_CMD, Xfer},
    rm::{NV_ESC_RM_ALLOC, NV_ESC_RM_FREE},
    uvm::UVM_REGISTER_GPU,
};

const MIB: u64 = 1 << 20;
const CLIENT: u32 = 0xc1d0_0001;
/// A second client of the same process, as NVML opens besides CUDA's.
const NVML_CLIENT: u32 = 0xc1d0_0002;
/// A client that allocates no video memory.
const IDLE_CLIENT: u32 = 0xc1d0_0003;
const PARENT: u32 = 0xcaf0_0000;
const UUID: [u8; 16] = *b"\x5e\x1a\x00\x00\x00\x00\x40\x00\x80\x00\x00\x00\x51\x51\x00\x07";

/// `NVOS64_PARAMETERS`, 535 and later.
#[repr(C)]
#[derive(Default)]
struct Nvos64 {
    h_root: u32,
    h_parent: u32,
    h_new: u32,
    h_class: u32,
    p_alloc_parms: u64,
    p_rights: u64,
    params_size: u32,
    flags: u32,
    status: u32,
    pad: u32,
}

/// `NVOS64_PARAMETERS` before 535.
#[repr(C)]
#[derive(Default)]
struct Nvos64Legacy {
    h_root: u32,
    h_parent: u32,
    h_new: u32,
    h_class: u32,
    p_alloc_parms: u64,
    p_rights: u64,
    status: u32,
    pad: u32,
}

/// `NVOS21_PARAMETERS`, 535 and later (32 bytes either way).
#[repr(C)]
#[derive(Default)]
struct Nvos21 {
    h_root: u32,
    h_parent: u32,
    h_new: u32,
    h_class: u32,
    p_alloc_parms: u64,
    params_size: u32,
    status: u32,
}

/// `NVOS00_PARAMETERS`.
#[repr(C)]
struct Nvos00 {
    h_root: u32,
    h_parent: u32,
    h_old: u32,
    status: u32,
}

/// `NV_MEMORY_ALLOCATION_PARAMS`, as bytes; `size` at offset 64.
fn mem_params(size: u64) -> Box<[u8; 128]> {
    let mut p = Box::new([0u8; 128]);
    p[64..72].copy_from_slice(&size.to_ne_bytes());
    p
}

fn nvos64(h_new: u32, class: u32, params: &[u8; 128], flags: u32) -> Nvos64 {
    nvos64_in(CLIENT, h_new, class, params, flags)
}

fn nvos64_in(h_root: u32, h_new: u32, class: u32, params: &[u8; 128], flags: u32) -> Nvos64 {
    Nvos64 {
        h_root,
        h_parent: PARENT,
        h_new,
        h_class: class,
        p_alloc_parms: params.as_ptr() as u64,
        params_size: 128,
        flags,
        ..Nvos64::default()
    }
}

/// RM_ALLOC with parameter block `params` (its size picks the layout).
fn alloc<T>(ctl: &File, params: &mut T) {
    sys::escape(ctl, NV_ESC_RM_ALLOC, params);
}

fn free(ctl: &File, h_root: u32, h_old: u32) {
    let mut p = Nvos00 {
        h_root,
        h_parent: PARENT,
        h_old,
        status: 0,
    };
    sys::escape(ctl, NV_ESC_RM_FREE, &mut p);
}

/// The child: every kind of RM_ALLOC once, two frees, two UVM
/// registrations; then answers and waits to be told to exit (so the
/// parent reads the estimate while the process is alive).
fn child_side() {
    let Some(role) = child_role() else { return };
    let ctl = File::open("/dev/null").unwrap();
    let uvm = File::open("/dev/zero").unwrap();
    let unwatched = File::open("/dev/full").unwrap();
    let (p1, p2, p3, p4, p5) = (
        mem_params(MIB),
        mem_params(2 * MIB),
        mem_params(4 * MIB),
        mem_params(8 * MIB),
        mem_params(16 * MIB),
    );
    match role.as_str() {
        "allocs" => {
            // 1: NVOS64 (48 bytes), video memory, 1 MiB.
            alloc(&ctl, &mut nvos64(0x100, 0x40, &p1, 0));
            // 2: NVOS21 wrapped in XFER, 2 MiB.
            let mut a21 = Nvos21 {
                h_root: CLIENT,
                h_parent: PARENT,
                h_new: 0x101,
                h_class: 0x40,
                p_alloc_parms: p2.as_ptr() as u64,
                ..Nvos21::default()
            };
            let mut xfer = Xfer {
                cmd: NV_ESC_RM_ALLOC,
                size: size_of::<Nvos21>() as u32,
                ptr: std::ptr::from_mut(&mut a21) as u64,
            };
            sys::escape(&ctl, NV_ESC_IOCTL_XFER_CMD, &mut xfer);
            // 3: pinned system memory (class 0x3E): not video memory.
            alloc(&ctl, &mut nvos64(0x102, 0x3E, &p3, 0));
            // 4: FINN-serialised parameters: not a plain struct.
            alloc(&ctl, &mut nvos64(0x103, 0x40, &p4, 1));
            // 5: the pre-535 NVOS64 (40 bytes), 16 MiB.
            let mut legacy = Nvos64Legacy {
                h_root: CLIENT,
                h_parent: PARENT,
                h_new: 0x104,
                h_class: 0x40,
                p_alloc_parms: p5.as_ptr() as u64,
                ..Nvos64Legacy::default()
            };
            alloc(&ctl, &mut legacy);
            // On a device that is not watched: never seen.
            alloc(&unwatched, &mut nvos64(0x105, 0x40, &p5, 0));
            // Free object 1, and a handle never allocated.
            free(&ctl, CLIENT, 0x100);
            free(&ctl, CLIENT, 0x999);
            // Two UVM registrations of one GPU.
            for _ in 0..2 {
                let mut reg = [0u8; 40];
                reg[..16].copy_from_slice(&UUID);
                sys::ioctl(&uvm, UVM_REGISTER_GPU.into(), &mut reg);
            }
        }
        "two-clients" => {
            // CUDA's client: 1 MiB and 2 MiB.
            alloc(&ctl, &mut nvos64(0x300, 0x40, &p1, 0));
            alloc(&ctl, &mut nvos64(0x301, 0x40, &p2, 0));
            // A live handle again: the driver refuses it, so not counted.
            alloc(&ctl, &mut nvos64(0x301, 0x40, &p4, 0));
            // NVML's client: 4 MiB, under a handle CUDA's also uses.
            alloc(&ctl, &mut nvos64_in(NVML_CLIENT, 0x300, 0x40, &p3, 0));
            // nvmlShutdown frees NVML's client; then an idle one goes.
            free(&ctl, NVML_CLIENT, NVML_CLIENT);
            free(&ctl, IDLE_CLIENT, IDLE_CLIENT);
        }
        "client-free" => {
            alloc(&ctl, &mut nvos64(0x200, 0x40, &p5, 0));
            // Freeing the client frees everything it held.
            free(&ctl, CLIENT, CLIENT);
        }
        other => panic!("unknown role {other}"),
    }
    answer("ready");
    wait_line("exit");
    std::process::exit(0);
}

fn observer(driver_major: u32) -> Observer {
    let devices = devices(&["control=/dev/null", "uvm=/dev/zero"]);
    let mut config = ObserverConfig::new(object().unwrap(), devices);
    config.driver_major = Some(driver_major);
    Observer::start(&config).unwrap()
}

/// Runs a child in a fresh cgroup; returns its pid, cgroup and the
/// observer's snapshot while it is still alive. Checks that the process
/// leaves the estimate when it exits.
fn scenario(
    test: &str,
    role: &str,
    driver_major: u32,
) -> (u32, u64, tessera_agent::ebpf::Snapshot) {
    let cgroup = TestCgroup::new(&format!("mem-{role}-{driver_major}"));
    let observer = observer(driver_major);
    let mut child = Child::spawn(test, role).join(&cgroup.0);
    let pid = child.pid();
    assert_eq!(child.go_until_answer(), "ready");
    let snap = observer.snapshot().unwrap();
    child.finish();
    let after = observer.snapshot().unwrap();
    let forgotten = !after.rm_procs.contains_key(&pid);
    assert!(
        !observer.exit_hook() || forgotten,
        "the exit hook forgets the process"
    );
    (pid, cgroup.id(), snap)
}

#[test]
fn memory_estimate_with_the_535_layouts() {
    child_side();
    let test = "memory_estimate_with_the_535_layouts";
    skip_if!(skip_reason());
    let (pid, cgroup_id, snap) = scenario(test, "allocs", 595);
    let p = snap.rm_procs.get(&pid).copied().unwrap();
    assert_eq!(p.cgroup_id, cgroup_id);
    // Tracked: the 48-byte NVOS64 (1 MiB) and the XFER-wrapped NVOS21
    // (2 MiB); left out: class 0x3E, the FINN one, the 40-byte block.
    assert_eq!((p.allocs, p.frees, p.client_frees), (2, 1, 0), "{p:?}");
    assert_eq!(p.live(), 2 * MIB);
    assert_eq!(snap.rm_bytes_of(cgroup_id), 2 * MIB);
    assert!(
        snap.stats.args_unreadable >= 2,
        "FINN and the unknown size: {:?}",
        snap.stats
    );
    assert_eq!(snap.gpus_of(cgroup_id).len(), 1);
    let (uuid, use_) = snap.gpus_of(cgroup_id)[0];
    assert_eq!(uuid, UUID);
    assert_eq!((use_.registrations, use_.first_tgid), (2, pid));
}

#[test]
fn memory_estimate_with_the_pre_535_layouts() {
    child_side();
    let test = "memory_estimate_with_the_pre_535_layouts";
    skip_if!(skip_reason());
    let (pid, cgroup_id, snap) = scenario(test, "allocs", 530);
    let p = snap.rm_procs.get(&pid).copied().unwrap();
    // Tracked: NVOS21 (2 MiB) and the 40-byte NVOS64 (16 MiB); the
    // 48-byte blocks are not RM_ALLOCs to this driver, so the free of
    // object 1 matches nothing.
    assert_eq!((p.allocs, p.frees), (2, 0), "{p:?}");
    assert_eq!(p.live(), 18 * MIB);
    assert_eq!(snap.rm_bytes_of(cgroup_id), 18 * MIB);
}

#[test]
fn freeing_the_client_frees_everything() {
    child_side();
    let test = "freeing_the_client_frees_everything";
    skip_if!(skip_reason());
    let (pid, cgroup_id, snap) = scenario(test, "client-free", 595);
    let p = snap.rm_procs.get(&pid).copied().unwrap();
    assert_eq!((p.allocs, p.client_frees), (1, 1), "{p:?}");
    assert_eq!(p.live(), 0);
    assert_eq!(snap.rm_bytes_of(cgroup_id), 0);
}

#[test]
fn freeing_one_client_leaves_the_others() {
    child_side();
    let test = "freeing_one_client_leaves_the_others";
    skip_if!(skip_reason());
    let (pid, cgroup_id, snap) = scenario(test, "two-clients", 595);
    let p = snap.rm_procs.get(&pid).copied().unwrap();
    // Tracked: CUDA's 1 + 2 MiB and NVML's 4 MiB; the repeated live
    // handle not. Freeing NVML's client takes its 4 MiB only.
    assert_eq!((p.allocs, p.frees, p.client_frees), (3, 0, 2), "{p:?}");
    assert_eq!(p.live(), 3 * MIB);
    assert_eq!(snap.rm_bytes_of(cgroup_id), 3 * MIB);
}
