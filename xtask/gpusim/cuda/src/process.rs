//! Per-process driver state: the objects a CUDA process creates, and the
//! simulated node it talks to.
//!
//! One [`Process`] exists after `cuInit`. Its object tables live behind one
//! mutex that is never held across a wait (submitting to a full queue or
//! synchronising releases it first), so threads never block each other on
//! simulated GPU time.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::sync::{Mutex, MutexGuard, OnceLock};

use gpusim::connect::{ConnectError, Connection};
use gpusim::cost::{KernelCost, LaunchShape};
use gpusim::ioctl::Driver;
use gpusim::{Attachment, Sim, SimError};

use crate::charge::Charge;
use crate::handles::{Kind, Registry};
use crate::status::*;

/// Everything a process created through the driver API.
pub struct Process {
    /// The simulated node.
    pub sim: Sim,
    /// Stand-in device traffic.
    pub driver: Driver,
    inner: Mutex<Inner>,
    /// Host callbacks queued / finished (stream and context syncs wait
    /// for the callbacks queued before them).
    pub callbacks: (std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64),
    /// The host-callback worker's queue.
    pub callback_queue: std::sync::OnceLock<std::sync::mpsc::Sender<crate::stream::QueuedCall>>,
}

static PROCESS: OnceLock<Result<Process, CUresult>> = OnceLock::new();

thread_local! {
    /// This thread's context stack; the last entry is current.
    static CONTEXT_STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// `cuInit`: opens the simulated node once per process. A failure is
/// printed once to stderr and remembered.
pub fn init() -> Result<&'static Process, CUresult> {
    if FORKED.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    PROCESS
        .get_or_init(|| {
            let Connection { sim, driver } = Connection::from_env().map_err(|e| {
                let (cause, code): (&dyn std::error::Error, _) = match &e {
                    ConnectError::Sim(e) => (e, CUDA_ERROR_NOT_INITIALIZED),
                    ConnectError::Driver(e) => (e, CUDA_ERROR_NO_DEVICE),
                };
                eprintln!(
                    "gpusim: cuInit failed: {}",
                    tessera_error_chain::with_causes(cause)
                );
                code
            })?;
            // As a real driver: no GPU device node this process can open.
            if sim.gpu_count() == 0 {
                eprintln!(
                    "gpusim: cuInit failed: none of the {} GPUs' device nodes can be opened",
                    sim.state().gpu_count()
                );
                return Err(CUDA_ERROR_NO_DEVICE);
            }
            crate::sys::at_fork_child(forked);
            let n = sim.gpu_count();
            Ok(Process {
                sim,
                driver,
                inner: Mutex::new(Inner::new(n)),
                callbacks: Default::default(),
                callback_queue: std::sync::OnceLock::new(),
            })
        })
        .as_ref()
        .map_err(|&e| e)
}

