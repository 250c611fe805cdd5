//! Streams, events, host callbacks and capture.

use std::ffi::{c_int, c_uint, c_void};

use super::ptr::out;
use super::{cu_alias, cu_export, h, hp};
use crate::abi::*;
use crate::process;
use crate::status::*;
use crate::stream::{self, HostCall};

/// `CUhostFn`.
pub type HostFn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;
/// `CUstreamCallback`.
pub type StreamCallback =
    Option<unsafe extern "C" fn(stream: Handle, status: CUresult, user_data: *mut c_void)>;

/// A caller pointer that crosses to the callback thread.
struct SendPtr(*mut c_void);
// SAFETY: the pointer is only handed back to the caller's own callback, as
// the driver API specifies; we never dereference it.
unsafe impl Send for SendPtr {}

/// A call of captured host function `func` with `data`, for a graph launch.
pub fn host_call(func: crate::process::HostFnPtr, data: usize) -> HostCall {
    let data = SendPtr(data as *mut c_void);
    HostCall {
        run: Box::new(move || {
            let data = data;
            // SAFETY: the caller's callback with the caller's data, captured
            // by cuLaunchHostFunc, which promises to invoke it each time the
            // graph runs.
            unsafe { func(data.0) }
        }),
    }
}

cu_export! {
    fn cuStreamCreate(stream: *mut Handle, flags: c_uint) {
        let p = process::get()?;
        if stream.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(stream::create(p, flags, 0)?);
        // SAFETY: the caller's contract: `stream` is NULL or points to a
        // writable `Handle`; `out` rejects NULL.
        unsafe { out(stream, v) }
    }

    fn cuStreamCreateWithPriority(stream: *mut Handle, flags: c_uint, priority: c_int) {
        let p = process::get()?;
        if stream.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(stream::create(p, flags, priority)?);
        // SAFETY: the caller's contract: `stream` is NULL or points to a
        // writable `Handle`; `out` rejects NULL.
        unsafe { out(stream, v) }
    }

    fn cuStreamDestroy_v2(s: Handle) {
        let p = process::get()?;
        stream::destroy(p, h(s))
    }

    fn cuStreamSynchronize(s: Handle) {
        let p = process::get()?;
        stream::synchronize(p, h(s))
    }

    fn cuStreamQuery(s: Handle) {
        let p = process::get()?;
        stream::query(p, h(s))
    }

    fn cuStreamWaitEvent(s: Handle, event: Handle, flags: c_uint) {
        let p = process::get()?;
        if flags & !1 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        stream::wait_event(p, h(s), h(event))
    }

    fn cuStreamGetPriority(s: Handle, priority: *mut c_int) {
        let p = process::get()?;
        let v = stream::properties(p, h(s))?.1;
        // SAFETY: the caller's contract: `priority` is NULL or points to a
        // writable `c_int`; `out` rejects NULL.
        unsafe { out(priority, v) }
    }

    fn cuStreamGetFlags(s: Handle, flags: *mut c_uint) {
        let p = process::get()?;
        let v = stream::properties(p, h(s))?.0;
        // SAFETY: the caller's contract: `flags` is NULL or points to a
        // writable `c_uint`; `out` rejects NULL.
        unsafe { out(flags, v) }
    }

    fn cuStreamGetCtx(s: Handle, ctx: *mut Handle) {
        let p = process::get()?;
        let v = hp(stream::properties(p, h(s))?.2);
        // SAFETY: the caller's contract: `ctx` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(ctx, v) }
    }

    fn cuLaunchHostFunc(s: Handle, func: HostFn, user: *mut c_void) {
        let p = process::get()?;
        let func = func.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if stream::capture_host(p, h(s), func, user as usize)? {
            return Ok(());
        }
        let data = SendPtr(user);
        stream::host_func(p, h(s), HostCall {
            run: Box::new(move || {
                let data = data;
                // SAFETY: the caller's callback with the caller's data, as
                // cuLaunchHostFunc promises to invoke it.
                unsafe { func(data.0) }
            }),
        })
    }

    fn cuStreamAddCallback(s: Handle, func: StreamCallback, user: *mut c_void, flags: c_uint) {
        let p = process::get()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let func = func.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let data = SendPtr(user);
        let stream_handle = SendPtr(s);
        stream::host_func(p, h(s), HostCall {
            run: Box::new(move || {
                let (data, sh) = (data, stream_handle);
                // SAFETY: as for cuLaunchHostFunc.
                unsafe { func(sh.0, CUDA_SUCCESS, data.0) }
            }),
        })
    }

    fn cuStreamBeginCapture_v2(s: Handle, mode: c_int) {
        let p = process::get()?;
        if !(0..=2).contains(&mode) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        stream::begin_capture(p, h(s))
    }

    fn cuStreamEndCapture(s: Handle, graph: *mut Handle) {
        let p = process::get()?;
        if graph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(stream::end_capture(p, h(s))?);
        // SAFETY: the caller's contract: `graph` is NULL or points to a
        // writable `Handle`; `out` rejects NULL.
        unsafe { out(graph, v) }
    }

    fn cuStreamIsCapturing(s: Handle, status: *mut c_int) {
        let p = process::get()?;
        let active = stream::is_capturing(p, h(s))?;
        // SAFETY: the caller's contract: `status` is NULL or points to a
        // writable `c_int`; `out` rejects NULL.
        unsafe { out(status, if active { CU_STREAM_CAPTURE_STATUS_ACTIVE } else { CU_STREAM_CAPTURE_STATUS_NONE }) }
    }

    fn cuEventCreate(event: *mut Handle, flags: c_uint) {
        let p = process::get()?;
        if event.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(stream::event_create(p, flags)?);
        // SAFETY: the caller's contract: `event` is NULL or points to a
        // writable `Handle`; `out` rejects NULL.
        unsafe { out(event, v) }
    }

    fn cuEventDestroy_v2(event: Handle) {
        let p = process::get()?;
        stream::event_destroy(p, h(event))
    }

    fn cuEventRecord(event: Handle, s: Handle) {
        let p = process::get()?;
        stream::record(p, h(event), h(s))
    }

    fn cuEventRecordWithFlags(event: Handle, s: Handle, flags: c_uint) {
        let p = process::get()?;
        if flags & !1 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        stream::record(p, h(event), h(s))
    }

    fn cuEventQuery(event: Handle) {
        let p = process::get()?;
        stream::event_query(p, h(event))
    }

    fn cuEventSynchronize(event: Handle) {
        let p = process::get()?;
        stream::event_synchronize(p, h(event))
    }

    fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) {
        let p = process::get()?;
        if ms.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = stream::elapsed_ms(p, h(start), h(end))?;
        // SAFETY: the caller's contract: `ms` is NULL or points to a writable
        // `f32`; `out` rejects NULL.
        unsafe { out(ms, v) }
    }
}

