//! Gives the shared library the SONAME of the library it stands in for, so
//! programs linked against it record `libcuda.so.1` as their dependency,
//! and binds its calls to its own functions at link time
//! (`-Bsymbolic-functions`), as the real driver's internal calls are: an
//! entry point that forwards to another (`cuGraphInstantiate` to
//! `cuGraphInstantiate_v2`, say) or an address `cuGetProcAddress` hands
//! out is the driver's own, never an interposer's export of that name.
//! It is never unloaded (`-z nodelete`): it registers fork handlers and
//! runs a callback thread, and NVIDIA's runtime closes the driver when its
//! start fails.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
