//! Streams, events, host callbacks and stream capture.
//!
//! Synchronising or querying a capturing stream is illegal and
//! invalidates its capture, as in the driver. `GPUSIM_IS_CAPTURING_DELAY_MS=N`
//! makes `cuStreamIsCapturing` answer N ms late (the answer as it was when
//! asked), to reproduce races with a capture beginning meanwhile.
//!
//! All streams of a process on one GPU feed the same channel in launch
//! order, so a stream is a position on that channel: synchronising it
//! waits for its last item. Events are zero-length markers whose
//! completion time comes from the GPU timeline.

use std::sync::atomic::Ordering;

use gpusim::layout::ItemKind;
use gpusim::sim::Attachment;

use crate::abi::CU_EVENT_DISABLE_TIMING;
use crate::process::{Event, Inner, Process, Stream, StreamState, sim_err};
use crate::status::*;

/// Submits `kind` work of `ns` on `stream`, recording it as the stream's
/// last item. Fails while the stream is capturing.
pub fn submit(
    p: &Process,
    stream: u64,
    kind: ItemKind,
    ns: u64,
) -> Result<(Attachment, u64), CUresult> {
    let att = channel(&mut p.lock(), stream)?;
    submit_on(p, stream, att, kind, ns)
}

/// The channel work submitted on `stream` goes to. Fails while the stream
/// is capturing.
pub fn channel(inner: &mut Inner, stream: u64) -> Result<Attachment, CUresult> {
    let (ctx, st) = inner.stream_mut(stream)?;
    if st.capture.is_some() {
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(inner.contexts.get(ctx)?.att)
}

/// Submits work on `att`, `stream`'s [`channel`], and records it as the
/// stream's last item. The process lock is not held while the submission
/// waits for room in the queue.
pub fn submit_on(
    p: &Process,
    stream: u64,
    att: Attachment,
    kind: ItemKind,
    ns: u64,
) -> Result<(Attachment, u64), CUresult> {
    let seq = p.sim.submit(&att, kind, ns).map_err(sim_err)?;
    note_submitted(&mut p.lock(), stream, seq);
    Ok((att, seq))
}

/// [`submit_on`] of a kernel of `warps` warps (recorded in the simulator's
/// launch log).
pub fn submit_kernel_on(
    p: &Process,
    stream: u64,
    att: Attachment,
    ns: u64,
    warps: u64,
) -> Result<(), CUresult> {
    let seq = p.sim.submit_kernel(&att, ns, warps).map_err(sim_err)?;
    note_submitted(&mut p.lock(), stream, seq);
    Ok(())
}

/// Records item `seq` as `stream`'s last (if the stream still exists).
fn note_submitted(inner: &mut Inner, stream: u64, seq: u64) {
    if let Ok((_, st)) = inner.stream_mut(stream) {
        st.last_seq = Some(st.last_seq.map_or(seq, |s| s.max(seq)));
    }
}

/// The stream's channel and last item.
fn position(p: &Process, stream: u64) -> Result<(Attachment, Option<u64>), CUresult> {
    let mut inner = p.lock();
    let (ctx, st) = inner.stream_mut(stream)?;
    let last = st.last_seq;
    Ok((inner.contexts.get(ctx)?.att, last))
}

/// `cuStreamCreate` / `cuStreamCreateWithPriority`.
pub fn create(p: &Process, flags: u32, priority: i32) -> Result<u64, CUresult> {
    if flags & !1 != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut inner = p.lock();
    let (ctx, _) = inner.current()?;
    Ok(inner.streams.insert(Stream {
        ctx,
        flags,
        priority: priority.clamp(-5, 0),
        state: StreamState::default(),
    }))
}

/// `cuStreamDestroy_v2` (pending work still completes).
pub fn destroy(p: &Process, stream: u64) -> Result<(), CUresult> {
    p.lock().streams.remove(stream).map(|_| ())
}

/// Invalidates `stream`'s capture if it is capturing (an illegal call).
fn forbid_capture(p: &Process, stream: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    let (_, st) = inner.stream_mut(stream)?;
    if st.capture.is_some() {
        st.capture_invalid = true;
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(())
}

/// `cuStreamSynchronize`.
pub fn synchronize(p: &Process, stream: u64) -> Result<(), CUresult> {
    forbid_capture(p, stream)?;
    let (att, last) = position(p, stream)?;
    if let Some(seq) = last {
        p.sim.wait(&att, seq).map_err(sim_err)?;
    }
    wait_callbacks(p);
    Ok(())
}

/// `cuStreamQuery`: `CUDA_SUCCESS` when idle, else `CUDA_ERROR_NOT_READY`.
pub fn query(p: &Process, stream: u64) -> Result<(), CUresult> {
    forbid_capture(p, stream)?;
    let (att, last) = position(p, stream)?;
    match last {
        Some(seq) if !p.sim.is_complete(&att, seq).map_err(sim_err)? => Err(CUDA_ERROR_NOT_READY),
        _ => Ok(()),
    }
}

/// `cuStreamWaitEvent`: work is already ordered on the channel; only the
/// handles are checked. An event recorded in a capture forks the capture
/// onto a stream that is not capturing (it joins the capture), and joins
/// back the stream that recorded it when a stream of the same capture
/// waits on it; one of another capture is `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`.
pub fn wait_event(p: &Process, stream: u64, event: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    let captured = inner.events.get(event)?.captured;
    let waiting = inner.stream_mut(stream)?.1.capture;
    let Some((g, from)) = captured else {
        return Ok(());
    };
    if !capturing(&inner, g) {
        // That capture is over: an ordinary, completed point.
        return Ok(());
    }
    match waiting {
        None => {
            let st = inner.stream_mut(stream)?.1;
            st.capture = Some(g);
            st.capture_tail = None;
            st.capture_invalid = false;
            st.capture_origin = false;
            st.capture_unjoined = true;
        }
        Some(c) if c == g => {
            if from != stream
                && let Ok(s) = inner.streams.get_mut(from)
            {
                s.state.capture_unjoined = false;
            }
        }
        Some(_) => return Err(CUDA_ERROR_STREAM_CAPTURE_ISOLATION),
    }
    Ok(())
}

/// Whether a stream still captures into graph `g`.
fn capturing(inner: &Inner, g: u64) -> bool {
    inner
        .streams
        .iter()
        .any(|(_, s)| s.state.capture == Some(g))
}

/// The streams capturing into graph `g`.
fn capture_members(inner: &Inner, g: u64) -> Vec<u64> {
    inner
        .streams
        .iter()
        .filter(|(_, s)| s.state.capture == Some(g))
        .map(|(h, _)| h)
        .collect()
}

/// Stream properties: (flags, priority, context).
pub fn properties(p: &Process, stream: u64) -> Result<(u32, i32, u64), CUresult> {
    let mut inner = p.lock();
    if stream <= crate::abi::CU_STREAM_PER_THREAD as u64 {
        let (ctx, _) = inner.stream_mut(stream)?;
        return Ok((0, 0, ctx));
    }
    let s = inner.streams.get(stream)?;
    Ok((s.flags, s.priority, s.ctx))
}

/// A host function to call once a stream reaches a point.
pub struct HostCall {
    /// Calls the function.
    pub run: Box<dyn FnOnce() + Send>,
}

/// A callback waiting for its point on a channel.
pub struct QueuedCall {
    att: Attachment,
    seq: u64,
    call: HostCall,
}

/// `cuLaunchHostFunc` / `cuStreamAddCallback`: runs `call` once the work
/// submitted so far on `stream` is done. Callbacks run one at a time, in
/// the order they were queued, on one worker thread per process.
pub fn host_func(p: &'static Process, stream: u64, call: HostCall) -> Result<(), CUresult> {
    let (att, seq) = submit(p, stream, ItemKind::Marker, 0)?;
    let queue = p.callback_queue.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<QueuedCall>();
        let _ = std::thread::Builder::new()
            .name("gpusim-callbacks".into())
            .spawn(move || {
                for q in rx {
                    let _ = p.sim.wait(&q.att, q.seq);
                    (q.call.run)();
                    p.callbacks.1.fetch_add(1, Ordering::AcqRel);
                }
            });
        tx
    });
    p.callbacks.0.fetch_add(1, Ordering::AcqRel);
    queue
        .send(QueuedCall { att, seq, call })
        .map_err(|_| CUDA_ERROR_UNKNOWN)
}

