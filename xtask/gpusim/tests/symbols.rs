//! The simulated driver and NVML bind their own symbols, as NVIDIA's
//! libraries do: no dynamic relocation of either library refers to a
//! symbol it defines, so an interposer's export of the same name
//! (`LD_PRELOAD`) is reached only by calls from outside the library,
//! never by the library's calls to itself or by the addresses it hands out
//! (`cuGetProcAddress`, forwarding entry points). Judged by binutils'
//! `readelf` on the built libraries.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn readelf(lib: &Path, args: &[&str]) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(lib)
        .output()
        .unwrap_or_else(|e| panic!("cannot run readelf on {}: {e}", lib.display()));
    assert!(out.status.success(), "readelf {args:?} {}", lib.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Names the library defines in its dynamic symbol table.
fn defined(lib: &Path) -> BTreeSet<String> {
    readelf(lib, &["--dyn-syms", "-W"])
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Num: Value Size Type Bind Vis Ndx Name
            (f.len() >= 8 && f[0].ends_with(':') && f[6] != "UND")
                .then(|| f[7].split('@').next().unwrap_or_default().to_owned())
        })
        .collect()
}

/// Names its dynamic relocations refer to.
fn relocated(lib: &Path) -> BTreeSet<String> {
    readelf(lib, &["-r", "-W"])
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Offset Info Type Value Name + Addend
            (f.len() >= 5 && f[2].starts_with("R_"))
                .then(|| f[4].split('@').next().unwrap_or_default().to_owned())
        })
        .collect()
}

#[test]
fn neither_library_relocates_against_its_own_exports() {
    for rel in ["sim/libcuda.so.1", "sim/libnvidia-ml.so.1"] {
        let lib = tessera_testkit::sim::artifact(rel);
        let own = defined(&lib);
        let api = own
            .iter()
            .filter(|n| n.starts_with("cu") || n.starts_with("nvml"))
            .count();
        assert!(api > 50, "{} exports {api} API functions", lib.display());
        let bound: Vec<String> = relocated(&lib).intersection(&own).cloned().collect();
        assert!(
            bound.is_empty(),
            "{} resolves its own symbols at load time, where an interposer can take them: {bound:?}",
            lib.display()
        );
    }
}
