use super::*;

const PROC_DEVICES: &str = "\
Character devices:
  1 mem
195 nvidia-frontend
234 nvidia-uvm
235 nvidia-caps
510 nvidia-caps-imex-channels

Block devices:
  8 sd
236 nvidia-uvm-fake-block
";

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn discovers_gpus_uvm_and_caps() {
    let proc = tempfile::tempdir().unwrap();
    let root = proc.path();
    write(root, "devices", PROC_DEVICES);
    write(
        root,
        "driver/nvidia/gpus/0000:3b:00.0/information",
        "Model: \t\t NVIDIA A100\nIRQ:   \t\t 42\nGPU UUID: \t GPU-1234\nDevice Minor: \t 1\n",
    );
    write(
        root,
        "driver/nvidia/gpus/0000:af:00.0/information",
        "Model: \t\t NVIDIA A100\nDevice Minor: \t 0\n",
    );
    write(
        root,
        "driver/nvidia-caps/mig-minors",
        "gpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n",
    );
    write(
        root,
        "driver/nvidia-caps/sys-minors",
        "config 1\nmonitor 2\n",
    );

    let got: Vec<(u32, u32, u32)> = discover(root)
        .unwrap()
        .iter()
        .map(|d| (d.major, d.minor, d.class))
        .collect();
    assert_eq!(
        got,
        vec![
            (195, 0, class::GPU),
            (195, 1, class::GPU),
            (195, 254, class::MODESET),
            (195, 255, class::CONTROL),
            (234, 0, class::UVM),
            (234, 1, class::UVM_TOOLS),
            (235, 1, class::CAPS),
            (235, 2, class::CAPS),
            (235, 12, class::CAPS),
            (235, 13, class::CAPS),
        ]
    );
}

#[test]
fn node_without_driver_still_watches_fixed_numbers() {
    let proc = tempfile::tempdir().unwrap();
    write(proc.path(), "devices", "Character devices:\n  1 mem\n");
    let got: Vec<String> = discover(proc.path())
        .unwrap()
        .iter()
        .map(|d| d.to_string())
        .collect();
    assert_eq!(got, ["nvidia-modeset (195:254)", "nvidiactl (195:255)"]);
}

#[test]
fn decoding_follows_the_device_class() {
    let uvm = Device::new(234, 0, class::UVM, "nvidia-uvm");
    assert_eq!(uvm.watched().decode, decode::RAW);
    let ctl = Device::new(195, 255, class::CONTROL, "nvidiactl");
    assert_eq!(ctl.watched().decode, decode::NV_FRONTEND);
    assert_eq!(ctl.kdev(), (195 << 20) | 255);
    let caps = Device::new(235, 1, class::CAPS, "nvidia-cap1");
    assert_eq!(caps.watched().decode, decode::IOC_NR);
}

#[test]
fn parses_specs() {
    let spec = |s: &str| s.parse::<DeviceSpec>().unwrap();
    assert_eq!(
        spec("1:3"),
        DeviceSpec {
            class: class::STAND_IN,
            target: DeviceTarget::Number(1, 3)
        }
    );
    assert_eq!(spec(" /dev/zero"), DeviceSpec::path("/dev/zero"));
    assert_eq!(
        spec("uvm=/dev/zero"),
        DeviceSpec {
            class: class::UVM,
            target: DeviceTarget::Path("/dev/zero".into())
        }
    );
    assert_eq!(spec("control = 1:5").class, class::CONTROL);
    let err = "null".parse::<DeviceSpec>().unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"device spec "null" is not [class=]path or [class=]major:minor"#
    );
    assert!("1:x".parse::<DeviceSpec>().is_err());
    assert!("tpu=1:3".parse::<DeviceSpec>().is_err());
}

#[test]
fn resolves_device_paths() {
    let dev = DeviceSpec::path("/dev/zero").resolve().unwrap();
    assert_eq!((dev.major, dev.minor, dev.class), (1, 5, class::STAND_IN));
    let uvm = "uvm=/dev/null"
        .parse::<DeviceSpec>()
        .unwrap()
        .resolve()
        .unwrap();
    assert_eq!((uvm.major, uvm.minor), (1, 3));
    assert_eq!(uvm.watched().decode, decode::RAW);
    let err = DeviceSpec::path("/").resolve().unwrap_err();
    assert_eq!(err.to_string(), "/ is not a character device");
}

#[test]
fn splits_user_dev_numbers() {
    // glibc's encoding: major bits 8..20 and 44..64, minor bits 0..8 and 20..44.
    let makedev = libc::makedev;
    assert_eq!(split_user_dev(makedev(1, 3)), (1, 3));
    assert_eq!(split_user_dev(0x103), (1, 3));
    assert_eq!(split_user_dev(makedev(511, 0x12345)), (511, 0x12345));
    assert_eq!(split_user_dev(makedev(4100, 7)), (4100, 7));
}

#[test]
fn finds_character_majors() {
    assert_eq!(char_major(PROC_DEVICES, "nvidia-uvm"), Some(234));
    assert_eq!(char_major(PROC_DEVICES, "nvidia-caps"), Some(235));
    assert_eq!(char_major(PROC_DEVICES, "nvidia-uvm-fake-block"), None);
    assert_eq!(char_major(PROC_DEVICES, "sd"), None);
}
