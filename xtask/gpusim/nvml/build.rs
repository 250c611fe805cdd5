//! Gives the shared library the SONAME of the library it stands in for, so
//! programs linked against it record `libnvidia-ml.so.1` as their
//! dependency, and binds its calls to its own functions at link time
//! (`-Bsymbolic-functions`), as NVIDIA's library does: an entry point that
//! forwards to another (`nvmlDeviceGetCount` to `nvmlDeviceGetCount_v2`)
//! or an address it hands out is its own, never an interposer's export of
//! that name.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
}
