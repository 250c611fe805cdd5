//! The agent's modules import each other in one direction only. Each
//! module sits on a floor; code (and doc links) on one floor may name only
//! modules on lower floors. A new module must be given a floor here, and
//! an import that runs back up fails this test, naming the file and line.
//! The pure leaves (`tessera-cgroup`, `tessera-control`, `tessera-gpu`)
//! are crates of their own under `agent/`, so cargo itself keeps them
//! below everything else.
//!
//! `cargo test -p tessera-agent --test layering -- --nocapture` prints
//! the floors and each module's imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom to top. Re-exported crates count as their module name.
const FLOORS: &[&[&str]] = &[
    // Leaves: errors, mounts, and the crates of their own.
    &["error_chain", "mountinfo", "cgroup", "control", "gpu"],
    // The kernel's view: eBPF loading, probing and reading.
    &["ebpf"],
    // The unit of management: region directories and their metadata.
    &["containers"],
    // The node policy over the containers' metadata.
    &["policy"],
    // What a period saw, and the loop's status: read by everything above.
    &["view"],
    // Users of the view and the containers, independent of each other.
    &["watchdog", "metrics", "telemetry", "kubelet"],
    // The DRA driver: the device plugin's answer, as CDI, for claims.
    &["dra"],
    // The daemon's settings, made of the settings of those below.
    &["config"],
    // `tessera-agent run`.
    &["daemon"],
    // The one-shot subcommands.
    &["commands"],
];

fn floor(module: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// Every `crate::NAME` in `text`, with its line number.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + "crate::".len()..];
            // `tessera_agent::crate::` does not exist; `$crate::` and
            // `some_crate::` are other paths.
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push((n + 1, name));
            }
        }
    }
    found
}

#[test]
fn modules_import_only_modules_on_lower_floors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut arrows: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut wrong = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(own) = floor(&module) else {
            wrong.push(format!(
                "agent/src/{}: module {module} has no floor in tests/layering.rs",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for (line, name) in crate_paths(&text) {
            if name == module {
                continue;
            }
            match floor(&name) {
                Some(f) if f < own => {
                    arrows.entry(module.clone()).or_default().insert(name);
                }
                Some(f) => wrong.push(format!(
                    "agent/src/{}:{line}: {module} (floor {own}) names crate::{name} (floor {f}): imports run downward only",
                    rel.display()
                )),
                // Items of lib.rs itself (none today) or a macro path.
                None => {}
            }
        }
    }
    for (n, f) in FLOORS.iter().enumerate() {
        let row: Vec<String> = f
            .iter()
            .map(|m| {
                let deps = arrows
                    .get(*m)
                    .map(|d| d.iter().map(String::as_str).collect::<Vec<_>>().join(", "));
                match deps {
                    Some(d) => format!("{m} -> {d}"),
                    None => (*m).to_owned(),
                }
            })
            .collect();
        println!("floor {n}: {}", row.join("; "));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_module_of_the_library_has_a_floor() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let mut missing = Vec::new();
    for line in lib.lines() {
        let line = line.trim();
        let name = if let Some(rest) = line.strip_prefix("pub mod ") {
            rest.trim_end_matches(';')
        } else if let Some(rest) = line.strip_prefix("pub use ") {
            match rest.split_once(" as ") {
                Some((_, name)) => name.trim_end_matches(';'),
                None => continue,
            }
        } else {
            continue;
        };
        if floor(name).is_none() {
            missing.push(name.to_owned());
        }
    }
    assert!(missing.is_empty(), "modules without a floor: {missing:?}");
}

#[test]
fn the_scan_finds_paths_and_ignores_other_crates() {
    let text = "use crate::view::View;\n// see [`crate::policy`]\nuse tessera_api::x; $crate::y; my_crate::z";
    assert_eq!(
        crate_paths(text),
        vec![(1, "view".to_owned()), (2, "policy".to_owned())]
    );
}
