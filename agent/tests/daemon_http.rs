//! `tessera-agent run` as a process: /healthz and /readyz over real TCP,
//! a clean exit on SIGTERM and SIGINT, bad configuration refused with the
//! file and field named, and hostile entries under the root skipped
//! without stopping the loop.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use daemon_support::{Agent, Node, agent_bin, container_ok, get, nvml_lib, uuid, wait_for};

#[test]
fn ready_on_the_simulator_and_sigterm_exits_cleanly() {
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let mut agent = Agent::start(&node, &root, &["--period-ms", "100"]);
    agent.wait_ready();
    let (code, body) = agent.get("/healthz");
    assert_eq!(code, 200, "{body}");
    let (code, body) = agent.get("/readyz");
    assert_eq!((code, body.trim()), (200, "ready"));
    assert_eq!(agent.get("/nothing").0, 404);
    // The loop runs at its period: periods advance.
    let p0 = agent.view()["period"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let p1 = agent.view()["period"].as_u64().unwrap();
    assert!(p1 >= p0 + 2, "periods {p0} -> {p1} in 600 ms at 100 ms");
    assert!(root.is_dir(), "the root is created");
    let status = agent.signal_and_wait(libc::SIGTERM);
    assert_eq!(status.code(), Some(0), "{status:?}; log {:?}", agent.log());
    wait_for(Duration::from_secs(2), || {
        agent
            .log()
            .iter()
            .any(|l| l.contains("stopped"))
            .then_some(())
    })
    .unwrap_or_else(|| panic!("no 'stopped' line: {:?}", agent.log()));
    assert!(
        get(agent.addr, "/healthz").is_err(),
        "the listener is closed"
    );
}

#[test]
fn sigint_exits_cleanly_too() {
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let mut agent = Agent::start(&node, &root, &[]);
    agent.wait_ready();
    let status = agent.signal_and_wait(libc::SIGINT);
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_eq!(status.signal(), None);
}

#[test]
fn readyz_names_what_is_missing_without_nvml() {
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let mut c = node.command(&agent_bin());
    c.env_remove("TESSERA_NVML_LIB")
        .args(["--nvml-lib", "/nonexistent/libnvidia-ml.so.1", "run"])
        .args(["--listen", "127.0.0.1:0", "--root"])
        .arg(&root);
    let agent = Agent::spawn(c);
    // Alive (the loop runs) but not ready, and it says why.
    wait_for(Duration::from_secs(10), || {
        (agent.view()["period"].as_u64()? >= 2).then_some(())
    })
    .unwrap();
    assert_eq!(agent.get("/healthz").0, 200);
    let (code, body) = agent.get("/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("NVML is not initialised") && body.contains("/nonexistent"),
        "{body}"
    );
}

/// Runs `tessera-agent run` expecting it to refuse; returns stderr.
fn refused(node: &Node, args: &[&str], config: Option<&str>) -> String {
    let mut c = node.command(&agent_bin());
    c.arg("--nvml-lib").arg(nvml_lib()).arg("run").args(args);
    if let Some(text) = config {
        let path = node.dir.path().join("agent.toml");
        std::fs::write(&path, text).unwrap();
        c.arg("--config").arg(&path);
    }
    let out = c
        .env_remove("TESSERA_AGENT_CONFIG")
        .env_remove("TESSERA_PERIOD_MS")
        .output()
        .unwrap();
    assert!(!out.status.success(), "accepted {args:?} {config:?}");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn bad_config_is_refused_naming_file_field_and_accepted_values() {
    let node = Node::small();
    let file = node.dir.path().join("agent.toml");
    let file = file.display().to_string();
    let e = refused(&node, &[], Some("period_ms = 1\n"));
    assert!(e.contains(&file) && e.contains("period_ms"), "{e}");
    assert!(e.contains("10 to 10000"), "{e}");
    let e = refused(&node, &[], Some("root = \"/tmp/x\"\nperiod = 100\n"));
    assert!(
        e.contains(&file) && e.contains("unknown field") && e.contains("period"),
        "{e}"
    );
    assert!(e.contains("line 2"), "{e}");
    let e = refused(&node, &[], Some("listen = 9400\n"));
    assert!(e.contains(&file) && e.contains("listen"), "{e}");
    let e = refused(&node, &[], Some("listen = \"localhost\"\n"));
    assert!(e.contains("field listen") && e.contains("IP:PORT"), "{e}");
    let e = refused(&node, &[], Some("not toml at all [\n"));
    assert!(e.contains(&file), "{e}");
    let e = refused(&node, &["--period-ms", "0"], None);
    assert!(
        e.contains("command line/environment") && e.contains("period_ms"),
        "{e}"
    );
    let e = refused(&node, &[], Some("log = \"[[[\"\n"));
    assert!(e.contains("field log"), "{e}");
    let missing = node.dir.path().join("missing.toml");
    let out = node
        .command(&agent_bin())
        .args(["run", "--config"])
        .arg(&missing)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains("missing.toml"), "{e}");
}

#[test]
fn flags_and_environment_override_the_file() {
    let node = Node::small();
    let root = node.dir.path().join("from-env");
    let path = node.dir.path().join("agent.toml");
    std::fs::write(&path, "period_ms = 5000\nroot = \"/nonexistent/root\"\n").unwrap();
    let mut c = node.command(&agent_bin());
    c.env_remove("TESSERA_NVML_LIB")
        .arg("--nvml-lib")
        .arg(nvml_lib())
        .env("TESSERA_ROOT", &root)
        .args([
            "run",
            "--listen",
            "127.0.0.1:0",
            "--period-ms",
            "50",
            "--config",
        ])
        .arg(&path);
    let agent = Agent::spawn(c);
    agent.wait_ready();
    assert_eq!(agent.view()["root"], root.display().to_string());
    let p0 = agent.view()["period"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let p1 = agent.view()["period"].as_u64().unwrap();
    assert!(
        p1 >= p0 + 4,
        "the flag's 50 ms period, not the file's 5 s: {p0} -> {p1}"
    );
}

#[test]
fn malformed_and_foreign_entries_are_skipped_and_reported() {
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let gpu = uuid(&node, 0);
    container_ok(
        &root,
        &["add", "--id", "good", "--gpu", &format!("{gpu},memory=512")],
    );
    container_ok(&root, &["add", "--id", "badcontrol", "--gpu", &gpu]);
    std::fs::write(root.join("badcontrol/control"), b"not a control region").unwrap();
    std::fs::create_dir(root.join("nometa")).unwrap();
    std::fs::create_dir(root.join("badjson")).unwrap();
    std::fs::write(
        root.join("badjson/meta.json"),
        b"{\"version\": 1, \"sm_target\": ",
    )
    .unwrap();
    std::fs::create_dir(root.join("outofrange")).unwrap();
    std::fs::write(
        root.join("outofrange/meta.json"),
        format!(r#"{{"version":1,"sm_target":500,"gpus":[{{"uuid":"{gpu}"}}]}}"#),
    )
    .unwrap();
    std::fs::create_dir(root.join("fifo")).unwrap();
    let fifo = std::ffi::CString::new(root.join("fifo/meta.json").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    std::fs::create_dir(root.join("huge")).unwrap();
    std::fs::write(root.join("huge/meta.json"), vec![b' '; 1 << 20]).unwrap();
    std::fs::write(root.join("plainfile"), b"x").unwrap();
    std::os::unix::fs::symlink(root.join("good"), root.join("link")).unwrap();
    std::fs::create_dir(root.join("bad name")).unwrap();
    std::fs::create_dir(root.join("-dash")).unwrap();

    let agent = Agent::start(&node, &root, &[]);
    agent.wait_ready();
    let view = agent.wait_view("the good container managed", |v| {
        Agent::container(v, "good").is_some()
    });
    let good = Agent::container(&view, "good").unwrap();
    assert_eq!(good["gpus"][0]["memory_limit_bytes"], 512u64 << 20);
    let skipped: Vec<(String, String)> = view["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let reason = |name: &str| {
        skipped
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, r)| r.clone())
            .unwrap_or_else(|| panic!("{name} not skipped: {skipped:#?}"))
    };
    assert!(reason("badcontrol").contains("control"), "{skipped:#?}");
    assert!(reason("nometa").contains("meta.json"), "{skipped:#?}");
    assert!(reason("badjson").contains("meta.json"), "{skipped:#?}");
    assert!(reason("outofrange").contains("sm_target"), "{skipped:#?}");
    assert!(
        reason("fifo").contains("not a regular file"),
        "{skipped:#?}"
    );
    assert!(reason("huge").contains("bytes"), "{skipped:#?}");
    assert!(
        reason("plainfile").contains("not a directory"),
        "{skipped:#?}"
    );
    assert!(reason("link").contains("symbolic link"), "{skipped:#?}");
    assert!(reason("bad name").contains("character"), "{skipped:#?}");
    assert!(reason("-dash").contains("does not start"), "{skipped:#?}");
    assert_eq!(view["containers"].as_array().unwrap().len(), 1);
    // Logged once each, and the loop goes on.
    let p0 = view["period"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(agent.view()["period"].as_u64().unwrap() > p0 + 1);
    assert_eq!(agent.get("/healthz").0, 200);
    let warned = agent.wait_log("the skip of badjson", |l| {
        l.contains("skipping") && l.contains("badjson")
    });
    assert_eq!(warned, 1, "{:?}", agent.log());
    // The agent never wrote through the planted entries.
    assert_eq!(std::fs::read(root.join("plainfile")).unwrap(), b"x");
    assert_eq!(
        std::fs::read(root.join("badcontrol/control")).unwrap(),
        b"not a control region"
    );
}