cu_alias! {
    cuStreamSynchronize_ptsz => cuStreamSynchronize(s: Handle);
    cuStreamQuery_ptsz => cuStreamQuery(s: Handle);
    cuStreamWaitEvent_ptsz => cuStreamWaitEvent(s: Handle, event: Handle, flags: c_uint);
    cuStreamGetPriority_ptsz => cuStreamGetPriority(s: Handle, priority: *mut c_int);
    cuStreamGetFlags_ptsz => cuStreamGetFlags(s: Handle, flags: *mut c_uint);
    cuStreamGetCtx_ptsz => cuStreamGetCtx(s: Handle, ctx: *mut Handle);
    cuLaunchHostFunc_ptsz => cuLaunchHostFunc(s: Handle, func: HostFn, user: *mut c_void);
    cuStreamAddCallback_ptsz => cuStreamAddCallback(s: Handle, func: StreamCallback, user: *mut c_void, flags: c_uint);
    cuStreamBeginCapture_v2_ptsz => cuStreamBeginCapture_v2(s: Handle, mode: c_int);
    cuStreamBeginCapture_ptsz => cuStreamBeginCapture(s: Handle);
    cuStreamEndCapture_ptsz => cuStreamEndCapture(s: Handle, graph: *mut Handle);
    cuStreamIsCapturing_ptsz => cuStreamIsCapturing(s: Handle, status: *mut c_int);
    cuEventRecord_ptsz => cuEventRecord(event: Handle, s: Handle);
    cuEventRecordWithFlags_ptsz => cuEventRecordWithFlags(event: Handle, s: Handle, flags: c_uint);
    cuStreamDestroy => cuStreamDestroy_v2(s: Handle);
    cuEventDestroy => cuEventDestroy_v2(event: Handle);
}

/// `cuStreamBeginCapture` (CUDA 10.0): global capture mode.
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_snake_case, clippy::missing_safety_doc)]
pub unsafe extern "C" fn cuStreamBeginCapture(s: Handle) -> CUresult {
    // SAFETY: forwards the caller's handle with the default mode.
    unsafe { cuStreamBeginCapture_v2(s, 0) }
}
