//! Loading and attaching the observer object's programs: one helper that
//! loads a program, attaches it and unloads it again if attaching fails,
//! used for the ioctl program of each mode, the process-exit hook and the
//! open audit.

use aya::{
    Ebpf,
    programs::{CgroupDevice, KProbe, Program, ProgramError, RawTracePoint, TracePoint},
};
use tessera_ebpf_common::names;

use super::mode::{self, AttachMode, KernelFacts};
use super::observer::ObserverError;

/// The program types the observer loads, whose loading takes no arguments.
pub(super) trait Load {
    /// Verifies and loads the program into the kernel.
    fn load(&mut self) -> Result<(), ProgramError>;
    /// Unloads it (and detaches its links).
    fn unload(&mut self) -> Result<(), ProgramError>;
}

macro_rules! impl_load {
    ($($program:ty),*) => {$(
        impl Load for $program {
            fn load(&mut self) -> Result<(), ProgramError> {
                <$program>::load(self)
            }
            fn unload(&mut self) -> Result<(), ProgramError> {
                <$program>::unload(self)
            }
        }
    )*};
}

impl_load!(TracePoint, RawTracePoint, KProbe, CgroupDevice);

/// Program `name` of `ebpf`, as its type.
pub(super) fn program<'a, P>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut P, ObserverError>
where
    &'a mut P: TryFrom<&'a mut Program, Error = ProgramError>,
{
    let program = ebpf.program_mut(name).ok_or(ObserverError::Missing(name))?;
    program.try_into().map_err(ObserverError::program(name))
}

/// Loads program `name` and attaches it with `attach`; unloads it again
/// if attaching fails.
pub(super) fn load_attach<'a, P: Load + 'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
    attach: impl FnOnce(&mut P) -> Result<(), ProgramError>,
) -> Result<(), ObserverError>
where
    &'a mut P: TryFrom<&'a mut Program, Error = ProgramError>,
{
    let program: &mut P = program(ebpf, name)?;
    program.load().map_err(ObserverError::program(name))?;
    attach(program).map_err(|e| {
        let _ = program.unload();
        ObserverError::program(name)(e)
    })
}

/// Loads and attaches the ioctl program for `mode`.
pub(super) fn attach_ioctl(
    ebpf: &mut Ebpf,
    mode: AttachMode,
    facts: &KernelFacts,
) -> Result<(), ObserverError> {
    let name = mode.program();
    match mode {
        AttachMode::Tracepoint => load_attach(ebpf, name, |p: &mut TracePoint| {
            p.attach("syscalls", "sys_enter_ioctl").map(drop)
        }),
        AttachMode::RawTracepoint => load_attach(ebpf, name, |p: &mut RawTracePoint| {
            p.attach("sys_enter").map(drop)
        }),
        AttachMode::Kprobe => load_attach(ebpf, name, |p: &mut KProbe| {
            p.attach(mode::NVIDIA_IOCTL_FN, 0)?;
            if facts.uvm_ioctl
                && let Err(e) = p.attach(mode::UVM_IOCTL_FN, 0)
            {
                tracing::warn!(error = %e, function = mode::UVM_IOCTL_FN, "uvm ioctls will not be counted");
            }
            Ok(())
        }),
    }
}

/// Loads and attaches the process-exit hook.
pub(super) fn attach_exit_hook(ebpf: &mut Ebpf) -> Result<(), ObserverError> {
    load_attach(ebpf, names::PROG_PROCESS_EXIT, |p: &mut TracePoint| {
        p.attach("sched", "sched_process_exit").map(drop)
    })
}
