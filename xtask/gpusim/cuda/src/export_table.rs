//! `cuGetExportTable`: the driver's private tables, which NVIDIA's CUDA
//! runtime (libcudart, static or shared) asks for by UUID before it uses
//! anything else.
//!
//! A table is an array of machine words: in most tables slot 0 holds the
//! table's size in bytes and the other slots hold functions. What each
//! slot is called with and must return is not documented by NVIDIA; the
//! facts used here come from public reimplementations of the driver
//! (ZLUDA's `dark_api` crate describes the same tables) and from
//! observing what the runtime calls:
//!
//! | table (UUID, memory order) | slots | what the simulator does |
//! |---|---|---|
//! | cudart interface `6bd5fb6c-…` | 13 | 1, 6, 8: load a fat binary as a module; 2: the device's primary context, not activated; 7: nothing; 12: "load the compilers", success |
//! | tools TLS `42d85a81-…` | 4 | size only |
//! | tools runtime callback hooks `a094798c-…` | 7 | 2, 6: a zeroed buffer of the runtime's own and its size |
//! | context-local storage `c693336e-…` | 4 | 0 put, 1 delete, 2 get (a value per context and key) |
//! | context creation bypass `0ca50b8c-…` | 2 | 1: `cuCtxCreate_v2` |
//! | heap access `195bcbf4-…` | 3 | unknown slots |
//! | extended device attributes `b10541e1-…` | 26 | unknown slots |
//! | integrity check `d4082055-…` | 3 | 1: the runtime's self-check (below) |
//! | context checks `263e8860-…` | 4 | 2: "nothing to report" (0); 3: returns 0 |
//!
//! Every other slot is a function that prints, once, which table and slot
//! was called (`gpusim: unsimulated export table slot …`) and returns
//! `CUDA_ERROR_NOT_SUPPORTED`, so the next gap names itself instead of
//! jumping through garbage. An unknown table is refused with
//! `CUDA_ERROR_NOT_FOUND` and named once on stderr; so, without the line,
//! is `f8cff951-…`, which the runtime asks for first and which, answered,
//! would make it take a start of its own (refused, it starts as usual).
//!
//! The integrity check: the runtime passes its version and the time, and
//! compares the answer with what it computes itself. The answer is an
//! HMAC (RFC 2104) over MD2 (RFC 1319) with a fixed 16-byte key, of the
//! driver version, the runtime's version, the process and thread ids, the
//! addresses of the cudart-interface table, of the integrity table and of
//! its slot-1 function, and the time, followed by each device's UUID and
//! PCI domain, bus and device numbers; runtime versions ending in 0 or 1
//! get fixed answers instead.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Mutex, OnceLock};

/// A table's UUID, in memory order (as `CUuuid` holds it).
pub type Uuid = [u8; 16];

/// Parses `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (bytes in the order
/// written, as the runtime's memory holds them).
const fn uuid(s: &str) -> Uuid {
    let b = s.as_bytes();
    let mut out = [0u8; 16];
    let mut i = 0;
    let mut n = 0;
    while i < b.len() {
        if b[i] == b'-' {
            i += 1;
            continue;
        }
        out[n] = (hex(b[i]) << 4) | hex(b[i + 1]);
        n += 1;
        i += 2;
    }
    assert!(n == 16, "a UUID has 16 bytes");
    out
}

const fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => panic!("not a hex digit"),
    }
}

/// The tables this driver answers, by index into [`TABLES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Id {
    CudartInterface = 0,
    ToolsTls = 1,
    ToolsRuntimeCallbackHooks = 2,
    ContextLocalStorage = 3,
    CtxCreateBypass = 4,
    HeapAccess = 5,
    DeviceExtendedRt = 6,
    IntegrityCheck = 7,
    ContextChecks = 8,
}

/// One known table: its UUID, name and number of slots.
pub struct Known {
    pub id: Id,
    pub uuid: Uuid,
    pub name: &'static str,
    pub slots: usize,
    /// Whether slot 0 holds the table's size in bytes.
    pub sized: bool,
}

