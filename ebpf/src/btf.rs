//! A minimal reader of the kernel's raw BTF (`/sys/kernel/btf/vmlinux`) that
//! finds the byte offsets of the few struct members the unwinder's
//! `bpf_find_vma` callback reads; the loader passes them as load-time
//! constants for `bpf_probe_read_kernel`.
//!
//! Not CO-RE on purpose: aya would parse the whole vmlinux BTF (~50 ms, tens
//! of MiB) to relocate a handful of loads. Here one pass indexes where each
//! type starts and notes the four structs by name; only their members (and
//! the anonymous structs/unions inside them) are then looked at.

const PATH: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
const VERSION: u8 = 1;
/// Bytes of `struct btf_header` we read (`hdr_len` may be larger).
const HEADER_LEN: usize = 24;
/// Bytes of `struct btf_type`.
const TYPE_LEN: usize = 12;
/// Anonymous struct/union nesting followed; a bound, so cycles fail.
const MAX_ANON_DEPTH: u32 = 8;
/// typedef/const/... hops followed; a bound, so cycles fail.
const MAX_MODIFIERS: u32 = 32;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// The structs we need, NUL-terminated as in the string section.
const STRUCTS: [&[u8]; 6] =
    [b"vm_area_struct\0", b"file\0", b"inode\0", b"super_block\0", b"task_struct\0", b"thread_struct\0"];

/// Byte offsets of the kernel struct members the unwinder's bpf_find_vma callback reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmaOffsets {
    /// `struct vm_area_struct.vm_start`
    pub vm_start: u32,
    /// `struct vm_area_struct.vm_end`
    pub vm_end: u32,
    /// `struct vm_area_struct.vm_pgoff`
    pub vm_pgoff: u32,
    /// `struct vm_area_struct.vm_file`
    pub vm_file: u32,
    /// `struct file.f_inode`
    pub f_inode: u32,
    /// `struct inode.i_ino`
    pub i_ino: u32,
    /// `struct inode.i_sb`
    pub i_sb: u32,
    /// `struct super_block.s_dev`
    pub s_dev: u32,
    /// `struct task_struct.thread.fsbase` (x86-64): a thread's TLS base,
    /// which CPython's thread states hold as `thread_id`. `None` when the
    /// kernel's BTF has no such member (the Python walker stays off).
    pub task_fsbase: Option<u32>,
    /// `struct task_struct.pid`, `.tgid` and `.comm`: what the off-CPU
    /// program reads of a thread that is not the current one. `None`
    /// when the kernel's BTF lacks one (`off_cpu` cannot run).
    pub task_ids: Option<[u32; 3]>,
}

impl VmaOffsets {
    /// Reads them from raw BTF bytes.
    pub(crate) fn from_btf(bytes: &[u8]) -> Result<Self, String> {
        let btf = Btf::parse(bytes)?;
        let [vm_start, vm_end, vm_pgoff, vm_file] =
            btf.members("vm_area_struct", &btf.candidates[0], ["vm_start", "vm_end", "vm_pgoff", "vm_file"])?;
        let [f_inode] = btf.members("file", &btf.candidates[1], ["f_inode"])?;
        let [i_ino, i_sb] = btf.members("inode", &btf.candidates[2], ["i_ino", "i_sb"])?;
        let [s_dev] = btf.members("super_block", &btf.candidates[3], ["s_dev"])?;
        let task_fsbase = btf
            .members("task_struct", &btf.candidates[4], ["thread"])
            .and_then(|[thread]| Ok(thread + btf.members("thread_struct", &btf.candidates[5], ["fsbase"])?[0]))
            .ok();
        let task_ids = btf.members("task_struct", &btf.candidates[4], ["pid", "tgid", "comm"]).ok();
        Ok(VmaOffsets { vm_start, vm_end, vm_pgoff, vm_file, f_inode, i_ino, i_sb, s_dev, task_fsbase, task_ids })
    }

    /// Reads /sys/kernel/btf/vmlinux: mapped where the kernel allows it
    /// (Linux >= 6.16), read otherwise. Mapped, its ~5 MiB are the kernel's
    /// own pages (a PFN mapping) and add nothing to the agent's resident
    /// memory; read, they were the start-up's peak RSS (docs/PERFORMANCE.md).
    pub fn from_kernel() -> Result<Self, String> {
        let file = std::fs::File::open(PATH).map_err(|e| format!("kernel BTF: opening {PATH}: {e}"))?;
        if let Some(mapped) = crate::sys::map_read_only(&file) {
            return Self::from_btf(&mapped);
        }
        let bytes = std::fs::read(PATH).map_err(|e| format!("kernel BTF: reading {PATH}: {e}"))?;
        Self::from_btf(&bytes)
    }
}

