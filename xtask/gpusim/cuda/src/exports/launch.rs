//! Kernel launches, copies and memsets.

use std::ffi::{c_uint, c_void};

use gpusim::cost::LaunchShape;

use super::ptr::{out, read};
use super::{cu_alias, cu_export, h};
use crate::abi::*;
use crate::launch;
use crate::process;

fn shape(g: [c_uint; 3], b: [c_uint; 3]) -> LaunchShape {
    LaunchShape { grid: g, block: b }
}

cu_export! {
    fn cuLaunchKernel(
        f: Handle,
        gx: c_uint, gy: c_uint, gz: c_uint,
        bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint,
        s: Handle,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) {
        let _ = (params, extra);
        let p = process::get()?;
        launch::launch(p, h(f), shape([gx, gy, gz], [bx, by, bz]), shared, h(s))
    }

    fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = (params, extra);
        let p = process::get()?;
        // SAFETY: the caller's contract: `config` is NULL or points to a
        // readable `CUlaunchConfig`; `read` rejects NULL.
        let c = unsafe { read(config) }?;
        launch::launch(
            p,
            h(f),
            shape([c.grid_dim_x, c.grid_dim_y, c.grid_dim_z], [c.block_dim_x, c.block_dim_y, c.block_dim_z]),
            c.shared_mem_bytes,
            h(c.h_stream),
        )
    }

    fn cuLaunchCooperativeKernel(
        f: Handle,
        gx: c_uint, gy: c_uint, gz: c_uint,
        bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint,
        s: Handle,
        params: *mut *mut c_void,
    ) {
        let _ = params;
        let p = process::get()?;
        launch::launch(p, h(f), shape([gx, gy, gz], [bx, by, bz]), shared, h(s))
    }

    /// CUDA 2.x: the block shape set by `cuFuncSetBlockShape`.
    fn cuFuncSetBlockShape(f: Handle, x: i32, y: i32, z: i32) {
        let p = process::get()?;
        let dims = [x, y, z].map(|d| u32::try_from(d).unwrap_or(0));
        launch::set_block_shape(p, h(f), dims)
    }

    /// CUDA 2.x: a 1×1 grid of the function's block shape.
    fn cuLaunch(f: Handle) {
        let p = process::get()?;
        launch::legacy(p, h(f), 1, 1, 0)
    }

    /// CUDA 2.x: a `w`×`h` grid of the function's block shape.
    fn cuLaunchGrid(f: Handle, w: i32, hh: i32) {
        let p = process::get()?;
        launch::legacy(p, h(f), w, hh, 0)
    }

    /// CUDA 2.x: [`cuLaunchGrid`] on a stream.
    fn cuLaunchGridAsync(f: Handle, w: i32, hh: i32, s: Handle) {
        let p = process::get()?;
        launch::legacy(p, h(f), w, hh, h(s))
    }

    /// Simulator extension (not a CUDA entry point): the kernels this
    /// process has submitted to the GPU and their warps, whatever launched
    /// them (direct launches, graphs, legacy calls). Tests judge launch
    /// limits by it.
    fn gpusimExecutedWork(kernels: *mut u64, warps: *mut u64) {
        let (k, w) = launch::executed(process::get()?)?;
        // SAFETY: the caller's contract: `kernels` is NULL or points to a
        // writable `u64`; `out` rejects NULL.
        unsafe { out(kernels, k) }?;
        // SAFETY: the caller's contract: `warps` is NULL or points to a
        // writable `u64`; `out` rejects NULL.
        unsafe { out(warps, w) }
    }

    fn cuGraphLaunch(exec: Handle, s: Handle) {
        let p = process::get()?;
        launch::graph(p, h(exec), h(s))
    }

    fn cuGraphUpload(exec: Handle, s: Handle) {
        let p = process::get()?;
        let _ = h(s);
        crate::graph::exec_check(p, h(exec))
    }

    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) {
        let _ = (dst, src);
        launch::copy(process::get()?, bytes as u64, 0, true)
    }

    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, s: Handle) {
        let _ = (dst, src);
        launch::copy(process::get()?, bytes as u64, h(s), false)
    }

    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize) {
        let _ = (dst, src);
        launch::copy(process::get()?, bytes as u64, 0, true)
    }

    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize) {
        let _ = (dst, src);
        launch::copy(process::get()?, bytes as u64, 0, true)
    }

    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) {
        let _ = (dst, src);
        launch::copy(process::get()?, bytes as u64, 0, true)
    }

    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize, s: Handle) {
        let _ = (dst, src);
        launch::copy(process::get()?, bytes as u64, h(s), false)
    }

    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize, s: Handle) {
        let _ = (dst, src);
        launch::copy(process::get()?, bytes as u64, h(s), false)
    }

    fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, s: Handle) {
        let _ = (dst, src);
        launch::copy(process::get()?, bytes as u64, h(s), false)
    }

    fn cuMemcpyPeer(dst: CUdeviceptr, dst_ctx: Handle, src: CUdeviceptr, src_ctx: Handle, bytes: usize) {
        let _ = (dst, src, dst_ctx, src_ctx);
        launch::copy(process::get()?, bytes as u64, 0, true)
    }

    fn cuMemcpyPeerAsync(dst: CUdeviceptr, dst_ctx: Handle, src: CUdeviceptr, src_ctx: Handle, bytes: usize, s: Handle) {
        let _ = (dst, src, dst_ctx, src_ctx);
        launch::copy(process::get()?, bytes as u64, h(s), false)
    }

    fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) {
        let _ = (dst, value);
        launch::copy(process::get()?, n as u64, 0, true)
    }

    fn cuMemsetD16_v2(dst: CUdeviceptr, value: u16, n: usize) {
        let _ = (dst, value);
        launch::copy(process::get()?, 2 * n as u64, 0, true)
    }

    fn cuMemsetD32_v2(dst: CUdeviceptr, value: u32, n: usize) {
        let _ = (dst, value);
        launch::copy(process::get()?, 4 * n as u64, 0, true)
    }

    fn cuMemsetD8Async(dst: CUdeviceptr, value: u8, n: usize, s: Handle) {
        let _ = (dst, value);
        launch::copy(process::get()?, n as u64, h(s), false)
    }

    fn cuMemsetD16Async(dst: CUdeviceptr, value: u16, n: usize, s: Handle) {
        let _ = (dst, value);
        launch::copy(process::get()?, 2 * n as u64, h(s), false)
    }

    fn cuMemsetD32Async(dst: CUdeviceptr, value: u32, n: usize, s: Handle) {
        let _ = (dst, value);
        launch::copy(process::get()?, 4 * n as u64, h(s), false)
    }
}