/// Every table this driver answers.
pub const TABLES: [Known; 9] = [
    Known {
        id: Id::CudartInterface,
        uuid: uuid("6bd5fb6c-5bf4-e74a-8987-d93912fd9df9"),
        name: "cudart interface",
        slots: 13,
        sized: true,
    },
    Known {
        id: Id::ToolsTls,
        uuid: uuid("42d85a81-23f6-cb47-8298-f6e78a3aecdc"),
        name: "tools TLS",
        slots: 4,
        sized: true,
    },
    Known {
        id: Id::ToolsRuntimeCallbackHooks,
        uuid: uuid("a094798c-2e74-2e74-93f2-0800200c0a66"),
        name: "tools runtime callback hooks",
        slots: 7,
        sized: true,
    },
    Known {
        id: Id::ContextLocalStorage,
        uuid: uuid("c693336e-1121-df11-a8c3-68f355d89593"),
        name: "context-local storage",
        slots: 4,
        sized: false,
    },
    Known {
        id: Id::CtxCreateBypass,
        uuid: uuid("0ca50b8c-1004-929a-89a7-d0df10e77286"),
        name: "context creation bypass",
        slots: 2,
        sized: true,
    },
    Known {
        id: Id::HeapAccess,
        uuid: uuid("195bcbf4-d67d-024a-acc5-1d29cea631ae"),
        name: "heap access",
        slots: 3,
        sized: true,
    },
    Known {
        id: Id::DeviceExtendedRt,
        uuid: uuid("b10541e1-f7c7-c74a-9f64-f223be99f1e2"),
        name: "extended device attributes",
        slots: 26,
        sized: true,
    },
    Known {
        id: Id::IntegrityCheck,
        uuid: uuid("d4082055-bde6-704b-8d34-ba123c66e1f2"),
        name: "integrity check",
        slots: 3,
        sized: true,
    },
    Known {
        id: Id::ContextChecks,
        uuid: uuid("263e8860-7cd2-6143-92f6-bbd5006dfa7e"),
        name: "context checks",
        slots: 4,
        sized: true,
    },
];

/// The largest table.
pub const MAX_SLOTS: usize = 32;

/// Tables the runtime asks for that are refused on purpose (no line on
/// stderr for these).
pub fn refused_quietly(id: &Uuid) -> bool {
    // Answered, the runtime takes a start-up path of its own instead of the
    // ordinary one; refused, it goes on as usual.
    const SKIP_START: Uuid = uuid("f8cff951-2146-8b4e-b9e2-fb469e7c0dd9");
    *id == SKIP_START
}

/// The known table with UUID `id`.
pub fn find(id: &Uuid) -> Option<&'static Known> {
    TABLES.iter().find(|t| t.uuid == *id)
}

/// `id` as text (`xxxxxxxx-xxxx-…`, memory order).
pub fn uuid_text(id: &Uuid) -> String {
    let mut s = String::with_capacity(36);
    for (i, b) in id.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Prints `line` to stderr the first time it is seen in this process.
pub fn log_once(line: String) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if seen.get_or_insert_with(HashSet::new).insert(line.clone()) {
        eprintln!("gpusim: {line}");
    }
}

/// Notes a call of slot `slot` of table `table` that is not simulated.
pub fn unknown_slot(table: usize, slot: usize) {
    let (name, uuid) = TABLES
        .get(table)
        .map_or(("?", String::new()), |t| (t.name, uuid_text(&t.uuid)));
    log_once(format!(
        "unsimulated export table slot called: {name} ({uuid}) slot {slot}; returning CUDA_ERROR_NOT_SUPPORTED"
    ));
}

/// Builds the tables once: `slot(table, index)` gives each function
/// slot's address (the unknown-slot stub where nothing is simulated).
/// The tables never move or change afterwards.
pub fn tables(slot: impl Fn(Id, usize) -> usize) -> &'static [Vec<usize>] {
    static BUILT: OnceLock<Vec<Vec<usize>>> = OnceLock::new();
    BUILT.get_or_init(|| {
        TABLES
            .iter()
            .map(|t| {
                (0..t.slots)
                    .map(|i| {
                        if i == 0 && t.sized {
                            t.slots * std::mem::size_of::<usize>()
                        } else {
                            slot(t.id, i)
                        }
                    })
                    .collect()
            })
            .collect()
    })
}

/// Context-local storage: one value per (context, key), with the
/// destructor the runtime registers.
pub struct LocalStorage {
    values: BTreeMap<(u64, usize), (usize, usize)>,
}

/// The process's context-local storage.
pub fn local_storage() -> std::sync::MutexGuard<'static, LocalStorage> {
    static STORE: Mutex<LocalStorage> = Mutex::new(LocalStorage {
        values: BTreeMap::new(),
    });
    STORE.lock().unwrap_or_else(|p| p.into_inner())
}