/// `cuLaunchHostFunc` on a capturing stream: a host node in the capture
/// (true); false, doing nothing, if `stream` is not capturing.
pub fn capture_host(
    p: &Process,
    stream: u64,
    func: crate::process::HostFnPtr,
    data: usize,
) -> Result<bool, CUresult> {
    let mut inner = p.lock();
    let Some(g) = inner.stream_mut(stream)?.1.capture else {
        return Ok(false);
    };
    let node = crate::graph::capture_host(&mut inner, g, func, data)?;
    inner.stream_mut(stream)?.1.capture_tail = Some(node);
    Ok(true)
}

/// Waits for the host callbacks queued so far to have run.
pub fn wait_callbacks(p: &Process) {
    let target = p.callbacks.0.load(Ordering::Acquire);
    while p.callbacks.1.load(Ordering::Acquire) < target {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

/// `cuStreamBeginCapture`: later launches on `stream` go into a new graph.
pub fn begin_capture(p: &Process, stream: u64) -> Result<(), CUresult> {
    if stream <= crate::abi::CU_STREAM_PER_THREAD as u64 {
        // The legacy NULL stream cannot be captured.
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    let mut inner = p.lock();
    if inner.streams.get(stream)?.state.capture.is_some() {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    let g = inner.graphs.insert(Default::default());
    let st = &mut inner.streams.get_mut(stream)?.state;
    st.capture = Some(g);
    st.capture_tail = None;
    st.capture_invalid = false;
    st.capture_origin = true;
    st.capture_unjoined = false;
    Ok(())
}

/// `cuStreamEndCapture`: returns the captured graph. Ended on the stream
/// that began it, every stream that joined it leaves it too; it fails
/// (with no graph) if an illegal call invalidated it or a stream that
/// joined it was not joined back. Ended on a stream that only joined it,
/// it is `CUDA_ERROR_STREAM_CAPTURE_UNMATCHED` and invalidates it.
pub fn end_capture(p: &Process, stream: u64) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    let (_, st) = inner.stream_mut(stream)?;
    let g = st.capture.ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
    if !st.capture_origin {
        for s in capture_members(&inner, g) {
            inner.streams.get_mut(s)?.state.capture_invalid = true;
        }
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    }
    let mut invalid = false;
    let mut unjoined = false;
    for s in capture_members(&inner, g) {
        let st = &mut inner.streams.get_mut(s)?.state;
        invalid |= st.capture_invalid;
        unjoined |= st.capture_unjoined;
        *st = StreamState {
            last_seq: st.last_seq,
            ..StreamState::default()
        };
    }
    if invalid || unjoined {
        let _ = crate::graph::destroy_in(&mut inner, g);
        return Err(if invalid {
            CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        } else {
            CUDA_ERROR_STREAM_CAPTURE_UNJOINED
        });
    }
    Ok(g)
}

/// `cuStreamIsCapturing`. Asked of the legacy NULL stream while a
/// blocking stream captures, `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (the
/// legacy stream would depend on it).
pub fn is_capturing(p: &Process, stream: u64) -> Result<bool, CUresult> {
    let active = {
        let mut inner = p.lock();
        let active = inner.stream_mut(stream)?.1.capture.is_some();
        if stream <= crate::abi::CU_STREAM_LEGACY as u64
            && inner
                .streams
                .iter()
                .any(|(_, s)| s.flags & 1 == 0 && s.state.capture.is_some())
        {
            return Err(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
        }
        active
    };
    static DELAY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let ms = *DELAY.get_or_init(|| {
        std::env::var("GPUSIM_IS_CAPTURING_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    Ok(active)
}

/// `cuEventCreate`.
pub fn event_create(p: &Process, flags: u32) -> Result<u64, CUresult> {
    if flags & !0xf != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut inner = p.lock();
    inner.current()?;
    Ok(inner.events.insert(Event {
        flags,
        recorded: None,
        slot: None,
        time_ns: None,
        captured: None,
    }))
}

/// `cuEventDestroy_v2`.
pub fn event_destroy(p: &Process, event: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    let e = inner.events.remove(event)?;
    if let Some((att, slot)) = e.slot {
        inner
            .event_slots
            .entry((att.gpu, att.channel))
            .or_default()
            .give(slot);
    }
    Ok(())
}

/// `cuEventRecord`: a marker that writes its completion time into the
/// event's own slot on the channel, so the time is kept however many
/// other markers follow.
pub fn record(p: &Process, event: u64, stream: u64) -> Result<(), CUresult> {
    let (att, slot) = {
        let mut inner = p.lock();
        inner.events.get(event)?;
        // In a capture: a point of the graph other streams may fork from
        // or join at (nodes run in order, so nothing is submitted).
        let capture = inner.stream_mut(stream)?.1.capture;
        inner.events.get_mut(event)?.captured = capture.map(|g| (g, stream));
        if capture.is_some() {
            return Ok(());
        }
        let att = channel(&mut inner, stream)?;
        let old = inner.events.get(event)?.slot;
        let slot = match old {
            Some((a, s)) if a == att => Some(s),
            other => {
                if let Some((a, s)) = other {
                    inner
                        .event_slots
                        .entry((a.gpu, a.channel))
                        .or_default()
                        .give(s);
                }
                inner
                    .event_slots
                    .entry((att.gpu, att.channel))
                    .or_default()
                    .take()
            }
        };
        inner.events.get_mut(event)?.slot = slot.map(|s| (att, s));
        (att, slot)
    };
    let seq = match slot {
        Some(s) => p.sim.submit_event(&att, s).map_err(sim_err)?,
        None => p.sim.submit(&att, ItemKind::Marker, 0).map_err(sim_err)?,
    };
    let mut inner = p.lock();
    note_submitted(&mut inner, stream, seq);
    let e = inner.events.get_mut(event)?;
    e.recorded = Some((att, seq));
    e.time_ns = None;
    Ok(())
}

/// Whether the event is complete; fills in its time when it is.
fn event_done(p: &Process, event: u64) -> Result<bool, CUresult> {
    let (rec, slot, known) = {
        let inner = p.lock();
        let e = inner.events.get(event)?;
        (e.recorded, e.slot, e.time_ns.is_some())
    };
    let Some((att, seq)) = rec else {
        return Ok(true);
    };
    if known {
        return Ok(true);
    }
    let time = match slot {
        Some((a, s)) if a == att => p.sim.event_time(&att, s),
        _ => p.sim.marker_time(&att, seq),
    }
    .map_err(sim_err)?;
    match time {
        Some(t) => {
            if let Ok(e) = p.lock().events.get_mut(event)
                && e.recorded == Some((att, seq))
            {
                e.time_ns = Some(t);
            }
            Ok(true)
        }
        None => p.sim.is_complete(&att, seq).map_err(sim_err),
    }
}

/// `cuEventQuery`.
pub fn event_query(p: &Process, event: u64) -> Result<(), CUresult> {
    if event_done(p, event)? {
        Ok(())
    } else {
        Err(CUDA_ERROR_NOT_READY)
    }
}

/// `cuEventSynchronize`.
pub fn event_synchronize(p: &Process, event: u64) -> Result<(), CUresult> {
    let rec = p.lock().events.get(event)?.recorded;
    if let Some((att, seq)) = rec {
        p.sim.wait(&att, seq).map_err(sim_err)?;
        event_done(p, event)?;
    }
    Ok(())
}

/// `cuEventElapsedTime` in ms.
pub fn elapsed_ms(p: &Process, start: u64, end: u64) -> Result<f32, CUresult> {
    for e in [start, end] {
        let inner = p.lock();
        let ev = inner.events.get(e)?;
        if ev.flags & CU_EVENT_DISABLE_TIMING != 0 || ev.recorded.is_none() {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
    }
    if !event_done(p, start)? || !event_done(p, end)? {
        return Err(CUDA_ERROR_NOT_READY);
    }
    let inner = p.lock();
    let t0 = inner.events.get(start)?.time_ns;
    let t1 = inner.events.get(end)?.time_ns;
    match (t0, t1) {
        (Some(a), Some(b)) => Ok((b as f64 - a as f64) as f32 / 1e6),
        // Completed too long ago for the timeline to remember.
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}
