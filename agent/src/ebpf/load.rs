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

/// Loads and attaches the ioctl program for `mode`: the `bpf_rdonly_cast`
/// build if `cast` (the object was patched, [`super::kfunc`]), falling
/// back to the probe build if the kernel refuses it; returns the program
/// attached.
pub(super) fn attach_ioctl(
    ebpf: &mut Ebpf,
    mode: AttachMode,
    cast: bool,
    facts: &KernelFacts,
) -> Result<&'static str, ObserverError> {
    if cast {
        match attach_ioctl_program(ebpf, mode, mode.program(), facts) {
            Ok(()) => return Ok(mode.program()),
            // The verifier refused it: the probe build may still load.
            Err(
                e @ ObserverError::Program {
                    source: ProgramError::LoadError { .. },
                    ..
                },
            ) => tracing::warn!(
                %mode,
                error = %crate::error_chain::with_causes(&e),
                "the kernel refused the ioctl program with plain loads; trying the one with bpf_probe_read_kernel"
            ),
            Err(e) => return Err(e),
        }
    }
    attach_ioctl_program(ebpf, mode, mode.probe_program(), facts)?;
    Ok(mode.probe_program())
}

/// Loads and attaches ioctl program `name` for `mode`.
fn attach_ioctl_program(
    ebpf: &mut Ebpf,
    mode: AttachMode,
    name: &'static str,
    facts: &KernelFacts,
) -> Result<(), ObserverError> {
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
