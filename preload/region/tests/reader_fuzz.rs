//! Property tests of the agent's reader of untrusted usage bytes.
//!
//! Random bytes alone almost never get past the magic check, so the main
//! property starts from *valid* regions (generated slot by slot through
//! the documented layout) and mutates them: single bytes, whole fields set
//! to values at and past the ABI's bounds, truncation. Whatever comes out,
//! the reader must not panic; it must accept exactly the regions whose
//! every field is in range (judged by this file's own decoding of the
//! layout), name the first field out of range when it refuses, and report
//! only in-range values when it accepts.
#![allow(clippy::unwrap_used)] // helpers of a test crate

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tessera_region::layout::{MAX_GPUS, MAX_SLOTS, USAGE_SIZE, owner, start, usage_offsets};
use tessera_region::reader::{MAX_SLOT_BYTES, PID_MAX, SlotState, UsageSnapshot, read_usage};

fn valid_region() -> Vec<u8> {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(make_valid_region).clone()
}

/// A region as the library writes it: one process holding 1 MiB.
fn make_valid_region() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    tessera_region::file::create_usage(dir.path()).unwrap();
    let u = tessera_region::file::open_usage(&dir.path().join("usage")).unwrap();
    let s = u.claim(42, 7).unwrap().slot;
    u.reserve(0, s, 1 << 20, u64::MAX).unwrap();
    u.count_launch(0, s);
    std::fs::read(dir.path().join("usage")).unwrap()
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

/// Stores `v` at `off` if the (maybe truncated) bytes reach that far.
fn put(b: &mut [u8], off: usize, v: u64) {
    if let Some(to) = b.get_mut(off..off + 8) {
        to.copy_from_slice(&v.to_le_bytes());
    }
}

fn owner_at(i: usize) -> usize {
    usage_offsets::OWNERS + i * 8
}
fn start_at(i: usize) -> usize {
    usage_offsets::START_TIMES + i * 8
}
fn used_at(g: usize, i: usize) -> usize {
    usage_offsets::USED + (g * MAX_SLOTS + i) * 8
}
fn launches_at(g: usize, i: usize) -> usize {
    usage_offsets::LAUNCHES + (g * MAX_SLOTS + i) * 8
}

/// One slot of a generated region.
#[derive(Clone, Debug)]
struct Slot {
    index: usize,
    state: u64,
    pid: u32,
    generation: u64,
    start: u64,
    used: Vec<(usize, u64)>,
    launches: Vec<(usize, u64)>,
}

fn slot() -> impl Strategy<Value = Slot> {
    (
        0..MAX_SLOTS,
        0u64..4,
        1..=PID_MAX,
        0u64..(1 << owner::GENERATION_BITS),
        any::<u64>(),
        proptest::collection::vec((0..MAX_GPUS, 0..=MAX_SLOT_BYTES), 0..4),
        proptest::collection::vec((0..MAX_GPUS, any::<u64>()), 0..4),
    )
        .prop_map(
            |(index, state, pid, generation, start, used, launches)| Slot {
                index,
                state,
                // A free slot names no pid.
                pid: if state == owner::FREE { 0 } else { pid },
                generation,
                start,
                used,
                launches,
            },
        )
}

/// A valid region: a fresh header, then generated slots and bucket counters.
fn region() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(slot(), 0..24),
        proptest::collection::vec((0..MAX_GPUS, 0..8usize, any::<u64>()), 0..8),
    )
        .prop_map(|(slots, buckets)| {
            let mut b = valid_region();
            for s in slots {
                let w = owner::with_generation(s.state, s.pid, s.generation);
                put(&mut b, owner_at(s.index), w);
                put(&mut b, start_at(s.index), s.start);
                for (g, v) in s.used {
                    put(&mut b, used_at(g, s.index), v);
                }
                for (g, v) in s.launches {
                    put(&mut b, launches_at(g, s.index), v);
                }
            }
            for (g, field, v) in buckets {
                put(&mut b, usage_offsets::BUCKETS + g * 64 + field * 8, v);
            }
            b
        })
}

/// Values at and past the bounds the reader enforces.
fn edge_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        Just(MAX_SLOT_BYTES),
        Just(MAX_SLOT_BYTES + 1),
        Just(u64::from(PID_MAX)),
        Just(u64::from(PID_MAX) + 1),
        Just(u64::MAX),
        (0u64..256, 0..=PID_MAX + 2).prop_map(|(state, pid)| state << 32 | u64::from(pid)),
        any::<u64>(),
    ]
}