cu_alias! {
    cuLaunchKernel_ptsz => cuLaunchKernel(
        f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, s: Handle, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchKernelEx_ptsz => cuLaunchKernelEx(config: *const CUlaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchCooperativeKernel_ptsz => cuLaunchCooperativeKernel(
        f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, s: Handle, params: *mut *mut c_void);
    cuGraphLaunch_ptsz => cuGraphLaunch(exec: Handle, s: Handle);
    cuGraphUpload_ptsz => cuGraphUpload(exec: Handle, s: Handle);
    cuMemcpy_ptds => cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize);
    cuMemcpyAsync_ptsz => cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, s: Handle);
    cuMemcpyHtoD_v2_ptds => cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize);
    cuMemcpyDtoH_v2_ptds => cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize);
    cuMemcpyDtoD_v2_ptds => cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize);
    cuMemcpyHtoDAsync_v2_ptsz => cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize, s: Handle);
    cuMemcpyDtoHAsync_v2_ptsz => cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize, s: Handle);
    cuMemcpyDtoDAsync_v2_ptsz => cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, s: Handle);
    cuMemcpyPeer_ptds => cuMemcpyPeer(dst: CUdeviceptr, dst_ctx: Handle, src: CUdeviceptr, src_ctx: Handle, bytes: usize);
    cuMemcpyPeerAsync_ptsz => cuMemcpyPeerAsync(dst: CUdeviceptr, dst_ctx: Handle, src: CUdeviceptr, src_ctx: Handle, bytes: usize, s: Handle);
    cuMemsetD8_v2_ptds => cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize);
    cuMemsetD16_v2_ptds => cuMemsetD16_v2(dst: CUdeviceptr, value: u16, n: usize);
    cuMemsetD32_v2_ptds => cuMemsetD32_v2(dst: CUdeviceptr, value: u32, n: usize);
    cuMemsetD8Async_ptsz => cuMemsetD8Async(dst: CUdeviceptr, value: u8, n: usize, s: Handle);
    cuMemsetD16Async_ptsz => cuMemsetD16Async(dst: CUdeviceptr, value: u16, n: usize, s: Handle);
    cuMemsetD32Async_ptsz => cuMemsetD32Async(dst: CUdeviceptr, value: u32, n: usize, s: Handle);
}
