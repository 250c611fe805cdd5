//! Versioned SONAME for the interposer.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libtessera.so");
}