fn u32_at(b: &[u8], pos: usize) -> Option<u32> {
    let bytes = b.get(pos..pos.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// One `struct btf_type` header; `pos` is its offset in the type section.
struct Type {
    kind: u32,
    kind_flag: bool,
    vlen: usize,
    size_or_type: u32,
    pos: usize,
}

struct Btf<'a> {
    types: &'a [u8],
    strs: &'a [u8],
    /// File offset of the type section, for messages.
    types_at: usize,
    /// `index[id]`: offset of type `id` in `types` (`index[0]`, void, unused).
    index: Vec<u32>,
    /// Type ids of the STRUCTs with members named like [`STRUCTS`].
    candidates: [Vec<u32>; 6],
}

impl<'a> Btf<'a> {
    fn parse(bytes: &'a [u8]) -> Result<Self, String> {
        let hdr = |pos| u32_at(bytes, pos).ok_or_else(|| format!("kernel BTF: header truncated at byte {pos}"));
        if bytes.len() < 8 {
            return Err(format!("kernel BTF: header truncated ({} bytes)", bytes.len()));
        }
        let magic = u16::from_le_bytes([bytes[0], bytes[1]]);
        if magic == MAGIC.swap_bytes() {
            return Err("kernel BTF: big-endian BTF (byte-swapped magic) is not supported".into());
        }
        if magic != MAGIC {
            return Err(format!("kernel BTF: bad magic {magic:#06x} at byte 0 (want {MAGIC:#06x})"));
        }
        if bytes[2] != VERSION {
            return Err(format!("kernel BTF: unsupported version {} at byte 2", bytes[2]));
        }
        let hdr_len = hdr(4)? as usize;
        if hdr_len < HEADER_LEN {
            return Err(format!("kernel BTF: header length {hdr_len} at byte 4 is below {HEADER_LEN}"));
        }
        if hdr_len > bytes.len() {
            return Err(format!("kernel BTF: header length {hdr_len} exceeds the {} bytes read", bytes.len()));
        }
        let section = |name: &str, off_at: usize| -> Result<(usize, &'a [u8]), String> {
            let (off, len) = (hdr(off_at)? as usize, hdr(off_at + 4)? as usize);
            let start = hdr_len.checked_add(off);
            let end = start.and_then(|s| s.checked_add(len));
            match (start, end) {
                (Some(s), Some(e)) if e <= bytes.len() => Ok((s, &bytes[s..e])),
                _ => Err(format!(
                    "kernel BTF: {name} section (offset {off}, length {len} after the {hdr_len}-byte header) \
                     is outside the {} bytes read",
                    bytes.len()
                )),
            }
        };
        let (types_at, types) = section("type", 8)?;
        let (_, strs) = section("string", 16)?;

        let mut btf = Btf {
            types,
            strs,
            types_at,
            index: Vec::with_capacity(types.len() / 32 + 1),
            candidates: Default::default(),
        };
        btf.index.push(0);
        let mut pos = 0;
        while pos < types.len() {
            let id = btf.index.len();
            if types.len() - pos < TYPE_LEN {
                return Err(btf.truncated(pos, id));
            }
            let (name_off, info) = (u32_at(types, pos).unwrap_or(0), u32_at(types, pos + 4).unwrap_or(0));
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let extra = match kind {
                KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_FUNC
                | KIND_FLOAT | KIND_TYPE_TAG => 0,
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                _ => {
                    return Err(format!(
                        "kernel BTF: unknown type kind {kind} at byte {} (type id {id})",
                        types_at + pos
                    ))
                }
            };
            let end = pos + TYPE_LEN + extra;
            if end > types.len() {
                return Err(btf.truncated(pos, id));
            }
            if kind == KIND_STRUCT && vlen > 0 {
                let name = strs.get(name_off as usize..).ok_or_else(|| btf.bad_string(name_off, pos))?;
                if let Some(i) = STRUCTS.iter().position(|s| name.starts_with(s)) {
                    btf.candidates[i].push(id as u32);
                }
            }
            btf.index.push(pos as u32);
            pos = end;
        }
        Ok(btf)
    }

    fn truncated(&self, pos: usize, id: usize) -> String {
        format!("kernel BTF: type section truncated at byte {} (type id {id})", self.types_at + pos)
    }

    fn bad_string(&self, off: u32, pos: usize) -> String {
        format!(
            "kernel BTF: string offset {off} at byte {} is outside the {}-byte string section",
            self.types_at + pos,
            self.strs.len()
        )
    }

    fn ty(&self, id: u32) -> Result<Type, String> {
        let pos = match self.index.get(id as usize) {
            Some(&pos) if id != 0 => pos as usize,
            _ => return Err(format!("kernel BTF: type id {id} is not a type (ids 1..{})", self.index.len())),
        };
        // parse() checked the whole type fits.
        let info = u32_at(self.types, pos + 4).unwrap_or(0);
        Ok(Type {
            kind: (info >> 24) & 0x1f,
            kind_flag: info >> 31 != 0,
            vlen: (info & 0xffff) as usize,
            size_or_type: u32_at(self.types, pos + 8).unwrap_or(0),
            pos,
        })
    }

    /// Follows typedef/const/volatile/restrict/type_tag to the underlying type.
    fn strip(&self, from: u32) -> Result<(u32, Type), String> {
        let mut id = from;
        for _ in 0..MAX_MODIFIERS {
            let t = self.ty(id)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => id = t.size_or_type,
                _ => return Ok((id, t)),
            }
        }
        Err(format!("kernel BTF: more than {MAX_MODIFIERS} typedef/qualifier hops from type id {from}"))
    }

    fn name_is(&self, off: u32, pos: usize, want: &str) -> Result<bool, String> {
        let name = self.strs.get(off as usize..).ok_or_else(|| self.bad_string(off, pos))?;
        Ok(name.len() > want.len() && name.starts_with(want.as_bytes()) && name[want.len()] == 0)
    }

    /// Offsets in bytes of `members` in the first of `candidates` having them all.
    fn members<const N: usize>(&self, name: &str, candidates: &[u32], members: [&str; N]) -> Result<[u32; N], String> {
        let mut first_err = None;
        'candidates: for &id in candidates {
            let mut out = [0; N];
            for (o, m) in out.iter_mut().zip(members) {
                match self.member_bits(id, m, 0) {
                    Ok(Some((bits, false))) if bits % 8 == 0 => *o = bits / 8,
                    Ok(Some((_, true))) => {
                        first_err.get_or_insert(format!("kernel BTF: struct {name} member {m} is a bitfield"));
                        continue 'candidates;
                    }
                    Ok(Some((bits, _))) => {
                        first_err.get_or_insert(format!(
                            "kernel BTF: struct {name} member {m} is at bit {bits}, not byte aligned"
                        ));
                        continue 'candidates;
                    }
                    Ok(None) => {
                        first_err.get_or_insert(format!("kernel BTF: struct {name} has no member {m}"));
                        continue 'candidates;
                    }
                    Err(e) => {
                        first_err.get_or_insert(format!("{e} (in struct {name}, looking for {m})"));
                        continue 'candidates;
                    }
                }
            }
            return Ok(out);
        }
        Err(first_err.unwrap_or_else(|| format!("kernel BTF: no struct {name}")))
    }

    /// Bit offset of member `want` in struct/union `id`, looking inside
    /// anonymous members, and whether it is a bitfield.
    fn member_bits(&self, id: u32, want: &str, depth: u32) -> Result<Option<(u32, bool)>, String> {
        let t = self.ty(id)?;
        for i in 0..t.vlen {
            let at = t.pos + TYPE_LEN + 12 * i;
            let (Some(name_off), Some(mtype), Some(raw)) =
                (u32_at(self.types, at), u32_at(self.types, at + 4), u32_at(self.types, at + 8))
            else {
                return Err(self.truncated(at, id as usize));
            };
            let (bitfield_size, bits) = if t.kind_flag { (raw >> 24, raw & 0xff_ffff) } else { (0, raw) };
            if name_off == 0 {
                let (inner, it) = self.strip(mtype)?;
                if it.kind != KIND_STRUCT && it.kind != KIND_UNION {
                    continue; // e.g. an unnamed padding bitfield
                }
                if depth >= MAX_ANON_DEPTH {
                    return Err(format!(
                        "kernel BTF: anonymous members nested deeper than {MAX_ANON_DEPTH} at type id {id}"
                    ));
                }
                if let Some((inner_bits, bitfield)) = self.member_bits(inner, want, depth + 1)? {
                    let sum = bits
                        .checked_add(inner_bits)
                        .ok_or_else(|| format!("kernel BTF: member offset overflows at type id {id}"))?;
                    return Ok(Some((sum, bitfield)));
                }
            } else if self.name_is(name_off, at, want)? {
                let bitfield = bitfield_size != 0 || (!t.kind_flag && self.is_int_bitfield(mtype)?);
                return Ok(Some((bits, bitfield)));
            }
        }
        Ok(None)
    }

    /// Without kind_flag, a bitfield is a member whose INT type has fewer
    /// bits than its size or a bit offset.
    fn is_int_bitfield(&self, id: u32) -> Result<bool, String> {
        let (_, t) = self.strip(id)?;
        if t.kind != KIND_INT {
            return Ok(false);
        }
        let enc = u32_at(self.types, t.pos + TYPE_LEN).unwrap_or(0);
        let (nr_bits, bit_off) = (u64::from(enc & 0xff), (enc >> 16) & 0xff);
        Ok(bit_off != 0 || nr_bits != u64::from(t.size_or_type) * 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Writes raw BTF: strings first, then types, so section offsets matter.
    struct Builder {
        types: Vec<u8>,
        strs: Vec<u8>,
        next_id: u32,
    }

    impl Builder {
        fn new() -> Self {
            Builder { types: Vec::new(), strs: vec![0], next_id: 1 }
        }

        fn s(&mut self, name: &str) -> u32 {
            if name.is_empty() {
                return 0;
            }
            let off = self.strs.len() as u32;
            self.strs.extend_from_slice(name.as_bytes());
            self.strs.push(0);
            off
        }

        fn u32s(&mut self, words: &[u32]) {
            for w in words {
                self.types.extend_from_slice(&w.to_le_bytes());
            }
        }

        fn raw_ty(&mut self, name_off: u32, kind: u32, vlen: u32, kind_flag: bool, size_or_type: u32) -> u32 {
            self.u32s(&[name_off, (kind_flag as u32) << 31 | kind << 24 | vlen, size_or_type]);
            self.next_id += 1;
            self.next_id - 1
        }

        fn ty(&mut self, name: &str, kind: u32, vlen: u32, kind_flag: bool, size_or_type: u32) -> u32 {
            let off = self.s(name);
            self.raw_ty(off, kind, vlen, kind_flag, size_or_type)
        }

        fn int(&mut self, name: &str, size: u32, nr_bits: u32) -> u32 {
            let id = self.ty(name, KIND_INT, 0, false, size);
            self.u32s(&[nr_bits]);
            id
        }

        fn composite(
            &mut self,
            kind: u32,
            name: &str,
            size: u32,
            kind_flag: bool,
            members: &[(&str, u32, u32)],
        ) -> u32 {
            let id = self.ty(name, kind, members.len() as u32, kind_flag, size);
            for &(m, t, off) in members {
                let m = self.s(m);
                self.u32s(&[m, t, off]);
            }
            id
        }

        /// One of every kind the lookup never uses, so skipping is tested.
        fn other_kinds(&mut self) {
            let int = self.int("int", 4, 32);
            self.ty("", KIND_ARRAY, 0, false, 0);
            self.u32s(&[int, int, 4]);
            self.ty("e", KIND_ENUM, 2, false, 4);
            let (a, b) = (self.s("A"), self.s("B"));
            self.u32s(&[a, 0, b, 1]);
            let proto = self.ty("", KIND_FUNC_PROTO, 2, false, int);
            self.u32s(&[0, int, 0, int]);
            self.ty("f", KIND_FUNC, 0, false, proto);
            let var = self.ty("v", KIND_VAR, 0, false, int);
            self.u32s(&[1]);
            self.ty(".data", KIND_DATASEC, 1, false, 4);
            self.u32s(&[var, 0, 4]);
            self.ty("double", KIND_FLOAT, 0, false, 8);
            self.ty("tag", KIND_DECL_TAG, 0, false, var);
            self.u32s(&[u32::MAX]);
            self.ty("user", KIND_TYPE_TAG, 0, false, int);
            self.ty("e64", KIND_ENUM64, 1, false, 8);
            let c = self.s("C");
            self.u32s(&[c, 1, 2]);
            self.ty("", KIND_VOLATILE, 0, false, int);
            self.ty("", KIND_RESTRICT, 0, false, int);
            self.ty("", KIND_PTR, 0, false, int);
        }

        fn build(&self) -> Vec<u8> {
            let str_off = 0u32;
            let type_off = (self.strs.len() as u32).next_multiple_of(4);
            let mut out = Vec::new();
            out.extend_from_slice(&MAGIC.to_le_bytes());
            out.extend_from_slice(&[VERSION, 0]);
            for w in [HEADER_LEN as u32, type_off, self.types.len() as u32, str_off, self.strs.len() as u32] {
                out.extend_from_slice(&w.to_le_bytes());
            }
            out.extend_from_slice(&self.strs);
            out.resize(HEADER_LEN + type_off as usize, 0);
            out.extend_from_slice(&self.types);
            out
        }
    }

    #[derive(Clone, Copy, PartialEq)]
    enum Variant {
        Good,
        NoISb,
        BitfieldSDev,
        IntBitfieldSDev,
        MisalignedIIno,
        CycleInSuperBlock,
        NoFile,
    }

    fn sample(v: Variant) -> Vec<u8> {
        let mut b = Builder::new();
        b.other_kinds();
        let ulong = b.int("unsigned long", 8, 64);
        let uint = b.int("unsigned int", 4, 32);
        let pgoff_t = b.ty("pgoff_t", KIND_TYPEDEF, 0, false, ulong);
        // Declarations that must not be taken for the definitions.
        b.ty("vm_area_struct", KIND_FWD, 0, false, 0);
        b.composite(KIND_STRUCT, "vm_area_struct", 0, false, &[]);
        b.composite(KIND_UNION, "file", 8, false, &[("f_inode", ulong, 0)]);
        b.composite(KIND_STRUCT, "file", 8, false, &[("f_mode", uint, 0)]);

        let sb = match v {
            Variant::BitfieldSDev => b.composite(
                KIND_STRUCT,
                "super_block",
                16,
                true,
                &[("s_list", ulong, 0), ("s_dev", uint, 20 << 24 | 64)],
            ),
            Variant::IntBitfieldSDev => {
                let bits20 = b.int("unsigned int", 4, 20);
                b.composite(KIND_STRUCT, "super_block", 16, false, &[("s_list", ulong, 0), ("s_dev", bits20, 64)])
            }
            Variant::CycleInSuperBlock => {
                let own = b.next_id;
                b.composite(KIND_STRUCT, "super_block", 16, false, &[("", own, 0), ("s_dev", uint, 64)])
            }
            _ => b.composite(KIND_STRUCT, "super_block", 16, false, &[("s_list", ulong, 0), ("s_dev", uint, 64)]),
        };
        let sb_ptr = b.ty("", KIND_PTR, 0, false, sb);
        let mut inode_members = vec![("i_mode", uint, 0), ("i_sb", sb_ptr, 320), ("i_ino", ulong, 512)];
        match v {
            Variant::NoISb => inode_members.retain(|m| m.0 != "i_sb"),
            Variant::MisalignedIIno => inode_members[2].2 = 516,
            _ => {}
        }
        let inode = b.composite(KIND_STRUCT, "inode", 96, false, &inode_members);
        let inode_ptr = b.ty("", KIND_PTR, 0, false, inode);
        let file_name = if v == Variant::NoFile { "filex" } else { "file" };
        let file = b.composite(KIND_STRUCT, file_name, 64, false, &[("f_mode", uint, 0), ("f_inode", inode_ptr, 256)]);
        let file_ptr = b.ty("", KIND_PTR, 0, false, file);
        // As in Linux 6.x: vm_start/vm_end in an anonymous struct in an
        // anonymous union, here behind a typedef chain and a const.
        let anon_s = b.composite(KIND_STRUCT, "", 16, false, &[("vm_start", ulong, 0), ("vm_end", ulong, 64)]);
        let anon_u = b.composite(KIND_UNION, "", 16, false, &[("vm_rcu", ulong, 0), ("", anon_s, 0)]);
        let td = b.ty("anon_u_t", KIND_TYPEDEF, 0, false, anon_u);
        let td2 = b.ty("anon_u2_t", KIND_TYPEDEF, 0, false, td);
        let c = b.ty("", KIND_CONST, 0, false, td2);
        let pad = b.int("int", 4, 32);
        b.composite(
            KIND_STRUCT,
            "vm_area_struct",
            80,
            true,
            &[
                ("vm_mm", ulong, 0),
                ("", c, 64),
                ("vm_flags_bits", uint, 3 << 24 | 192),
                ("", pad, 5 << 24 | 195), // unnamed padding bitfield
                ("vm_pgoff", pgoff_t, 256),
                ("vm_file", file_ptr, 320),
            ],
        );
        b.build()
    }

    const SAMPLE_OFFSETS: VmaOffsets = VmaOffsets {
        vm_start: 8,
        vm_end: 16,
        vm_pgoff: 32,
        vm_file: 40,
        f_inode: 32,
        i_ino: 64,
        i_sb: 40,
        s_dev: 8,
        task_fsbase: None,
        task_ids: None,
    };

    #[test]
    fn btf_sample_offsets() {
        assert_eq!(VmaOffsets::from_btf(&sample(Variant::Good)), Ok(SAMPLE_OFFSETS));
    }

    #[test]
    fn btf_sample_errors() {
        let err = |v| VmaOffsets::from_btf(&sample(v)).unwrap_err();
        assert_eq!(err(Variant::NoISb), "kernel BTF: struct inode has no member i_sb");
        assert_eq!(err(Variant::BitfieldSDev), "kernel BTF: struct super_block member s_dev is a bitfield");
        assert_eq!(err(Variant::IntBitfieldSDev), "kernel BTF: struct super_block member s_dev is a bitfield");
        assert_eq!(
            err(Variant::MisalignedIIno),
            "kernel BTF: struct inode member i_ino is at bit 516, not byte aligned"
        );
        assert!(
            err(Variant::CycleInSuperBlock).contains("nested deeper than 8"),
            "{}",
            err(Variant::CycleInSuperBlock)
        );
        // The decoy `file` struct without f_inode is all that is left.
        assert_eq!(err(Variant::NoFile), "kernel BTF: struct file has no member f_inode");

        let good = sample(Variant::Good);
        let mut swapped = good.clone();
        swapped.swap(0, 1);
        assert!(VmaOffsets::from_btf(&swapped).unwrap_err().contains("big-endian"));
        let mut bad_magic = good.clone();
        bad_magic[0] = 0;
        assert!(VmaOffsets::from_btf(&bad_magic).unwrap_err().contains("bad magic"));
        let mut version = good.clone();
        version[2] = 2;
        assert!(VmaOffsets::from_btf(&version).unwrap_err().contains("unsupported version 2"));

        // A type of kind 20 appended after the last one.
        let mut b = Builder::new();
        b.int("int", 4, 32);
        b.ty("x", 20, 0, false, 0);
        let e = VmaOffsets::from_btf(&b.build()).unwrap_err();
        let type_start = HEADER_LEN + b.strs.len().next_multiple_of(4);
        assert_eq!(e, format!("kernel BTF: unknown type kind 20 at byte {} (type id 2)", type_start + 16));

        // A struct's name outside the string section.
        let mut b = Builder::new();
        b.raw_ty(1 << 20, KIND_STRUCT, 1, false, 4);
        b.u32s(&[0, 0, 0]);
        assert!(VmaOffsets::from_btf(&b.build()).unwrap_err().contains("outside the"));

        // An anonymous member whose type id is past the last type.
        let mut b = Builder::new();
        b.composite(KIND_STRUCT, "vm_area_struct", 8, false, &[("", 99, 0)]);
        let e = VmaOffsets::from_btf(&b.build()).unwrap_err();
        assert_eq!(
            e,
            "kernel BTF: type id 99 is not a type (ids 1..2) (in struct vm_area_struct, looking for vm_start)"
        );
        assert_eq!(VmaOffsets::from_btf(&Builder::new().build()).unwrap_err(), "kernel BTF: no struct vm_area_struct");
    }

    #[test]
    fn btf_truncated_and_corrupt_never_panic() {
        let good = sample(Variant::Good);
        for len in 0..good.len() {
            let r = VmaOffsets::from_btf(&good[..len]);
            assert!(r.is_err(), "truncated to {len} bytes: {r:?}");
        }
        // The type section truncated inside a type (header lengths adjusted).
        let mut b = Builder::new();
        b.other_kinds();
        let full = b.types.len();
        for cut in 1..full {
            let short = Builder { types: b.types[..cut].to_vec(), strs: b.strs.clone(), next_id: 0 };
            let e = VmaOffsets::from_btf(&short.build()).unwrap_err();
            assert!(e.contains("type section truncated at byte") || e.contains("no struct"), "{cut}: {e}");
        }
        // Every byte and every aligned word overwritten with awkward values.
        for i in 0..good.len() {
            for v in [0u8, 1, 2, 0x7f, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[i] = v;
                let _ = VmaOffsets::from_btf(&bad);
            }
        }
        for i in (0..good.len().saturating_sub(3)).step_by(4) {
            for w in [0u32, 1, 7, 30, 40, 0xff_ffff, 0x8000_0000, u32::MAX, 0x0400_0001] {
                let mut bad = good.clone();
                bad[i..i + 4].copy_from_slice(&w.to_le_bytes());
                let _ = VmaOffsets::from_btf(&bad);
            }
        }
    }

    /// bpftool's `format raw` dump, reduced to what member lookup needs.
    struct RawType {
        kind: String,
        name: String,
        type_id: u32,
        /// (name, type_id, bits_offset, bitfield_size)
        members: Vec<(String, u32, u32, u32)>,
    }

    fn field(line: &str, key: &str) -> Option<u32> {
        let rest = &line[line.find(&format!(" {key}="))? + key.len() + 2..];
        rest.split(' ').next()?.parse().ok()
    }

    fn quoted(line: &str) -> String {
        line.split('\'').nth(1).unwrap_or_default().to_string()
    }

    fn parse_bpftool(dump: &str) -> HashMap<u32, RawType> {
        let mut types: HashMap<u32, RawType> = HashMap::new();
        let mut current: Option<u32> = None;
        for line in dump.lines() {
            if let Some(member) = line.strip_prefix('\t') {
                if let Some(t) = current.and_then(|id| types.get_mut(&id)) {
                    let m = format!(" {member}");
                    t.members.push((
                        quoted(member),
                        field(&m, "type_id").unwrap(),
                        field(&m, "bits_offset").unwrap(),
                        field(&m, "bitfield_size").unwrap_or(0),
                    ));
                }
                continue;
            }
            current = None;
            let Some(rest) = line.strip_prefix('[') else { continue };
            let (id, rest) = rest.split_once("] ").unwrap();
            let kind = rest.split(' ').next().unwrap();
            if !["STRUCT", "UNION", "TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG"].contains(&kind) {
                continue;
            }
            let id: u32 = id.parse().unwrap();
            let t = RawType {
                kind: kind.to_string(),
                name: quoted(rest),
                type_id: field(rest, "type_id").unwrap_or(0),
                members: Vec::new(),
            };
            types.insert(id, t);
            current = Some(id);
        }
        types
    }

    /// Bit offset of `want` in `id` per bpftool's view, through anonymous members.
    fn bpftool_member(types: &HashMap<u32, RawType>, id: u32, want: &str) -> Option<(u32, u32)> {
        for (name, mut ty, bits, bitfield_size) in &types[&id].members {
            if name == want {
                return Some((*bits, *bitfield_size));
            }
            if name == "(anon)" {
                while let Some(t) = types.get(&ty).filter(|t| t.kind != "STRUCT" && t.kind != "UNION") {
                    ty = t.type_id;
                }
                if types.contains_key(&ty) {
                    if let Some((inner, size)) = bpftool_member(types, ty, want) {
                        return Some((bits + inner, size));
                    }
                }
            }
        }
        None
    }

    fn bpftool_offset(types: &HashMap<u32, RawType>, strukt: &str, member: &str) -> u32 {
        let found: Vec<(u32, u32)> = types
            .iter()
            .filter(|(_, t)| t.kind == "STRUCT" && t.name == strukt && !t.members.is_empty())
            .filter_map(|(id, _)| bpftool_member(types, *id, member))
            .collect();
        assert_eq!(found.len(), 1, "bpftool: struct {strukt} member {member}: {found:?}");
        let (bits, bitfield_size) = found[0];
        assert!(bitfield_size == 0 && bits % 8 == 0, "bpftool: {strukt}.{member} at bit {bits}");
        bits / 8
    }

    fn bpftool_dump() -> Option<String> {
        let args = ["btf", "dump", "file", PATH, "format", "raw"];
        for exe in ["bpftool", "/usr/sbin/bpftool"] {
            match std::process::Command::new(exe).args(args).output() {
                Ok(out) => {
                    assert!(out.status.success(), "bpftool failed: {}", String::from_utf8_lossy(&out.stderr));
                    return Some(String::from_utf8(out.stdout).unwrap());
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => panic!("running {exe}: {e}"),
            }
        }
        None
    }

    /// On this kernel (>= 6.16) the BTF is mapped, not copied into the
    /// heap, and the mapping holds the same bytes a read returns.
    #[test]
    fn kernel_btf_is_mapped_with_the_bytes_a_read_gives() {
        let Ok(file) = std::fs::File::open(PATH) else {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "no {PATH} (CI=true)");
            eprintln!("note: no {PATH}; skipping");
            return;
        };
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut v = release.trim().split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        let mapped = crate::sys::map_read_only(&file);
        if (major, minor) < (6, 16) {
            eprintln!("note: kernel {release} predates mappable BTF; the read is used");
            return;
        }
        let mapped = mapped.expect("sysfs BTF is mappable from Linux 6.16");
        assert_eq!(&mapped[..], std::fs::read(PATH).unwrap().as_slice());
    }

    #[test]
    fn btf_kernel_matches_bpftool() {
        if !std::path::Path::new(PATH).exists() {
            eprintln!("note: no {PATH}; skipping the kernel BTF test");
            return;
        }
        let got = VmaOffsets::from_kernel().unwrap();
        eprintln!("kernel BTF offsets: {got:?}");
        assert!(got.vm_start < got.vm_end, "{got:?}");
        let all = [got.vm_start, got.vm_end, got.vm_pgoff, got.vm_file, got.f_inode, got.i_ino, got.i_sb, got.s_dev];
        assert!(all.iter().all(|&o| o < 4096), "{got:?}");

        let Some(dump) = bpftool_dump() else {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "bpftool is missing (CI=true); see .ci/ebpf.sh");
            eprintln!("note: bpftool not found; skipping the comparison with it");
            return;
        };
        let types = parse_bpftool(&dump);
        let want = VmaOffsets {
            vm_start: bpftool_offset(&types, "vm_area_struct", "vm_start"),
            vm_end: bpftool_offset(&types, "vm_area_struct", "vm_end"),
            vm_pgoff: bpftool_offset(&types, "vm_area_struct", "vm_pgoff"),
            vm_file: bpftool_offset(&types, "vm_area_struct", "vm_file"),
            f_inode: bpftool_offset(&types, "file", "f_inode"),
            i_ino: bpftool_offset(&types, "inode", "i_ino"),
            i_sb: bpftool_offset(&types, "inode", "i_sb"),
            s_dev: bpftool_offset(&types, "super_block", "s_dev"),
            task_fsbase: Some(
                bpftool_offset(&types, "task_struct", "thread") + bpftool_offset(&types, "thread_struct", "fsbase"),
            ),
            task_ids: Some(["pid", "tgid", "comm"].map(|m| bpftool_offset(&types, "task_struct", m))),
        };
        assert_eq!(got, want);
    }

    /// `cargo test -p profcol-ebpf --release btf_kernel_timing -- --ignored --nocapture`
    #[test]
    #[ignore = "timing, for a release build"]
    fn btf_kernel_timing() {
        let mut read = Vec::new();
        let mut parse = Vec::new();
        for _ in 0..20 {
            let t = std::time::Instant::now();
            let bytes = std::fs::read(PATH).unwrap();
            read.push(t.elapsed());
            let t = std::time::Instant::now();
            std::hint::black_box(VmaOffsets::from_btf(&bytes).unwrap());
            parse.push(t.elapsed());
        }
        let t = std::time::Instant::now();
        VmaOffsets::from_kernel().unwrap();
        let total = t.elapsed();
        read.sort();
        parse.sort();
        eprintln!(
            "from_kernel {total:?}; read median {:?} (min {:?}), from_btf median {:?} (min {:?})",
            read[10], read[0], parse[10], parse[0]
        );
    }
}
