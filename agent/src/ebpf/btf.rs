//! A small reader of kernel BTF (`/sys/kernel/btf/vmlinux`): just enough to
//! find the byte offset of a struct member, including members of anonymous
//! structs and unions, so the eBPF programs can walk kernel structs without
//! CO-RE (which Rust eBPF cannot emit yet).
//!
//! Format: `Documentation/bpf/btf.rst` in the kernel tree. A blob is a
//! header, a type section (a sequence of `btf_type` records, each followed
//! by kind-specific data) and a string section; type ids count from 1.

use std::path::{Path, PathBuf};

use tessera_ebpf_common::config::{CastConfig, KernelOffsets};

/// Where the running kernel exposes its BTF.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xEB9F;
const HEADER_LEN: usize = 24;
const TYPE_LEN: usize = 12;

mod kind {
    pub const INT: u32 = 1;
    pub const PTR: u32 = 2;
    pub const ARRAY: u32 = 3;
    pub const STRUCT: u32 = 4;
    pub const UNION: u32 = 5;
    pub const ENUM: u32 = 6;
    pub const FWD: u32 = 7;
    pub const TYPEDEF: u32 = 8;
    pub const VOLATILE: u32 = 9;
    pub const CONST: u32 = 10;
    pub const RESTRICT: u32 = 11;
    pub const FUNC: u32 = 12;
    pub const FUNC_PROTO: u32 = 13;
    pub const VAR: u32 = 14;
    pub const DATASEC: u32 = 15;
    pub const FLOAT: u32 = 16;
    pub const DECL_TAG: u32 = 17;
    pub const TYPE_TAG: u32 = 18;
    pub const ENUM64: u32 = 19;
}

/// Errors reading BTF.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The file could not be read.
    #[error("cannot read btf file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The blob does not start with the BTF magic.
    #[error("btf blob has no btf magic")]
    BadMagic,
    /// A section or record runs past the end of the blob.
    #[error("btf blob is truncated in {0}")]
    Truncated(&'static str),
    /// A type of a kind this reader does not know.
    #[error("btf type {id} has unknown kind {kind}")]
    UnknownKind {
        /// Type id.
        id: u32,
        /// Kind number.
        kind: u32,
    },
    /// No struct of that name.
    #[error("btf has no struct {0}")]
    NoStruct(String),
    /// The struct has no such member.
    #[error("btf struct {strukt} has no member {member}")]
    NoMember {
        /// The struct.
        strukt: String,
        /// The member.
        member: String,
    },
    /// The member is a bitfield that does not start on a byte.
    #[error("btf member {strukt}.{member} is not byte aligned")]
    Unaligned {
        /// The struct.
        strukt: String,
        /// The member.
        member: String,
    },
}

/// One `btf_type` record.
#[derive(Clone, Copy, Debug)]
struct Type {
    name_off: u32,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    /// `size` or `type`, depending on the kind.
    size_type: u32,
    /// Offset of the kind-specific data in the blob.
    extra: usize,
}

/// A parsed BTF blob.
#[derive(Debug)]
pub struct Btf {
    data: Vec<u8>,
    big_endian: bool,
    strings: std::ops::Range<usize>,
    /// Index `id - 1`.
    types: Vec<Type>,
}

impl Btf {
    /// Reads the running kernel's BTF.
    pub fn from_kernel() -> Result<Self, BtfError> {
        Self::from_file(Path::new(VMLINUX))
    }

