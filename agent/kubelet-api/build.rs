//! Generates the tonic/prost code for the kubelet APIs. The `.proto` files
//! are compiled by `protox` (pure Rust), so no `protoc` is needed.

use std::path::PathBuf;

const PROTOS: [&str; 4] = [
    "deviceplugin_v1beta1.proto",
    "podresources_v1.proto",
    "dra_v1.proto",
    "pluginregistration_v1.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    for p in PROTOS {
        println!("cargo:rerun-if-changed={}", dir.join(p).display());
    }
    let fds = protox::compile(PROTOS, [&dir])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
