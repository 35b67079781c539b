//! The GPU launch layer: the only module of the CUDA backend with `unsafe`.
//!
//! Everything the backend does to the device goes through a handful of owned handles here: the
//! context and one non-blocking stream, one device arena (a single allocation at start, handed
//! out by a bump allocator, never freed until the backend drops), pinned host buffers, loaded
//! modules and kernels, events and captured graphs. Every driver call the steady decode loop
//! makes (memcpy, launch, graph launch, event record/sync) is counted in [`DriverCounters`], so
//! the token ledger can say what a token cost and a test can assert that nothing allocates.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, DriverError};

use crate::backend::BackendError;

impl From<DriverError> for BackendError {
    fn from(e: DriverError) -> Self {
        BackendError::Device(format!("CUDA driver: {e}"))
    }
}

/// What the driver was asked to do since the backend started (monotonic counters).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DriverCounters {
    /// Device allocations (the arena is one).
    pub device_allocs: u64,
    /// Pinned host allocations.
    pub pinned_allocs: u64,
    /// Plain kernel launches.
    pub launches: u64,
    /// Graph replays.
    pub graph_launches: u64,
    /// Kernel nodes replayed through graphs.
    pub graph_nodes: u64,
    /// Host waits on the device that the step's results require (collect).
    pub hard_syncs: u64,
    /// Waits a policy asks for (logits copied out for dump/parity, sequence set-up, the
    /// device clock's anchor).
    pub policy_syncs: u64,
    /// Waits only a debugging setting asks for (`NERVA_CUDA_SYNC=1`).
    pub debug_syncs: u64,
    /// Bytes copied host → device.
    pub h2d_bytes: u64,
    /// Bytes copied device → host.
    pub d2h_bytes: u64,
}

/// Is a CUDA driver library loadable at all? (Checked before any cudarc call, which would
/// panic without one.)
pub fn driver_library_present() -> bool {
    // SAFETY: only tries to dlopen the driver library by its usual names and drops the handle.
    unsafe { sys::is_culib_present() }
}

/// The driver's CUDA version as (major, minor), e.g. (13, 0).
pub fn driver_version() -> Result<(i32, i32), BackendError> {
    cu::init()?;
    let mut v = 0i32;
    // SAFETY: cuDriverGetVersion writes one int through the valid pointer.
    unsafe { sys::cuDriverGetVersion(&mut v) }.result()?;
    Ok((v / 1000, (v % 1000) / 10))
}

/// A device pointer into the arena, with its length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevBuf {
    /// Device address.
    pub ptr: sys::CUdeviceptr,
    /// Bytes.
    pub bytes: usize,
}

impl DevBuf {
    /// Null buffer (an absent optional input of a kernel).
    pub const NULL: DevBuf = DevBuf { ptr: 0, bytes: 0 };

    /// The address `offset` bytes in.
    pub fn at(self, offset: usize) -> sys::CUdeviceptr {
        debug_assert!(offset <= self.bytes);
        self.ptr + offset as u64
    }
}

/// Page-locked host memory, mapped for the device's copy engines.
pub struct Pinned {
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: the buffer is plain memory owned by this value; access goes through &/&mut self.
unsafe impl Send for Pinned {}

impl Pinned {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr points to `bytes` bytes allocated by cuMemHostAlloc (zeroed at creation)
        // and owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and &mut self makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in Gpu::pinned and freed once here.
        let _ = unsafe { cu::free_host(self.ptr.cast()) };
    }
}

/// A kernel of a loaded module.
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    f: sys::CUfunction,
    /// Dynamic shared memory bytes of each launch (`Gpu::with_dynamic_shared`).
    shared: u32,
}

// SAFETY: a CUfunction handle is usable from any thread with the context current.
unsafe impl Send for Kernel {}

/// Kernel arguments: pointers to each value, as cuLaunchKernel takes them. Fixed capacity so a
/// launch never allocates.
pub struct Args<'a> {
    ptrs: [*mut c_void; 24],
    len: usize,
    _values: std::marker::PhantomData<&'a ()>,
}

