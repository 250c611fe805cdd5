//! Gives the shared library the SONAME of the library it stands in for, so
//! programs linked against it record `libnvidia-ml.so.1` as their dependency.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
