use super::*;

/// Writes little-endian BTF blobs for tests.
#[derive(Default)]
struct Builder {
    types: Vec<u8>,
    strings: Vec<u8>,
    next_id: u32,
}

impl Builder {
    fn new() -> Self {
        Self {
            types: Vec::new(),
            strings: vec![0],
            next_id: 1,
        }
    }

    fn string(&mut self, s: &str) -> u32 {
        if s.is_empty() {
            return 0;
        }
        let off = self.strings.len() as u32;
        self.strings.extend_from_slice(s.as_bytes());
        self.strings.push(0);
        off
    }

    fn head(&mut self, name: &str, kind: u32, vlen: u32, kind_flag: bool, size_type: u32) -> u32 {
        let name_off = self.string(name);
        let info = (u32::from(kind_flag) << 31) | (kind << 24) | vlen;
        for v in [name_off, info, size_type] {
            self.types.extend_from_slice(&v.to_le_bytes());
        }
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn int(&mut self, name: &str, size: u32) -> u32 {
        let id = self.head(name, kind::INT, 0, false, size);
        self.types.extend_from_slice(&(size * 8).to_le_bytes());
        id
    }

    fn ptr(&mut self, to: u32) -> u32 {
        self.head("", kind::PTR, 0, false, to)
    }

    fn typedef(&mut self, name: &str, to: u32) -> u32 {
        self.head(name, kind::TYPEDEF, 0, false, to)
    }

    /// `members`: (name, type id, bit offset).
    fn compound(&mut self, kind: u32, name: &str, size: u32, members: &[(&str, u32, u32)]) -> u32 {
        let id = self.head(name, kind, members.len() as u32, false, size);
        for &(m, ty, bits) in members {
            let off = self.string(m);
            for v in [off, ty, bits] {
                self.types.extend_from_slice(&v.to_le_bytes());
            }
        }
        id
    }

    fn finish(self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&[1, 0]);
        for v in [
            HEADER_LEN as u32,
            0,
            self.types.len() as u32,
            self.types.len() as u32,
            self.strings.len() as u32,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.types);
        out.extend_from_slice(&self.strings);
        out
    }
}

/// A `struct file` whose `f_inode` sits behind an anonymous union and a
/// typedef'd anonymous struct, as kernel structs often do.
fn sample() -> Vec<u8> {
    let mut b = Builder::new();
    let u32_t = b.int("unsigned int", 4);
    let u64_t = b.int("long long unsigned int", 8);
    let inode = b.compound(
        kind::STRUCT,
        "inode",
        128,
        &[("i_mode", u32_t, 0), ("i_rdev", u32_t, 76 * 8)],
    );
    let inode_ptr = b.ptr(inode);
    let anon_struct = b.compound(
        kind::STRUCT,
        "",
        16,
        &[("f_pad", u64_t, 0), ("f_inode", inode_ptr, 64)],
    );
    let anon_td = b.typedef("", anon_struct);
    let anon_union = b.compound(
        kind::UNION,
        "",
        16,
        &[("f_other", u64_t, 0), ("", anon_td, 0)],
    );
    b.compound(
        kind::STRUCT,
        "file",
        64,
        &[
            ("f_lock", u64_t, 0),
            ("", anon_union, 16 * 8),
            ("f_mode", u32_t, 40 * 8),
        ],
    );
    b.finish()
}

#[test]
fn finds_plain_and_nested_members() {
    let btf = Btf::parse(sample()).unwrap();
    assert_eq!(btf.member_offset("inode", "i_rdev").unwrap(), 76);
    assert_eq!(btf.member_offset("file", "f_mode").unwrap(), 40);
    // 16 (anonymous union) + 0 (typedef'd struct) + 8 (f_inode)
    assert_eq!(btf.member_offset("file", "f_inode").unwrap(), 24);
}

#[test]
fn names_what_is_missing() {
    let btf = Btf::parse(sample()).unwrap();
    let err = btf.member_offset("file", "f_nope").unwrap_err();
    assert_eq!(err.to_string(), "btf struct file has no member f_nope");
    let err = btf.member_offset("task_struct", "files").unwrap_err();
    assert_eq!(err.to_string(), "btf has no struct task_struct");
}

#[test]
fn rejects_bad_blobs() {
    assert!(matches!(Btf::parse(vec![0; 4]), Err(BtfError::BadMagic)));
    let mut blob = sample();
    blob.truncate(blob.len() - 10);
    assert!(matches!(Btf::parse(blob), Err(BtfError::Truncated(_))));
}

#[test]
fn reads_bitfield_offsets_with_kind_flag() {
    let mut b = Builder::new();
    let u32_t = b.int("unsigned int", 4);
    let id = b.head("flags", kind::STRUCT, 2, true, 8);
    // a: 3 bits at bit 0; b: at byte 4, bitfield size 8 in the top byte.
    for (name, bits) in [("a", 3 << 24), ("b", (8 << 24) | 32)] {
        let off = b.string(name);
        for v in [off, u32_t, bits] {
            b.types.extend_from_slice(&v.to_le_bytes());
        }
    }
    assert_eq!(id, 2);
    let btf = Btf::parse(b.finish()).unwrap();
    assert_eq!(btf.member_offset("flags", "b").unwrap(), 4);
    assert_eq!(btf.member_offset("flags", "a").unwrap(), 0);
}

#[test]
fn reads_the_running_kernel_when_it_has_btf() {
    if !Path::new(VMLINUX).exists() {
        eprintln!("skipped: {VMLINUX} does not exist (kernel built without CONFIG_DEBUG_INFO_BTF)");
        return;
    }
    let off = Btf::from_kernel().unwrap().kernel_offsets().unwrap();
    // Layout facts that hold on every kernel: fdtable starts with max_fds,
    // and the fd array pointer follows it.
    assert_eq!(off.fdtable_max_fds, 0);
    assert_eq!(off.fdtable_fd, 8);
    assert!(off.file_inode > 0 && off.file_inode < 256, "{off:?}");
    assert!(off.inode_rdev > 0 && off.inode_rdev < 512, "{off:?}");
    assert!(off.task_files > 256, "{off:?}");
}