impl LocalStorage {
    /// Sets `key` in `ctx` to `value` (with its destructor's address, 0
    /// for none).
    pub fn put(&mut self, ctx: u64, key: usize, value: usize, dtor: usize) {
        self.values.insert((ctx, key), (value, dtor));
    }

    /// Removes `key` from `ctx`.
    pub fn delete(&mut self, ctx: u64, key: usize) {
        self.values.remove(&(ctx, key));
    }

    /// The value of `key` in `ctx`.
    pub fn get(&self, ctx: u64, key: usize) -> Option<usize> {
        self.values.get(&(ctx, key)).map(|&(v, _)| v)
    }

    /// Forgets context `ctx` (destroyed), returning its (key, value,
    /// destructor) entries.
    pub fn forget(&mut self, ctx: u64) -> Vec<(usize, usize, usize)> {
        let keys: Vec<_> = self.values.keys().filter(|k| k.0 == ctx).copied().collect();
        keys.into_iter()
            .filter_map(|k| self.values.remove(&k).map(|(v, d)| (k.1, v, d)))
            .collect()
    }
}

/// What the integrity check hashes besides the devices.
#[derive(Clone, Copy, Debug)]
pub struct IntegrityInput {
    pub driver_version: u32,
    pub runtime_version: u32,
    pub pid: u32,
    pub thread: u32,
    pub cudart_table: usize,
    pub integrity_table: usize,
    pub check_fn: usize,
    pub unix_seconds: u64,
}

/// One device as the integrity check hashes it.
#[derive(Clone, Copy, Debug)]
pub struct IntegrityDevice {
    pub uuid: [u8; 16],
    pub pci_domain: i32,
    pub pci_bus: i32,
    pub pci_device: i32,
}

/// The integrity check's answer (two words, in the order written).
pub fn integrity(input: &IntegrityInput, devices: &[IntegrityDevice]) -> [u64; 2] {
    match input.runtime_version % 10 {
        0 => return [0x3341_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8],
        1 => return [0x1841_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8],
        _ => {}
    }
    const KEY: [u8; 16] = [
        0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A,
        0x9F,
    ];
    let mut msg = Vec::with_capacity(48 + 28 * devices.len());
    msg.extend_from_slice(&input.driver_version.to_le_bytes());
    msg.extend_from_slice(&input.runtime_version.to_le_bytes());
    msg.extend_from_slice(&input.pid.to_le_bytes());
    msg.extend_from_slice(&input.thread.to_le_bytes());
    msg.extend_from_slice(&(input.cudart_table as u64).to_le_bytes());
    msg.extend_from_slice(&(input.integrity_table as u64).to_le_bytes());
    msg.extend_from_slice(&(input.check_fn as u64).to_le_bytes());
    msg.extend_from_slice(&input.unix_seconds.to_le_bytes());
    for d in devices {
        msg.extend_from_slice(&d.uuid);
        msg.extend_from_slice(&d.pci_domain.to_le_bytes());
        msg.extend_from_slice(&d.pci_bus.to_le_bytes());
        msg.extend_from_slice(&d.pci_device.to_le_bytes());
    }
    let mac = hmac_md2(&KEY, &msg);
    [
        u64::from_le_bytes(mac[..8].try_into().unwrap_or_default()),
        u64::from_le_bytes(mac[8..].try_into().unwrap_or_default()),
    ]
}

/// HMAC (RFC 2104) with MD2 (block and digest 16 bytes) and a one-block key.
fn hmac_md2(key: &[u8; 16], msg: &[u8]) -> [u8; 16] {
    let mut inner = Md2::new();
    inner.update(&key.map(|b| b ^ 0x36));
    inner.update(msg);
    let inner = inner.finish();
    let mut outer = Md2::new();
    outer.update(&key.map(|b| b ^ 0x5c));
    outer.update(&inner);
    outer.finish()
}

/// MD2 (RFC 1319).
struct Md2 {
    /// The 48-byte state; its first 16 bytes are the digest.
    x: [u8; 48],
    checksum: [u8; 16],
    /// The last checksum byte.
    l: u8,
    block: [u8; 16],
    filled: usize,
}

/// RFC 1319's permutation of 0..=255, built from the digits of pi.
const PI_SUBST: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199,
    115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66,
    111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47,
    238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93,
    154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209,
    215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226,
    156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27,
    96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81,
    175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205,
    244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14,
    102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26,
    219, 153, 141, 51, 159, 17, 131, 20,
];