impl<'a> Args<'a> {
    /// No arguments yet.
    pub fn new() -> Self {
        Args {
            ptrs: [std::ptr::null_mut(); 24],
            len: 0,
            _values: std::marker::PhantomData,
        }
    }

    /// Append one argument; `T` must have the C layout of the kernel's parameter.
    pub fn arg<T: Copy>(mut self, value: &'a T) -> Self {
        assert!(self.len < self.ptrs.len(), "too many kernel arguments");
        self.ptrs[self.len] = (value as *const T).cast_mut().cast();
        self.len += 1;
        self
    }
}

impl Default for Args<'_> {
    fn default() -> Self {
        Args::new()
    }
}

/// A captured and instantiated CUDA graph.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    /// Kernel nodes in the graph.
    pub nodes: usize,
}

// SAFETY: graph handles are usable from any thread with the context current.
unsafe impl Send for Graph {}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: both handles were created by Gpu::end_capture and are destroyed once here.
        unsafe {
            let _ = cu::graph::exec_destroy(self.exec);
            let _ = cu::graph::destroy(self.graph);
        }
    }
}

/// A device event (timing disabled unless asked: cheaper to record).
pub struct Event {
    ev: sys::CUevent,
}

// SAFETY: event handles are usable from any thread with the context current.
unsafe impl Send for Event {}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by Gpu::event and destroyed once here.
        let _ = unsafe { cu::event::destroy(self.ev) };
    }
}

/// A launch attribute slot that says nothing.
fn attribute_ignored() -> sys::CUlaunchAttribute {
    sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_IGNORE,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue { pad: [0; 64] },
    }
}

/// Blocks grouped in thread-block clusters of `dims`.
fn cluster_attribute((x, y, z): (u32, u32, u32)) -> sys::CUlaunchAttribute {
    sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue {
            clusterDim: sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x, y, z },
        },
    }
}

/// The device, its stream, its one arena, and the counters.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: sys::CUstream,
    arena: DevBuf,
    arena_used: usize,
    modules: Vec<sys::CUmodule>,
    /// Launch with programmatic stream serialization (Hopper's programmatic dependent launch):
    /// a kernel's blocks may be scheduled while the kernel before it drains. Every kernel in
    /// `kernels/` is written for it: before `pdl_wait` it touches only what no earlier work of
    /// the stream is still writing (weights, step metadata, older KV positions), and it lets
    /// its successor start only after that wait (`kernels/common.cuh`).
    programmatic: bool,
    /// What has been asked of the driver.
    pub counters: DriverCounters,
}

// SAFETY: the stream and module handles belong to `ctx`, which is made current on the calling
// thread before use (`bind`); the backend is used by one thread at a time (&mut self).
unsafe impl Send for Gpu {}

/// Facts read off a device before committing to it.
#[derive(Debug, Clone)]
pub struct DeviceFacts {
    /// Device name.
    pub name: String,
    /// Compute capability.
    pub capability: (i32, i32),
    /// Bytes free and total.
    pub free: usize,
    /// Total bytes.
    pub total: usize,
    /// Streaming multiprocessors.
    pub sms: i32,
}