#[derive(Clone, Debug)]
enum Mutation {
    Byte(usize, u8),
    Owner(usize, u64),
    Used(usize, usize, u64),
    Header(usize, u64),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (0..USAGE_SIZE, any::<u8>()).prop_map(|(at, v)| Mutation::Byte(at, v)),
        3 => (0..MAX_SLOTS, edge_value()).prop_map(|(i, v)| Mutation::Owner(i, v)),
        3 => (0..MAX_GPUS, 0..MAX_SLOTS, edge_value()).prop_map(|(g, i, v)| Mutation::Used(g, i, v)),
        1 => (0..3usize, edge_value()).prop_map(|(at, v)| Mutation::Header(at * 8, v)),
        1 => (0..USAGE_SIZE).prop_map(Mutation::Truncate),
    ]
}

fn apply(b: &mut Vec<u8>, m: &Mutation) {
    match *m {
        Mutation::Byte(at, v) => {
            if let Some(x) = b.get_mut(at) {
                *x = v;
            }
        }
        Mutation::Owner(i, v) => put(b, owner_at(i), v),
        Mutation::Used(g, i, v) => put(b, used_at(g, i), v),
        // magic, abi_version + size, slot_count + reserved
        Mutation::Header(at, v) => put(b, at, v),
        Mutation::Truncate(n) => b.truncate(n),
    }
}

/// The first field out of range, by this file's reading of the layout
/// (`None`: every field is in range).
fn first_bad_field(b: &[u8]) -> Option<String> {
    if b.len() < USAGE_SIZE {
        return Some("size".into());
    }
    if b[..8] != tessera_region::layout::USAGE_MAGIC {
        return Some("magic".into());
    }
    let word32 = |off: usize| u32::from_le_bytes(b[off..off + 4].try_into().unwrap());
    if word32(8) != tessera_region::ABI_VERSION {
        return Some("abi_version".into());
    }
    if word32(12) as usize != USAGE_SIZE {
        return Some("size".into());
    }
    if word32(16) as usize != MAX_SLOTS {
        return Some("slot_count".into());
    }
    for i in 0..MAX_SLOTS {
        let w = u64_at(b, owner_at(i));
        if owner::state(w) > owner::RECLAIMING || owner::pid(w) > PID_MAX {
            return Some(format!("owners[{i}]"));
        }
        for g in 0..MAX_GPUS {
            if u64_at(b, used_at(g, i)) > MAX_SLOT_BYTES {
                return Some(format!("used[{g}][{i}]"));
            }
        }
    }
    None
}

/// Everything an accepted snapshot reports is in range and what the bytes say.
fn check_accepted(b: &[u8], snap: &UsageSnapshot) {
    let mut listed = snap.slots.iter().map(|s| s.index).peekable();
    let mut free_with_bytes = 0;
    for i in 0..MAX_SLOTS {
        let w = u64_at(b, owner_at(i));
        let state = owner::state(w);
        if state == owner::FREE {
            assert_ne!(listed.peek(), Some(&i), "free slot {i} listed");
            if (0..MAX_GPUS).any(|g| u64_at(b, used_at(g, i)) != 0) {
                free_with_bytes += 1;
            }
        } else {
            assert_eq!(listed.next(), Some(i), "slot {i} in use but not listed");
        }
    }
    assert_eq!(listed.next(), None, "slots listed twice or out of order");
    for s in &snap.slots {
        let w = u64_at(b, owner_at(s.index));
        let want = match owner::state(w) {
            owner::CLAIMING => SlotState::Claiming,
            owner::ACTIVE => SlotState::Active,
            _ => SlotState::Reclaiming,
        };
        assert_eq!(s.state, want);
        assert_eq!(s.pid, owner::pid(w));
        assert!(s.pid <= PID_MAX, "pid {} out of range", s.pid);
        let word = u64_at(b, start_at(s.index));
        assert_eq!(s.start_time, start::ticks(word));
        assert_eq!(s.ns_tag, start::tag(word));
        for g in 0..MAX_GPUS {
            assert!(
                s.used[g] <= MAX_SLOT_BYTES,
                "used {} out of range",
                s.used[g]
            );
            assert_eq!(s.used[g], u64_at(b, used_at(g, s.index)));
            assert_eq!(s.launches[g], u64_at(b, launches_at(g, s.index)));
        }
    }
    for g in 0..MAX_GPUS {
        let total: u64 = (0..MAX_SLOTS).map(|i| u64_at(b, used_at(g, i))).sum();
        assert_eq!(snap.used[g], total, "gpu {g} total");
        assert!(snap.used[g] <= MAX_SLOTS as u64 * MAX_SLOT_BYTES);
        let off = usage_offsets::BUCKETS + g * 64;
        assert_eq!(snap.buckets[g].launches, u64_at(b, off + 16));
        assert_eq!(snap.buckets[g].warps, u64_at(b, off + 24));
        assert_eq!(snap.buckets[g].throttled_ns, u64_at(b, off + 32));
    }
    let held = snap
        .anomalies
        .iter()
        .filter(|a| a.ends_with("still holds bytes"))
        .count();
    assert_eq!(held, free_with_bytes, "{:?}", snap.anomalies);
}

