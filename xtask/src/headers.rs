//! NVIDIA's C headers (`cuda.h`, `nvml.h`) for the ABI check of
//! `tessera-cuda-abi` (`preload/cuda-abi/tests/headers.rs`).
//!
//! They come from NVIDIA's own PyPI wheels, pinned, and are unpacked into
//! [`include_dir`]. Installing is idempotent: present headers are kept.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::sh::{self, workspace_root};

/// The wheels and the folder inside each that holds the headers.
const WHEELS: [(&str, &str); 2] = [
    (
        "nvidia-cuda-runtime-cu12==12.9.79",
        "nvidia/cuda_runtime/include/",
    ),
    ("nvidia-nvml-dev-cu12==12.9.79", "nvidia/nvml_dev/include/"),
];

/// Headers the check needs.
const NEEDED: [&str; 2] = ["cuda.h", "nvml.h"];

/// Where the headers live: `target/tools/nvidia-headers/include`.
pub fn include_dir() -> PathBuf {
    workspace_root().join("target/tools/nvidia-headers/include")
}

/// Downloads and unpacks the headers unless they are there.
pub fn install() -> Result<()> {
    let dir = include_dir();
    if NEEDED.iter().all(|h| dir.join(h).is_file()) {
        eprintln!("ok: nvidia headers in {}", dir.display());
        return Ok(());
    }
    let Some(python) = sh::on_path("python3") else {
        bail!("python3 is needed to fetch NVIDIA's headers (pip) and is not on PATH");
    };
    let parent = dir.parent().context("the include folder has a parent")?;
    let download = parent.join("download");
    let staging = parent.join("include.new");
    for d in [&download, &staging] {
        if d.exists() {
            fs::remove_dir_all(d).with_context(|| format!("cannot remove {}", d.display()))?;
        }
        fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    let mut pip = Command::new(&python);
    pip.args([
        "-m",
        "pip",
        "download",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "-d",
    ])
    .arg(&download)
    .args(WHEELS.map(|(req, _)| req));
    sh::run(&mut pip).context("cannot download NVIDIA's header wheels (pip)")?;
    // A wheel is a zip file; unpack each one's include folder, flat.
    let script = r#"
import sys, zipfile, pathlib
out = pathlib.Path(sys.argv[1])
for wheel, prefix in zip(sys.argv[2::2], sys.argv[3::2]):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith(prefix) and not name.endswith("/"):
                target = out / name[len(prefix):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(name))
"#;
    let mut unpack = Command::new(&python);
    unpack.args(["-c", script]).arg(&staging);
    for (req, prefix) in WHEELS {
        let name = req.split("==").next().unwrap_or(req).replace('-', "_");
        let wheel = fs::read_dir(&download)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&name) && n.ends_with(".whl"))
            })
            .with_context(|| format!("pip downloaded no wheel for {req}"))?;
        unpack.arg(wheel).arg(prefix);
    }
    sh::run(&mut unpack).context("cannot unpack NVIDIA's header wheels")?;
    for h in NEEDED {
        if !staging.join(h).is_file() {
            bail!("the wheels held no {h} (looked in {})", staging.display());
        }
    }
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    fs::rename(&staging, &dir)
        .with_context(|| format!("cannot move the headers into {}", dir.display()))?;
    let _ = fs::remove_dir_all(&download);
    eprintln!("installed: nvidia headers into {}", dir.display());
    Ok(())
}