impl Gpu {
    /// Open device `ordinal` with its own non-blocking stream.
    pub fn open(ordinal: usize) -> Result<(Self, DeviceFacts), BackendError> {
        let count = CudaContext::device_count()?;
        if ordinal as i32 >= count {
            return Err(BackendError::Device(format!(
                "--device {ordinal}: the driver sees {count} CUDA device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal)?;
        ctx.bind_to_thread()?;
        let (free, total) = ctx.mem_get_info()?;
        let facts = DeviceFacts {
            name: ctx.name()?,
            capability: ctx.compute_capability()?,
            free,
            total,
            sms: ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        };
        let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking)?;
        Ok((
            Gpu {
                ctx,
                stream,
                arena: DevBuf::NULL,
                arena_used: 0,
                modules: Vec::new(),
                programmatic: false,
                counters: DriverCounters::default(),
            },
            facts,
        ))
    }

    /// Launch every later kernel with programmatic dependent launch (sm_90 and newer; the
    /// caller checks the architecture: older devices reject the attribute).
    pub fn set_programmatic(&mut self, on: bool) {
        self.programmatic = on;
    }

    /// Whether kernels launch with programmatic dependent launch.
    pub fn programmatic(&self) -> bool {
        self.programmatic
    }

    /// The backend's stream, for libraries that enqueue on it (cuBLAS).
    pub fn raw_stream(&self) -> sys::CUstream {
        self.stream
    }

    /// Make the context current on this thread (the engine thread is not the one that built
    /// the backend).
    pub fn bind(&self) -> Result<(), BackendError> {
        self.ctx.bind_to_thread()?;
        Ok(())
    }

    /// Allocate the one device arena of `bytes`.
    pub fn allocate_arena(&mut self, bytes: usize) -> Result<(), BackendError> {
        assert!(self.arena.ptr == 0, "the arena is allocated once");
        // SAFETY: a plain device allocation with the context current; freed in Drop.
        let ptr = unsafe { cu::malloc_sync(bytes) }?;
        self.counters.device_allocs += 1;
        self.arena = DevBuf { ptr, bytes };
        Ok(())
    }

    /// The whole device arena (weights, KV pool, activations); empty before `allocate_arena`.
    pub fn arena(&self) -> DevBuf {
        self.arena
    }

    /// Carve `bytes` (256-byte aligned) out of the arena.
    pub fn carve(&mut self, bytes: usize) -> Result<DevBuf, BackendError> {
        let start = self.arena_used.next_multiple_of(256);
        let end = start + bytes;
        if end > self.arena.bytes {
            return Err(BackendError::Device(format!(
                "arena plan error: {end} bytes needed, {} allocated",
                self.arena.bytes
            )));
        }
        self.arena_used = end;
        Ok(DevBuf {
            ptr: self.arena.at(start),
            bytes,
        })
    }

    /// Page-locked host memory of `bytes`, zeroed.
    pub fn pinned(&mut self, bytes: usize) -> Result<Pinned, BackendError> {
        // SAFETY: cuMemHostAlloc with the context current; the pointer is owned by Pinned.
        let ptr = unsafe { cu::malloc_host(bytes.max(1), 0) }?.cast::<u8>();
        // SAFETY: ptr covers bytes.max(1) writable bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes.max(1)) };
        self.counters.pinned_allocs += 1;
        Ok(Pinned {
            ptr,
            bytes: bytes.max(1),
        })
    }

    /// Load a compiled module (cubin) and look up `names` in it.
    pub fn load(&mut self, image: &[u8], names: &[&str]) -> Result<Vec<Kernel>, BackendError> {
        // SAFETY: image is a complete cubin (checked by the kernel cache), borrowed for the call;
        // cuModuleLoadData copies what it keeps.
        let module = unsafe { cu::module::load_data(image.as_ptr().cast()) }?;
        self.modules.push(module);
        names
            .iter()
            .map(|name| {
                let c = CString::new(*name).expect("kernel names have no NUL");
                // SAFETY: module is loaded and alive until Drop; name is NUL-terminated.
                let f = unsafe { cu::module::get_function(module, c) }.map_err(|e| {
                    BackendError::Device(format!("kernel {name} missing from its module: {e}"))
                })?;
                Ok(Kernel { f, shared: 0 })
            })
            .collect()
    }

    /// `k` launched with `bytes` of dynamic shared memory (past the 48 KiB every kernel may
    /// use, the function must opt in first).
    pub fn with_dynamic_shared(&self, k: Kernel, bytes: u32) -> Result<Kernel, BackendError> {
        // SAFETY: k.f is a valid function of a loaded module; the driver checks the size
        // against the device's limit.
        unsafe {
            sys::cuFuncSetAttribute(
                k.f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .result()?;
        Ok(Kernel {
            f: k.f,
            shared: bytes,
        })
    }

    /// Ask for `percent` of the SM's shared memory and L1 as shared memory while `k` runs (a
    /// hint: the driver rounds it up to a configuration the SM has, or overrides it), so that
    /// blocks holding data in shared memory fit as many per SM as their registers allow.
    pub fn prefer_shared_memory(&self, k: Kernel, percent: i32) -> Result<(), BackendError> {
        // SAFETY: k.f is a valid function of a loaded module; the driver checks the percentage.
        unsafe {
            sys::cuFuncSetAttribute(
                k.f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                percent,
            )
        }
        .result()?;
        Ok(())
    }

    /// How many blocks of `threads` threads (and `k`'s dynamic shared memory) an SM holds at
    /// once.
    pub fn blocks_per_sm(&self, k: Kernel, threads: u32) -> Result<i32, BackendError> {
        let mut n = 0;
        // SAFETY: k.f is a valid function of a loaded module; n is written through a valid
        // pointer.
        unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                k.f,
                threads as i32,
                k.shared as usize,
            )
        }
        .result()?;
        Ok(n)
    }

    /// Registers and local (spill) bytes of a kernel, for the compile report.
    pub fn kernel_resources(&self, k: Kernel) -> Result<(i32, i32), BackendError> {
        use sys::CUfunction_attribute::*;
        // SAFETY: k.f is a valid function of a loaded module.
        let regs =
            unsafe { cu::function::get_function_attribute(k.f, CU_FUNC_ATTRIBUTE_NUM_REGS) }?;
        // SAFETY: as above.
        let local = unsafe {
            cu::function::get_function_attribute(k.f, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
        }?;
        Ok((regs, local))
    }

    /// Enqueue `k` on the stream.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in number, order and layout, and every
    /// device pointer among them must address memory of the arena large enough for what the
    /// kernel touches with these grid dimensions.
    pub unsafe fn launch(
        &mut self,
        k: Kernel,
        grid: (u32, u32, u32),
        block: u32,
        args: Args<'_>,
    ) -> Result<(), BackendError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.launch_with(k, grid, block, None, args) }
    }

    /// Enqueue `k` with its blocks grouped in thread-block clusters of `cluster` (sm_90+; a
    /// cluster of more than 8 blocks needs `allow_large_clusters` on `k` first).
    ///
    /// # Safety
    /// As `launch`; and `grid` must be a multiple of `cluster` in every dimension.
    pub unsafe fn launch_clustered(
        &mut self,
        k: Kernel,
        grid: (u32, u32, u32),
        block: u32,
        cluster: (u32, u32, u32),
        args: Args<'_>,
    ) -> Result<(), BackendError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.launch_with(k, grid, block, Some(cluster), args) }
    }

