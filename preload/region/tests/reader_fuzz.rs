//! Property tests: the agent's reader takes arbitrary bytes without
//! panicking, and whatever it accepts is self-consistent.
#![allow(clippy::unwrap_used)] // helpers of a test crate

use proptest::prelude::*;
use tessera_region::layout::{MAX_GPUS, USAGE_SIZE};
use tessera_region::reader::{MAX_SLOT_BYTES, read_usage};

fn valid_region() -> Vec<u8> {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(make_valid_region).clone()
}

fn make_valid_region() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    tessera_region::file::create_usage(dir.path()).unwrap();
    let u = tessera_region::file::open_usage(&dir.path().join("usage")).unwrap();
    let s = u.claim(42, 7).unwrap().slot;
    u.reserve(0, s, 1 << 20, u64::MAX).unwrap();
    u.count_launch(0, s);
    std::fs::read(dir.path().join("usage")).unwrap()
}

fn check(bytes: &[u8]) {
    if let Ok(snap) = read_usage(bytes) {
        for g in 0..MAX_GPUS {
            let sum: u64 = snap.slots.iter().map(|s| s.used[g]).sum();
            assert!(sum <= snap.used[g]);
            for s in &snap.slots {
                assert!(s.used[g] <= MAX_SLOT_BYTES);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..(USAGE_SIZE + 64))) {
        check(&bytes);
    }

    #[test]
    fn corrupted_valid_regions_never_panic(
        edits in proptest::collection::vec((0..USAGE_SIZE, any::<u8>()), 1..64),
        truncate in proptest::option::of(0..USAGE_SIZE),
    ) {
        let mut bytes = valid_region();
        for (at, v) in edits {
            bytes[at] = v;
        }
        if let Some(n) = truncate {
            bytes.truncate(n);
        }
        check(&bytes);
    }
}

#[test]
fn a_valid_region_reads_back() {
    let snap = read_usage(&valid_region()).unwrap();
    assert_eq!(snap.used[0], 1 << 20);
    assert_eq!(snap.slots.len(), 1);
    assert_eq!(snap.slots[0].pid, 42);
    assert_eq!(snap.slots[0].launches[0], 1);
    assert!(snap.anomalies.is_empty());
}

#[test]
fn out_of_range_fields_are_named() {
    let mut b = valid_region();
    // used[0][slot 42] := 2^60
    let off = tessera_region::layout::usage_offsets::USED + 42 * 8;
    b[off..off + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let e = read_usage(&b).unwrap_err().to_string();
    assert!(e.contains("used[0][42]"), "{e}");
    let mut b = valid_region();
    let off = tessera_region::layout::usage_offsets::OWNERS + 5 * 8;
    b[off..off + 8].copy_from_slice(&(9u64 << 32 | 1).to_le_bytes());
    let e = read_usage(&b).unwrap_err().to_string();
    assert!(e.contains("owners[5]"), "{e}");
    assert!(
        read_usage(&b[..100])
            .unwrap_err()
            .to_string()
            .contains("size")
    );
}