impl Md2 {
    fn new() -> Self {
        Self {
            x: [0; 48],
            checksum: [0; 16],
            l: 0,
            block: [0; 16],
            filled: 0,
        }
    }

    fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.block[self.filled] = b;
            self.filled += 1;
            if self.filled == 16 {
                let block = self.block;
                self.compress(&block);
                for (c, &m) in self.checksum.iter_mut().zip(&block) {
                    *c ^= PI_SUBST[usize::from(m ^ self.l)];
                    self.l = *c;
                }
                self.filled = 0;
            }
        }
    }

    fn compress(&mut self, block: &[u8; 16]) {
        for (j, &m) in block.iter().enumerate() {
            self.x[16 + j] = m;
            self.x[32 + j] = self.x[j] ^ m;
        }
        let mut t = 0u8;
        for round in 0..18u8 {
            for x in self.x.iter_mut() {
                *x ^= PI_SUBST[usize::from(t)];
                t = *x;
            }
            t = t.wrapping_add(round);
        }
    }

    fn finish(mut self) -> [u8; 16] {
        let pad = (16 - self.filled) as u8;
        self.update(&vec![pad; usize::from(pad)]);
        let checksum = self.checksum;
        self.compress(&checksum);
        let mut out = [0; 16];
        out.copy_from_slice(&self.x[..16]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md2_hex(s: &[u8]) -> String {
        let mut m = Md2::new();
        m.update(s);
        m.finish().iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn md2_matches_rfc_1319() {
        assert_eq!(md2_hex(b""), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(md2_hex(b"a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
        assert_eq!(md2_hex(b"abc"), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(
            md2_hex(b"abcdefghijklmnopqrstuvwxyz"),
            "4e8ddff3650292ab5a4108c3aa47940b"
        );
        assert_eq!(
            md2_hex(
                b"12345678901234567890123456789012345678901234567890123456789012345678901234567890"
            ),
            "d5976f79d83d3a0dc9806c3c66f3efd8"
        );
    }

    #[test]
    fn hmac_inner_state_after_the_key() {
        // The state after the first block of the integrity check's inner
        // hash (the key xor 0x36), as ZLUDA's tests record it.
        let key = [
            0x14u8, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5,
            0x5A, 0x9F,
        ];
        let mut m = Md2::new();
        m.update(&key.map(|b| b ^ 0x36));
        assert_eq!(
            m.x[..16],
            [
                0x8b, 0x21, 0x9a, 0x49, 0xe8, 0x6d, 0x1a, 0xee, 0xf2, 0x37, 0xf9, 0xb5, 0x4a, 0x8c,
                0x3c, 0x75
            ]
        );
    }

    #[test]
    fn uuids_parse_in_memory_order() {
        let t = find(&uuid("6bd5fb6c-5bf4-e74a-8987-d93912fd9df9")).unwrap();
        assert_eq!(t.id, Id::CudartInterface);
        assert_eq!(t.uuid[0], 0x6b);
        assert_eq!(uuid_text(&t.uuid), "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9");
        assert!(refused_quietly(&uuid(
            "f8cff951-2146-8b4e-b9e2-fb469e7c0dd9"
        )));
        assert!(TABLES.iter().enumerate().all(|(i, t)| t.id as usize == i));
        assert!(TABLES.iter().all(|t| t.slots <= MAX_SLOTS));
    }

    #[test]
    fn integrity_answers_depend_on_every_input() {
        let input = IntegrityInput {
            driver_version: 12080,
            runtime_version: 12082,
            pid: 1,
            thread: 2,
            cudart_table: 3,
            integrity_table: 4,
            check_fn: 5,
            unix_seconds: 6,
        };
        let dev = IntegrityDevice {
            uuid: [7; 16],
            pci_domain: 0,
            pci_bus: 2,
            pci_device: 0,
        };
        let a = integrity(&input, &[dev]);
        assert_eq!(a, integrity(&input, &[dev]));
        assert_ne!(a, integrity(&input, &[]));
        let later = IntegrityInput {
            unix_seconds: 7,
            ..input
        };
        assert_ne!(a, integrity(&later, &[dev]));
        let round = IntegrityInput {
            runtime_version: 12090,
            ..input
        };
        assert_eq!(integrity(&round, &[])[0], 0x3341_181C_03CB_675C);
    }
}