    /// Reads a BTF file.
    pub fn from_file(path: &Path) -> Result<Self, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(data)
    }

    /// Parses a BTF blob.
    pub fn parse(data: Vec<u8>) -> Result<Self, BtfError> {
        let big_endian = match data.get(..2) {
            Some(m) if u16::from_le_bytes([m[0], m[1]]) == MAGIC => false,
            Some(m) if u16::from_be_bytes([m[0], m[1]]) == MAGIC => true,
            _ => return Err(BtfError::BadMagic),
        };
        let mut btf = Self {
            data,
            big_endian,
            strings: 0..0,
            types: Vec::new(),
        };
        let hdr_len = btf.u32_at(4, "header")? as usize;
        if hdr_len < HEADER_LEN {
            return Err(BtfError::Truncated("header"));
        }
        let type_off = btf.u32_at(8, "header")? as usize;
        let type_len = btf.u32_at(12, "header")? as usize;
        let str_off = btf.u32_at(16, "header")? as usize;
        let str_len = btf.u32_at(20, "header")? as usize;
        let types = section(hdr_len, type_off, type_len, btf.data.len(), "type section")?;
        btf.strings = section(hdr_len, str_off, str_len, btf.data.len(), "string section")?;
        btf.types = btf.read_types(types)?;
        Ok(btf)
    }

    fn read_types(&self, range: std::ops::Range<usize>) -> Result<Vec<Type>, BtfError> {
        let mut types = Vec::new();
        let mut at = range.start;
        while at < range.end {
            let id =
                u32::try_from(types.len() + 1).map_err(|_| BtfError::Truncated("type section"))?;
            if at + TYPE_LEN > range.end {
                return Err(BtfError::Truncated("type section"));
            }
            let info = self.u32_at(at + 4, "type section")?;
            let ty = Type {
                name_off: self.u32_at(at, "type section")?,
                kind: (info >> 24) & 0x1F,
                vlen: (info & 0xFFFF) as usize,
                kind_flag: info >> 31 == 1,
                size_type: self.u32_at(at + 8, "type section")?,
                extra: at + TYPE_LEN,
            };
            let extra = match ty.kind {
                kind::INT | kind::VAR | kind::DECL_TAG => 4,
                kind::ARRAY => 12,
                kind::STRUCT | kind::UNION | kind::DATASEC | kind::ENUM64 => 12 * ty.vlen,
                kind::ENUM | kind::FUNC_PROTO => 8 * ty.vlen,
                kind::PTR
                | kind::FWD
                | kind::TYPEDEF..=kind::RESTRICT
                | kind::FUNC
                | kind::FLOAT
                | kind::TYPE_TAG => 0,
                other => return Err(BtfError::UnknownKind { id, kind: other }),
            };
            at = ty.extra + extra;
            types.push(ty);
        }
        if at != range.end {
            return Err(BtfError::Truncated("type section"));
        }
        Ok(types)
    }

    /// Byte offset of `member` in struct `strukt`, looking through anonymous
    /// struct and union members.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        let ty = self
            .types
            .iter()
            .find(|t| t.kind == kind::STRUCT && t.vlen > 0 && self.name(t.name_off) == Some(strukt))
            .ok_or_else(|| BtfError::NoStruct(strukt.to_owned()))?;
        let bits = self
            .find_member(ty, member, 0)?
            .ok_or_else(|| BtfError::NoMember {
                strukt: strukt.to_owned(),
                member: member.to_owned(),
            })?;
        if bits % 8 != 0 {
            return Err(BtfError::Unaligned {
                strukt: strukt.to_owned(),
                member: member.to_owned(),
            });
        }
        Ok(bits / 8)
    }

    /// Bit offset of `member` inside `ty` (a struct or union), plus `base`.
    fn find_member(&self, ty: &Type, member: &str, base: u32) -> Result<Option<u32>, BtfError> {
        for i in 0..ty.vlen {
            let at = ty.extra + 12 * i;
            let name_off = self.u32_at(at, "member")?;
            let type_id = self.u32_at(at + 4, "member")?;
            let raw = self.u32_at(at + 8, "member")?;
            // With kind_flag set, the top 8 bits hold a bitfield size.
            let bits = base + if ty.kind_flag { raw & 0x00FF_FFFF } else { raw };
            if name_off == 0 {
                if let Some(inner) = self.resolve(type_id)
                    && matches!(inner.kind, kind::STRUCT | kind::UNION)
                    && let Some(found) = self.find_member(&inner, member, bits)?
                {
                    return Ok(Some(found));
                }
            } else if self.name(name_off) == Some(member) {
                return Ok(Some(bits));
            }
        }
        Ok(None)
    }

    /// The type behind `id`, through typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Option<Type> {
        for _ in 0..32 {
            let ty = *self.types.get((id as usize).checked_sub(1)?)?;
            match ty.kind {
                kind::TYPEDEF | kind::VOLATILE | kind::CONST | kind::RESTRICT | kind::TYPE_TAG => {
                    id = ty.size_type;
                }
                _ => return Some(ty),
            }
        }
        None
    }

    fn name(&self, off: u32) -> Option<&str> {
        let start = self.strings.start.checked_add(off as usize)?;
        let bytes = self.data.get(start..self.strings.end)?;
        let end = bytes.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&bytes[..end]).ok()
    }

    fn u32_at(&self, at: usize, what: &'static str) -> Result<u32, BtfError> {
        let b: [u8; 4] = self
            .data
            .get(at..at + 4)
            .and_then(|s| s.try_into().ok())
            .ok_or(BtfError::Truncated(what))?;
        Ok(if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    }

    /// The id of the type named `name` of kind `kind` (a struct with
    /// members, or a function), `None` if there is none.
    fn type_id(&self, wanted: u32, name: &str) -> Option<u32> {
        let index = self.types.iter().position(|t| {
            t.kind == wanted
                && (wanted != kind::STRUCT || t.vlen > 0)
                && self.name(t.name_off) == Some(name)
        })?;
        u32::try_from(index + 1).ok()
    }

    /// The id of function `name` (a kfunc's id in `call` instructions).
    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.type_id(kind::FUNC, name)
    }

    /// The id of struct `name`.
    pub fn struct_id(&self, name: &str) -> Result<u32, BtfError> {
        self.type_id(kind::STRUCT, name)
            .ok_or_else(|| BtfError::NoStruct(name.to_owned()))
    }

    /// What the programs' `bpf_rdonly_cast` walk needs from this kernel.
    pub fn cast_config(&self) -> Result<CastConfig, BtfError> {
        Ok(CastConfig {
            files_struct_id: self.struct_id("files_struct")?,
            files_fd_array: self.member_offset("files_struct", "fd_array")?,
            file_id: self.struct_id("file")?,
        })
    }

    /// The offsets the eBPF programs need, from this kernel's BTF.
    pub fn kernel_offsets(&self) -> Result<KernelOffsets, BtfError> {
        Ok(KernelOffsets {
            task_files: self.member_offset("task_struct", "files")?,
            files_fdt: self.member_offset("files_struct", "fdt")?,
            fdtable_max_fds: self.member_offset("fdtable", "max_fds")?,
            fdtable_fd: self.member_offset("fdtable", "fd")?,
            file_inode: self.member_offset("file", "f_inode")?,
            inode_rdev: self.member_offset("inode", "i_rdev")?,
            task_pid: self.member_offset("task_struct", "pid")?,
            task_tgid: self.member_offset("task_struct", "tgid")?,
            task_cgroups: self.member_offset("task_struct", "cgroups")?,
            css_set_dfl_cgrp: self.member_offset("css_set", "dfl_cgrp")?,
            cgroup_kn: self.member_offset("cgroup", "kn")?,
            kernfs_node_id: self.member_offset("kernfs_node", "id")?,
            task_group_leader: self.member_offset("task_struct", "group_leader")?,
            task_start_time: self.member_offset("task_struct", "start_time")?,
        })
    }
}

fn section(
    hdr_len: usize,
    off: usize,
    len: usize,
    total: usize,
    what: &'static str,
) -> Result<std::ops::Range<usize>, BtfError> {
    let start = hdr_len.checked_add(off).ok_or(BtfError::Truncated(what))?;
    let end = start.checked_add(len).ok_or(BtfError::Truncated(what))?;
    if end > total {
        return Err(BtfError::Truncated(what));
    }
    Ok(start..end)
}

#[cfg(test)]
mod tests;