    /// # Safety
    /// As `launch_clustered` (no cluster: as `launch`).
    unsafe fn launch_with(
        &mut self,
        k: Kernel,
        grid: (u32, u32, u32),
        block: u32,
        cluster: Option<(u32, u32, u32)>,
        args: Args<'_>,
    ) -> Result<(), BackendError> {
        let mut args = args;
        let mut attrs = [attribute_ignored(); 2];
        let mut n = 0;
        if self.programmatic {
            attrs[n] = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value: sys::CUlaunchAttributeValue {
                    programmaticStreamSerializationAllowed: 1,
                },
            };
            n += 1;
        }
        if let Some(dims) = cluster {
            attrs[n] = cluster_attribute(dims);
            n += 1;
        }
        let config = self.launch_config(grid, block, k.shared, &mut attrs[..n]);
        // SAFETY: the caller guarantees the argument list; the values behind the pointers live
        // for this call ('a), and cuLaunchKernelEx copies them (and reads `config` and `attrs`,
        // which outlive the call) before returning.
        unsafe {
            sys::cuLaunchKernelEx(&config, k.f, args.ptrs.as_mut_ptr(), std::ptr::null_mut())
        }
        .result()?;
        self.counters.launches += 1;
        Ok(())
    }

    /// A launch of `grid` blocks of `block` threads and `shared` bytes of dynamic shared
    /// memory on the stream with `attrs` (which must outlive every use of the returned config).
    fn launch_config(
        &self,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        attrs: &mut [sys::CUlaunchAttribute],
    ) -> sys::CUlaunchConfig {
        sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shared,
            hStream: self.stream,
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        }
    }

    /// Let `k` run in clusters of more than 8 blocks (up to 16 on Hopper).
    pub fn allow_large_clusters(&self, k: Kernel) -> Result<(), BackendError> {
        // SAFETY: k.f is a valid function of a loaded module; the attribute takes 0 or 1.
        unsafe {
            sys::cuFuncSetAttribute(
                k.f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                1,
            )
        }
        .result()?;
        Ok(())
    }

    /// How many clusters of `cluster` blocks of `block` threads can be resident at once (0:
    /// the kernel cannot be launched that way on this device).
    pub fn max_active_clusters(
        &self,
        k: Kernel,
        block: u32,
        cluster: (u32, u32, u32),
    ) -> Result<i32, BackendError> {
        let mut attr = [cluster_attribute(cluster)];
        let config = self.launch_config(cluster, block, k.shared, &mut attr);
        let mut n = 0i32;
        // SAFETY: k.f is a valid function; config and the attribute it points to live for the
        // call; n is written.
        unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, k.f, &config) }.result()?;
        Ok(n)
    }

    /// Copy `src` into device memory at `dst` (stream-ordered; `src` must be pinned or the copy
    /// is staged by the driver before this returns).
    pub fn upload(&mut self, dst: sys::CUdeviceptr, src: &[u8]) -> Result<(), BackendError> {
        // SAFETY: dst addresses at least src.len() bytes of the arena (callers carve buffers to
        // size); src is valid for reads for the call, and the driver either stages pageable
        // memory before returning or reads pinned memory that the caller keeps unchanged until
        // the stream passes this point (the staging ring's events).
        unsafe { cu::memcpy_htod_async(dst, src, self.stream) }?;
        self.counters.h2d_bytes += src.len() as u64;
        Ok(())
    }

    /// Copy device memory at `src` into pinned `dst[range]` (stream-ordered).
    pub fn download(
        &mut self,
        dst: &mut Pinned,
        range: std::ops::Range<usize>,
        src: sys::CUdeviceptr,
    ) -> Result<(), BackendError> {
        let n = range.len();
        // SAFETY: dst is pinned memory owned by the caller, which reads it only after the
        // event recorded after this copy has completed; src addresses n bytes of the arena.
        unsafe { cu::memcpy_dtoh_async(&mut dst.bytes_mut()[range], src, self.stream) }?;
        self.counters.d2h_bytes += n as u64;
        Ok(())
    }

    /// Device-to-device copy (stream-ordered).
    pub fn copy(
        &mut self,
        dst: sys::CUdeviceptr,
        src: sys::CUdeviceptr,
        bytes: usize,
    ) -> Result<(), BackendError> {
        // SAFETY: both ranges lie in the arena (callers index carved buffers).
        unsafe { cu::memcpy_dtod_async(dst, src, bytes, self.stream) }?;
        Ok(())
    }

    /// Zero device memory (stream-ordered).
    pub fn zero(&mut self, dst: sys::CUdeviceptr, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: the range lies in the arena (callers index carved buffers).
        unsafe { cu::memset_d8_async(dst, 0, bytes, self.stream) }?;
        Ok(())
    }

    /// A new event; `timing` enables elapsed-time queries.
    pub fn event(&self, timing: bool) -> Result<Event, BackendError> {
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        Ok(Event {
            ev: cu::event::create(flags)?,
        })
    }

    /// Record `ev` at this point of the stream.
    pub fn record(&mut self, ev: &Event) -> Result<(), BackendError> {
        // SAFETY: ev and the stream are valid handles of this context.
        unsafe { cu::event::record(ev.ev, self.stream) }?;
        Ok(())
    }

    /// Block until the stream has passed `ev`. `policy` classifies the wait in the counters.
    pub fn wait(&mut self, ev: &Event, policy: bool) -> Result<(), BackendError> {
        // SAFETY: ev is a valid, recorded event.
        unsafe { cu::event::synchronize(ev.ev) }?;
        if policy {
            self.counters.policy_syncs += 1;
        } else {
            self.counters.hard_syncs += 1;
        }
        Ok(())
    }

    /// Block until the stream has passed `ev`, for debugging only (counted apart from the waits
    /// the engine needs, so a ledger read under a debug setting says why it synced).
    pub fn wait_debug(&mut self, ev: &Event) -> Result<(), BackendError> {
        // SAFETY: ev is a valid, recorded event.
        unsafe { cu::event::synchronize(ev.ev) }?;
        self.counters.debug_syncs += 1;
        Ok(())
    }

    /// Has the stream passed `ev`?
    pub fn done(&self, ev: &Event) -> bool {
        // SAFETY: ev is a valid event.
        unsafe { cu::event::query(ev.ev) }.is_ok()
    }

    /// Milliseconds between two timing events (both complete).
    pub fn elapsed_ms(&self, start: &Event, end: &Event) -> Result<f32, BackendError> {
        // SAFETY: both are timing events of this context that have completed.
        Ok(unsafe { cu::event::elapsed(start.ev, end.ev) }?)
    }

    /// Start capturing this thread's work on the stream into a graph.
    pub fn begin_capture(&mut self) -> Result<(), BackendError> {
        // SAFETY: the stream is a valid non-default stream (capture refuses the legacy one).
        unsafe {
            cu::stream::begin_capture(
                self.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }?;
        Ok(())
    }

    /// Finish the capture and instantiate it. Launches made during capture were recorded, not
    /// run, so they are taken back out of the launch counter.
    pub fn end_capture(&mut self, launches_before: u64) -> Result<Graph, BackendError> {
        // SAFETY: a capture was begun on this stream by this thread.
        let graph = unsafe { cu::stream::end_capture(self.stream) }?;
        let mut nodes = 0usize;
        // SAFETY: graph is valid; a null node array asks only for the count.
        unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut nodes) }.result()?;
        // SAFETY: graph is a complete captured graph.
        let exec = unsafe { cu::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }?;
        // SAFETY: exec was instantiated above; upload makes the first replay as cheap as later.
        unsafe { cu::graph::upload(exec, self.stream) }?;
        self.counters.launches = launches_before;
        Ok(Graph { graph, exec, nodes })
    }

    /// Replay a graph on the stream.
    pub fn replay(&mut self, g: &Graph) -> Result<(), BackendError> {
        // SAFETY: exec is an instantiated graph of this context; the buffers it addresses live
        // in the arena for the backend's lifetime.
        unsafe { cu::graph::launch(g.exec, self.stream) }?;
        self.counters.graph_launches += 1;
        self.counters.graph_nodes += g.nodes as u64;
        Ok(())
    }

    /// Wait for everything on the stream (construction and teardown only).
    pub fn synchronize(&mut self) -> Result<(), BackendError> {
        // SAFETY: the stream is valid.
        unsafe { cu::stream::synchronize(self.stream) }?;
        Ok(())
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: all handles were created by this value with this context and are released
        // once; pending work finishes first.
        unsafe {
            let _ = cu::stream::synchronize(self.stream);
            for &m in &self.modules {
                let _ = cu::module::unload(m);
            }
            if self.arena.ptr != 0 {
                let _ = cu::memory_free(self.arena.ptr);
            }
            let _ = cu::stream::destroy(self.stream);
        }
    }
}
