//! kprobe on the NVIDIA drivers' ioctl entry points, `nvidia_unlocked_ioctl`
//! and `uvm_unlocked_ioctl_entry` (both `(struct file *, unsigned int,
//! unsigned long)`): only NVIDIA ioctls pay anything.

use crate::{
    config, ioctl,
    kernel::{self, Cast, Probe, Walk},
    verdict,
};
use aya_ebpf::{macros::kprobe, programs::ProbeContext};

#[kprobe]
pub fn ioctl_kprobe(ctx: ProbeContext) -> u32 {
    on_ioctl::<Cast>(&ctx)
}

/// [`ioctl_kprobe`] for kernels without `bpf_rdonly_cast`.
#[kprobe]
pub fn ioctl_kprobe_probe(ctx: ProbeContext) -> u32 {
    on_ioctl::<Probe>(&ctx)
}

#[inline(always)]
fn on_ioctl<W: Walk>(ctx: &ProbeContext) -> u32 {
    let Some(offsets) = config::offsets() else {
        return 0;
    };
    let (Some(file), Some(cmd), Some(arg)) = (
        ctx.arg::<*const u8>(0),
        ctx.arg::<u64>(1),
        ctx.arg::<u64>(2),
    ) else {
        return 0;
    };
    let file = W::file(file, &config::casts());
    if let Some(rdev) = W::file_rdev(file, &offsets)
        && let Some(watched) = verdict::watched_dev(rdev)
    {
        ioctl::record(kernel::current(), &offsets, rdev, watched, cmd as u32, arg);
    }
    0
}
