//! Event sets: Xid delivery (see `events.rs` for the model).

use std::ffi::{c_uint, c_ulonglong};
use std::time::Duration;

use crate::abi::{
    DeviceHandle, EVENT_ALL, EventData, EventDataV1, EventSetHandle, NO_INSTANCE, Return,
};
use crate::error::NvmlError;
use crate::events::{self, Event, SUPPORTED};
use crate::guard::entry;
use crate::library::context;
use crate::{handle, ptr};

/// `nvmlEventSetCreate`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut EventSetHandle) -> Return {
    entry(|| {
        context()?;
        if set.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        // SAFETY: NVML contract: valid for a handle (checked non-NULL).
        unsafe { ptr::put(set, events::create()) }
    })
}

/// `nvmlDeviceGetSupportedEventTypes`: Xid critical errors only.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: DeviceHandle,
    event_types: *mut c_ulonglong,
) -> Return {
    entry(|| {
        context()?.gpu(device)?;
        // SAFETY: NVML contract: NULL or valid for an unsigned long long.
        unsafe { ptr::put(event_types, SUPPORTED) }
    })
}

/// `nvmlDeviceRegisterEvents`: types outside `nvmlEventTypeAll` are
/// invalid; valid types that are not simulated give
/// `NVML_ERROR_NOT_SUPPORTED` and register nothing.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: DeviceHandle,
    event_types: c_ulonglong,
    set: EventSetHandle,
) -> Return {
    entry(|| {
        let ctx = context()?;
        let gpu = ctx.gpu(device)?;
        let set = events::lookup(set)?;
        if event_types & !EVENT_ALL != 0 {
            return Err(NvmlError::InvalidArgument);
        }
        if event_types & !SUPPORTED != 0 {
            return Err(NvmlError::NotSupported);
        }
        ctx.live(gpu)?;
        events::lock(&set).register(&ctx, gpu, event_types)
    })
}

fn wait(set: EventSetHandle, timeout_ms: c_uint) -> Result<Event, NvmlError> {
    let ctx = context()?;
    let set = events::lookup(set)?;
    let mut set = events::lock(&set);
    set.wait(&ctx, Duration::from_millis(timeout_ms.into()))
}

/// `nvmlEventSetWait_v2`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: EventSetHandle,
    data: *mut EventData,
    timeoutms: c_uint,
) -> Return {
    entry(|| {
        if data.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        let e = wait(set, timeoutms)?;
        let v = EventData {
            device: handle::of(e.gpu),
            event_type: e.event_type,
            event_data: e.xid,
            gpu_instance_id: NO_INSTANCE,
            compute_instance_id: NO_INSTANCE,
        };
        // SAFETY: NVML contract: valid for an nvmlEventData_t (checked).
        unsafe { ptr::put(data, v) }
    })
}

/// `nvmlEventSetWait` (v1): the event data of its era (no instance ids).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: EventSetHandle,
    data: *mut EventDataV1,
    timeoutms: c_uint,
) -> Return {
    entry(|| {
        if data.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        let e = wait(set, timeoutms)?;
        let v = EventDataV1 {
            device: handle::of(e.gpu),
            event_type: e.event_type,
            event_data: e.xid,
        };
        // SAFETY: NVML contract: valid for the v1 event data (checked).
        unsafe { ptr::put(data, v) }
    })
}

/// `nvmlEventSetFree`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlEventSetFree(set: EventSetHandle) -> Return {
    entry(|| {
        context()?;
        events::free(set)
    })
}