#[test]
fn mutated_valid_regions_are_judged_field_by_field() {
    let mut runner = TestRunner::new(Config {
        cases: 1000,
        failure_persistence: None,
        ..Config::default()
    });
    let outcomes = std::cell::RefCell::new(std::collections::BTreeMap::<String, usize>::new());
    let case = (region(), proptest::collection::vec(mutation(), 0..4));
    runner
        .run(&case, |(mut bytes, mutations)| {
            for m in &mutations {
                apply(&mut bytes, m);
            }
            let expected = first_bad_field(&bytes);
            let outcome = match read_usage(&bytes) {
                Ok(snap) => {
                    prop_assert_eq!(&expected, &None, "accepted a region with a bad field");
                    check_accepted(&bytes, &snap);
                    "accepted".to_string()
                }
                Err(e) => {
                    let e = e.to_string();
                    let field = expected.unwrap_or_else(|| panic!("refused a valid region: {e}"));
                    prop_assert!(
                        e.starts_with(&format!("usage region: {field} ")),
                        "expected {} named, got {}",
                        field,
                        e
                    );
                    field.split('[').next().unwrap_or_default().to_string()
                }
            };
            *outcomes.borrow_mut().entry(outcome).or_default() += 1;
            Ok(())
        })
        .unwrap();
    // The cases reached every check, not only the header's.
    let outcomes = outcomes.into_inner();
    println!("{outcomes:?}");
    for kind in ["accepted", "owners", "used", "magic", "size"] {
        let n = outcomes.get(kind).copied().unwrap_or(0);
        assert!(
            n >= 20,
            "only {n} of 1000 cases ended as {kind}: {outcomes:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..(USAGE_SIZE + 64))) {
        let _ = read_usage(&bytes);
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
    put(&mut b, used_at(0, 42), 1 << 60);
    let e = read_usage(&b).unwrap_err().to_string();
    assert!(e.contains("used[0][42]"), "{e}");
    let mut b = valid_region();
    put(&mut b, owner_at(5), 9u64 << 32 | 1);
    let e = read_usage(&b).unwrap_err().to_string();
    assert!(e.contains("owners[5]"), "{e}");
    assert!(
        read_usage(&b[..100])
            .unwrap_err()
            .to_string()
            .contains("size")
    );
}

/// The agent's loop reads only the granted GPUs' counters
/// (`read_usage_in` with `Scope::granted`). On every mutated region it
/// must agree with the whole-region reader on everything in scope: accept
/// what the whole reader accepts with the same slots, owners, start times,
/// bytes and buckets; refuse only what the whole reader refuses; and when
/// only it accepts, the whole reader's complaint is a counter outside the
/// scope.
#[test]
fn a_scoped_read_agrees_with_the_whole_read_within_its_scope() {
    use tessera_region::reader::{Scope, read_usage_in};
    let mut runner = TestRunner::new(Config {
        cases: 1000,
        failure_persistence: None,
        ..Config::default()
    });
    let case = (
        region(),
        proptest::collection::vec(mutation(), 0..4),
        0..=MAX_GPUS,
    );
    let compared = std::cell::Cell::new(0usize);
    runner
        .run(&case, |(mut bytes, mutations, gpus)| {
            for m in &mutations {
                apply(&mut bytes, m);
            }
            // A file shorter than a whole region never reaches the scoped
            // reader (`read_usage_prefix` refuses it by its size; tested
            // below), so only whole-length regions are compared.
            if bytes.len() < USAGE_SIZE {
                return Ok(());
            }
            let scope = Scope::granted(gpus);
            let prefix = &bytes[..scope.len()];
            let whole = read_usage(&bytes);
            let part = read_usage_in(prefix, scope);
            match (&whole, &part) {
                (Ok(w), Ok(p)) => {
                    compared.set(compared.get() + 1);
                    prop_assert_eq!(w.buckets, p.buckets);
                    prop_assert_eq!(&w.used[..gpus], &p.used[..gpus]);
                    prop_assert!(p.used[gpus..].iter().all(|&u| u == 0));
                    prop_assert_eq!(w.slots.len(), p.slots.len());
                    for (a, b) in w.slots.iter().zip(&p.slots) {
                        prop_assert_eq!(
                            (a.index, a.state, a.pid, a.start_time),
                            (b.index, b.state, b.pid, b.start_time)
                        );
                        prop_assert_eq!(&a.used[..gpus], &b.used[..gpus]);
                        prop_assert!(b.launches.iter().all(|&l| l == 0));
                    }
                    for a in &p.anomalies {
                        prop_assert!(w.anomalies.contains(a), "{} only in the scoped read", a);
                    }
                    // With nothing charged outside the scope, the scoped
                    // read sees every anomaly the whole read sees.
                    let outside = &bytes[Scope::granted(gpus).len()..usage_offsets::LAUNCHES];
                    if outside.iter().all(|&b| b == 0) {
                        prop_assert_eq!(&w.anomalies, &p.anomalies);
                    }
                }
                (Err(w), Ok(_)) => {
                    let w = w.to_string();
                    let outside = (gpus..MAX_GPUS).any(|g| w.contains(&format!("used[{g}]")));
                    prop_assert!(outside, "only the whole read refused, for {}", w);
                }
                (Ok(_), Err(p)) => {
                    prop_assert!(false, "only the scoped read ({gpus} GPUs) refused: {p}");
                }
                (Err(_), Err(_)) => {}
            }
            Ok(())
        })
        // The failing region is 72 KiB: name the reason only.
        .map_err(|e| match e {
            proptest::test_runner::TestError::Fail(why, _) => why.to_string(),
            proptest::test_runner::TestError::Abort(why) => why.to_string(),
        })
        .unwrap();
    let compared = compared.get();
    assert!(
        compared >= 100,
        "only {compared} cases were accepted by both"
    );
}

#[test]
fn a_scoped_read_needs_the_whole_file_and_reads_only_its_prefix() {
    use tessera_region::file::read_usage_prefix;
    use tessera_region::reader::{Scope, read_usage_in};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usage");
    std::fs::write(&path, valid_region()).unwrap();
    let scope = Scope::granted(1);
    let mut buf = Vec::new();
    read_usage_prefix(&path, scope.len(), &mut buf).unwrap();
    assert_eq!(buf.len(), scope.len());
    assert!(scope.len() < USAGE_SIZE / 8, "{} bytes", scope.len());
    let snap = read_usage_in(&buf, scope).unwrap();
    assert_eq!(snap.used[0], 1 << 20);
    assert_eq!(snap.slots.len(), 1);
    // A file cut right after the prefix is refused by its size, not
    // accepted as the prefix it still holds.
    let cut = valid_region()[..scope.len()].to_vec();
    std::fs::write(&path, cut).unwrap();
    let e = read_usage_prefix(&path, scope.len(), &mut buf)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("size") && e.contains(&USAGE_SIZE.to_string()),
        "{e}"
    );
    // A prefix shorter than the scope is refused too.
    let e = read_usage_in(&valid_region()[..scope.len() - 1], scope)
        .unwrap_err()
        .to_string();
    assert!(e.contains("size"), "{e}");
}

/// The head-only reader (the daemon's cheap look at quiet containers)
/// reports exactly the launch counters the full reader does, refuses a
/// region the full reader refuses for its header, and needs only the
/// header and buckets.
#[test]
fn the_bucket_reader_agrees_with_the_full_reader() {
    use tessera_region::reader::read_buckets;
    let mut runner = TestRunner::new(Config {
        cases: 256,
        ..Config::default()
    });
    runner
        .run(&region(), |b| {
            let head = read_buckets(&b[..usage_offsets::OWNERS]);
            if let Ok(full) = read_usage(&b) {
                prop_assert_eq!(head.unwrap(), full.buckets);
            }
            Ok(())
        })
        .unwrap();
    let mut b = valid_region();
    put(&mut b, usage_offsets::BUCKETS + 64 + 16, 12345);
    assert_eq!(read_buckets(&b).unwrap()[1].launches, 12345);
    assert_eq!(read_buckets(&b).unwrap(), read_usage(&b).unwrap().buckets);
    assert!(read_buckets(&b[..usage_offsets::OWNERS - 1]).is_err());
    b[0] ^= 0xff;
    let e = read_buckets(&b).unwrap_err().to_string();
    assert!(e.contains("magic"), "{e}");
}