/// Set in a child after `fork`: like the real driver, CUDA state does not
/// survive a fork.
static FORKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn forked() {
    FORKED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The process state, or `CUDA_ERROR_NOT_INITIALIZED` before `cuInit` (and
/// in a forked child).
pub fn get() -> Result<&'static Process, CUresult> {
    if FORKED.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    match PROCESS.get() {
        Some(Ok(p)) => Ok(p),
        _ => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

/// Maps a simulator error to the code a driver would return.
pub fn sim_err(e: SimError) -> CUresult {
    match e {
        SimError::InvalidDevice { .. } => CUDA_ERROR_INVALID_DEVICE,
        SimError::DeviceLost { .. } => CUDA_ERROR_DEVICE_UNAVAILABLE,
        SimError::OutOfMemory { .. } | SimError::TooManyProcesses { .. } => {
            CUDA_ERROR_OUT_OF_MEMORY
        }
        SimError::Detached { .. } => CUDA_ERROR_CONTEXT_IS_DESTROYED,
        SimError::Driver(e) => {
            eprintln!("gpusim: {}", tessera_error_chain::with_causes(&e));
            CUDA_ERROR_OPERATING_SYSTEM
        }
        SimError::State(e) => {
            eprintln!("gpusim: {}", tessera_error_chain::with_causes(&e));
            CUDA_ERROR_UNKNOWN
        }
    }
}

impl Process {
    /// Locks the object tables.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The device page: the node's allocation granularity.
    pub fn page_size(&self) -> u64 {
        self.sim.round_allocation(1)
    }

    /// Checks a device ordinal.
    pub fn device(&self, dev: i32) -> Result<usize, CUresult> {
        usize::try_from(dev)
            .ok()
            .filter(|&d| d < self.sim.gpu_count())
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }
}

/// This thread's current context, if any.
pub fn current_context() -> Option<u64> {
    // During thread (or process) exit the stack may be gone: no context.
    CONTEXT_STACK
        .try_with(|s| s.borrow().last().copied())
        .ok()
        .flatten()
}

/// Runs `f` on this thread's context stack.
/// Runs `f` on this thread's context stack (on an empty one once the
/// thread's stack is destroyed: exit handlers, such as the CUDA runtime's,
/// still release their contexts then).
pub fn with_stack<R>(f: impl FnOnce(&mut Vec<u64>) -> R) -> R {
    let mut f = Some(f);
    let done = CONTEXT_STACK
        .try_with(|s| f.take().map(|f| f(&mut s.borrow_mut())))
        .ok()
        .flatten();
    match (done, f) {
        (Some(r), _) => r,
        (None, Some(f)) => f(&mut Vec::new()),
        (None, None) => unreachable!("the closure ran or is still here"),
    }
}

/// A stream's position on its channel.
#[derive(Clone, Debug, Default)]
pub struct StreamState {
    /// Sequence number of the last item submitted through it.
    pub last_seq: Option<u64>,
    /// Graph being captured into, if capturing.
    pub capture: Option<u64>,
    /// Last node captured (the next one depends on it).
    pub capture_tail: Option<u64>,
    /// The capture was invalidated (an illegal call during it): it ends
    /// in `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, with no graph.
    pub capture_invalid: bool,
    /// This stream began its capture (others joined it by waiting on an
    /// event recorded in it).
    pub capture_origin: bool,
    /// This stream joined a capture and no stream of the capture has yet
    /// waited on an event it recorded since.
    pub capture_unjoined: bool,
}

/// A context.
pub struct Context {
    /// The process's channel on its device (`att.gpu` is the ordinal).
    pub att: Attachment,
    /// `CU_CTX_*` flags.
    pub flags: u32,
    /// Whether it is the device's primary context.
    pub primary: bool,
    /// Its NULL / legacy / per-thread stream.
    pub default_stream: StreamState,
}

/// A primary context's bookkeeping per device.
#[derive(Clone, Copy, Debug, Default)]
pub struct Primary {
    /// Its handle, the same for the process's life (reserved on first
    /// use; it names a context only while active).
    pub handle: Option<u64>,
    /// The context while active.
    pub ctx: Option<u64>,
    /// Retain count.
    pub retains: u32,
    /// Flags for the next activation.
    pub flags: u32,
}

/// A stream created by `cuStreamCreate*`.
pub struct Stream {
    /// Owning context.
    pub ctx: u64,
    /// `CU_STREAM_*` flags.
    pub flags: u32,
    /// Priority.
    pub priority: i32,
    /// Position and capture state.
    pub state: StreamState,
}

/// An event.
pub struct Event {
    /// `CU_EVENT_*` flags.
    pub flags: u32,
    /// Channel and sequence number of its last record.
    pub recorded: Option<(Attachment, u64)>,
    /// Its completion-time slot on that channel (see `EventSlots`).
    pub slot: Option<(Attachment, usize)>,
    /// Completion time once known (monotonic ns).
    pub time_ns: Option<u64>,
    /// Recorded by a capture: the graph and the stream that recorded it
    /// (a stream that waits on it joins that capture).
    pub captured: Option<(u64, u64)>,
}

/// A loaded module (no code is executed; kernels are names with a cost).
pub struct Module {
    /// Functions fetched from it, by name.
    pub functions: HashMap<String, u64>,
}

/// A kernel function.
pub struct Function {
    /// Kernel name (as asked for).
    pub name: CString,
    /// Cost per device, resolved on first launch there.
    pub costs: Vec<Option<KernelCost>>,
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` as set.
    pub max_dynamic_shared: i32,
    /// Block shape for the pre-`cuLaunchKernel` launch calls
    /// (`cuFuncSetBlockShape`; 1×1×1 until set).
    pub block_shape: [u32; 3],
}

/// A library (`cuLibraryLoadData`); kernels resolve to functions.
pub struct Library {
    /// Its implicit module.
    pub module: u64,
    /// Kernels, by name.
    pub kernels: HashMap<String, u64>,
}

/// A kernel handle (`CUkernel`): a function reachable without a context.
pub struct KernelObj {
    /// The function it resolves to.
    pub function: u64,
}

/// A kernel launch recorded in a graph.
#[derive(Clone, Copy, Debug)]
pub struct KernelLaunch {
    /// Function.
    pub function: u64,
    /// Shape.
    pub shape: LaunchShape,
    /// Dynamic shared memory.
    pub shared_mem: u32,
}

/// What a graph node does.
#[derive(Clone, Copy, Debug)]
pub enum NodeKind {
    /// Nothing (`CU_GRAPH_NODE_TYPE_EMPTY`).
    Empty,
    /// A kernel launch.
    Kernel(KernelLaunch),
    /// A child graph: the node owns this clone of the graph it was given.
    Child(u64),
    /// Graph memory: `bytes` at the address `dptr` reserved when the node
    /// was made, allocated each time the graph runs (until freed).
    MemAlloc {
        /// Requested size.
        bytes: u64,
        /// Its address.
        dptr: u64,
    },
    /// Frees the graph allocation at `dptr` when the graph runs.
    MemFree(u64),
    /// Calls a host function (`cuLaunchHostFunc` captured) with its data
    /// (an address the caller owns) each time the graph runs.
    Host {
        /// The function.
        func: HostFnPtr,
        /// Its argument.
        data: usize,
    },
}

/// A graph node.
pub struct GraphNode {
    /// Owning graph.
    pub graph: u64,
    /// What it does.
    pub kind: NodeKind,
}

/// A graph.
#[derive(Default)]
pub struct Graph {
    /// Nodes in insertion (a topological) order.
    pub nodes: Vec<u64>,
}

/// One thing an executable graph does when launched.
#[derive(Clone, Copy, Debug)]
pub enum Step {
    /// Launch a kernel.
    Kernel(KernelLaunch),
    /// Allocate graph memory (`bytes` at `dptr`).
    Alloc {
        /// Requested size.
        bytes: u64,
        /// Its address.
        dptr: u64,
    },
    /// Free the graph allocation at this address.
    Free(u64),
    /// Call a host function once the work before it is done.
    Host {
        /// The function.
        func: HostFnPtr,
        /// Its argument.
        data: usize,
    },
}

/// `CUhostFn`, not NULL.
pub type HostFnPtr = unsafe extern "C" fn(user_data: *mut std::ffi::c_void);

/// The steps one node of the instantiated graph contributes: (the node
/// they come from, which is the top-level node itself or a node inside
/// its child graph; the step).
pub type NodeSteps = Vec<(u64, Step)>;

/// An executable graph.
pub struct GraphExec {
    /// Per top-level node of the graph it was instantiated from, in order:
    /// the node and its steps (flattened through child graphs).
    pub nodes: Vec<(u64, NodeSteps)>,
}

/// A memory pool.
pub struct Pool {
    /// Device.
    pub device: usize,
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
    pub release_threshold: u64,
    /// Bytes currently allocated from it.
    pub used: u64,
    /// High-water mark of `used`.
    pub used_high: u64,
    /// Whether it is the device's default pool.
    pub default: bool,
    /// Freed allocations' memory the pool keeps reserved (still charged to
    /// the process) for reuse, up to its release threshold.
    pub cached: Vec<Charge>,
}

impl Pool {
    /// A pool of `device` with nothing in it.
    pub fn new(device: usize, default: bool) -> Self {
        Self {
            device,
            release_threshold: 0,
            used: 0,
            used_high: 0,
            default,
            cached: Vec::new(),
        }
    }

    /// Bytes it holds from the device: in use plus cached.
    pub fn reserved(&self) -> u64 {
        self.used + self.cached.iter().map(|c| c.bytes).sum::<u64>()
    }
}

/// How a device allocation was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocKind {
    /// `cuMemAlloc`.
    Linear,
    /// `cuMemAllocPitch`.
    Pitch,
    /// `cuMemAllocManaged` (host-backed).
    Managed,
    /// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync`.
    Pool(u64),
    /// Graph memory, allocated by a launch (its address belongs to the
    /// graph's memory node and outlives the allocation).
    Graph,
}

/// A device allocation.
pub struct Allocation {
    /// Context it belongs to.
    pub ctx: u64,
    /// Requested size.
    pub size: u64,
    /// Its own charge (kept so it can be returned after the context is
    /// gone; none for a small linear allocation, whose page is charged,
    /// see `heap`); `charge.att.gpu` is its device.
    pub charge: Charge,
    /// How it was made.
    pub kind: AllocKind,
}

/// A pinned host allocation.
pub struct HostAlloc {
    /// Length.
    pub len: usize,
    /// `CU_MEMHOSTALLOC_*` flags.
    pub flags: u32,
    /// RM object handle.
    pub rm: u32,
    /// Device ordinal it was charged under (for the RM parent).
    pub device: usize,
    /// Registered (`cuMemHostRegister`) rather than allocated.
    pub registered: bool,
}

/// A VMM physical allocation (`cuMemCreate`).
pub struct Physical {
    /// Context it is charged through (one on its device).
    pub ctx: u64,
    /// Size.
    pub size: u64,
    /// Its charge; `charge.att.gpu` is its device.
    pub charge: Charge,
    /// Mappings referring to it.
    pub mappings: u32,
    /// Handle references: 1 from `cuMemCreate`, one more per
    /// `cuMemRetainAllocationHandle`, one less per `cuMemRelease`. The
    /// memory is freed when no reference and no mapping is left.
    pub refs: u32,
}

/// A mapping of physical memory into a reserved range.
#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    /// Length.
    pub size: u64,
    /// The physical allocation.
    pub physical: u64,
}

/// A CUDA array (1D/2D/3D or one mipmap level).
pub struct Array {
    /// Context it belongs to.
    pub ctx: u64,
    /// The device memory backing it (levels of a mipmapped array have
    /// none of their own).
    pub alloc: Option<Charge>,
    /// Descriptor as created.
    pub desc: crate::abi::CudaArray3dDescriptor,
    /// Mipmapped array it is a level of.
    pub parent: Option<u64>,
}

/// A mipmapped array.
pub struct Mipmapped {
    /// Context it belongs to.
    pub ctx: u64,
    /// The device memory backing all its levels.
    pub alloc: Charge,
    /// Level-0 descriptor.
    pub desc: crate::abi::CudaArray3dDescriptor,
    /// Number of levels.
    pub levels: u32,
    /// Level arrays handed out so far.
    pub level_arrays: Vec<Option<u64>>,
}

/// Every object table.
pub struct Inner {
    /// Contexts.
    pub contexts: Registry<Context>,
    /// Primary contexts, per device.
    pub primary: Vec<Primary>,
    /// Modules.
    pub modules: Registry<Module>,
    /// Functions.
    pub functions: Registry<Function>,
    /// Libraries.
    pub libraries: Registry<Library>,
    /// Kernels.
    pub kernels: Registry<KernelObj>,
    /// Streams.
    pub streams: Registry<Stream>,
    /// Events.
    pub events: Registry<Event>,
    /// Graphs.
    pub graphs: Registry<Graph>,
    /// Graph nodes.
    pub nodes: Registry<GraphNode>,
    /// Executable graphs.
    pub execs: Registry<GraphExec>,
    /// Memory pools.
    pub pools: Registry<Pool>,
    /// Current pool per device (default pool unless set).
    pub device_pools: Vec<Option<u64>>,
    /// Default pool per device.
    pub default_pools: Vec<Option<u64>>,
    /// Device allocations by address.
    pub allocations: BTreeMap<u64, Allocation>,
    /// Pinned host memory by address.
    pub host: BTreeMap<usize, HostAlloc>,
    /// VMM physical allocations.
    pub physical: Registry<Physical>,
    /// Reserved VA ranges: start → length.
    pub reservations: BTreeMap<u64, u64>,
    /// Mapped ranges: start → mapping.
    pub mappings: BTreeMap<u64, Mapping>,
    /// Arrays.
    pub arrays: Registry<Array>,
    /// Mipmapped arrays.
    pub mipmaps: Registry<Mipmapped>,
    /// Device address space.
    pub va: crate::va::AddressSpace,
    /// Pages of linear allocations, per context.
    pub heaps: crate::heap::Heaps,
    /// Free event slots per (GPU, channel).
    pub event_slots: HashMap<(usize, usize), EventSlots>,
}

/// Allocator of one channel's event slots.
#[derive(Default)]
pub struct EventSlots {
    next: usize,
    free: Vec<usize>,
}

impl EventSlots {
    /// A free slot, if any is left.
    pub fn take(&mut self) -> Option<usize> {
        self.free.pop().or_else(|| {
            (self.next < gpusim::layout::EVENT_SLOTS).then(|| {
                self.next += 1;
                self.next - 1
            })
        })
    }

    /// Returns a slot.
    pub fn give(&mut self, slot: usize) {
        self.free.push(slot);
    }
}

impl Inner {
    fn new(gpus: usize) -> Self {
        let mut contexts = Registry::new(Kind::Context);
        if crate::context::knobs().reuse_handles {
            contexts.reuse_handles();
        }
        Self {
            contexts,
            primary: vec![Primary::default(); gpus],
            modules: Registry::new(Kind::Module),
            functions: Registry::new(Kind::Function),
            libraries: Registry::new(Kind::Library),
            kernels: Registry::new(Kind::Kernel),
            streams: Registry::new(Kind::Stream),
            events: Registry::new(Kind::Event),
            graphs: Registry::new(Kind::Graph),
            nodes: Registry::new(Kind::GraphNode),
            execs: Registry::new(Kind::GraphExec),
            pools: Registry::new(Kind::Pool),
            device_pools: vec![None; gpus],
            default_pools: vec![None; gpus],
            allocations: BTreeMap::new(),
            host: BTreeMap::new(),
            physical: Registry::new(Kind::Physical),
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            arrays: Registry::new(Kind::Array),
            mipmaps: Registry::new(Kind::Mipmapped),
            va: crate::va::AddressSpace::new(),
            heaps: crate::heap::Heaps::default(),
            event_slots: HashMap::new(),
        }
    }

    /// The current context, checked.
    pub fn current(&self) -> Result<(u64, &Context), CUresult> {
        let h = current_context().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        let c = self.contexts.get_or(h, CUDA_ERROR_CONTEXT_IS_DESTROYED)?;
        Ok((h, c))
    }

    /// Resolves a stream handle (0, `CU_STREAM_LEGACY` and
    /// `CU_STREAM_PER_THREAD` mean the current context's default stream)
    /// to its context and state.
    pub fn stream_mut(&mut self, stream: u64) -> Result<(u64, &mut StreamState), CUresult> {
        if stream <= crate::abi::CU_STREAM_PER_THREAD as u64 {
            let h = current_context().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
            let c = self
                .contexts
                .get_mut(h)
                .map_err(|_| CUDA_ERROR_CONTEXT_IS_DESTROYED)?;
            return Ok((h, &mut c.default_stream));
        }
        let s = self.streams.get_mut(stream)?;
        Ok((s.ctx, &mut s.state))
    }

    /// The default pool of `device`, created on first use.
    pub fn default_pool(&mut self, device: usize) -> u64 {
        if let Some(p) = self.default_pools[device] {
            return p;
        }
        let p = self.pools.insert(Pool::new(device, true));
        self.default_pools[device] = Some(p);
        if self.device_pools[device].is_none() {
            self.device_pools[device] = Some(p);
        }
        p
    }
}
