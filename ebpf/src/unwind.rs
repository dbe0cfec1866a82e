//! The unwinder's maps and program (`ebpf/bpf/unwind.h`), as the receiver
//! fills them: names, capacities and the byte layouts of keys and values.

/// The tail-called `perf_event` program that walks user stacks with tables.
pub const PROGRAM: &str = "profcol_unwind";
/// `BPF_MAP_TYPE_PROG_ARRAY` with [`PROGRAM`] at index 0.
pub const PROGS_MAP: &str = "unwind_progs";
/// `BPF_MAP_TYPE_ARRAY` of `u64`: two rows (`u32` each, low half first).
pub const ROWS_MAP: &str = "unwind_rows";
/// `BPF_MAP_TYPE_HASH`: [`page_key`] → [`page_value`].
pub const PAGES_MAP: &str = "unwind_pages";
/// `BPF_MAP_TYPE_ARRAY` of `struct unwind_rule` (8 bytes).
pub const RULES_MAP: &str = "unwind_rules";
/// `BPF_MAP_TYPE_LPM_TRIE`: [`mapping_key`] → [`mapping_value`].
pub const MAPPINGS_MAP: &str = "unwind_mappings";

/// Entries of [`RULES_MAP`] (distinct rules over every loaded table).
pub const RULES_CAPACITY: u32 = 16384;
/// Entries of [`MAPPINGS_MAP`] (address prefixes over every process).
pub const MAPPINGS_CAPACITY: u32 = 65536;

/// `cfg_unwind_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Mode {
    FramePointers = 0,
    Auto = 1,
    Tables = 2,
}

/// `struct unwind_page_key`.
pub fn page_key(table: u32, page: u32) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&table.to_ne_bytes());
    k[4..].copy_from_slice(&page.to_ne_bytes());
    k
}

/// `struct unwind_page`.
pub fn page_value(first: u32, count: u32) -> [u8; 8] {
    page_key(first, count)
}

/// The data of `struct unwind_mapping_key` after `prefixlen`: the pid then
/// the address, both big endian (the trie compares bytes); the prefix
/// length is 32 + the address bits that matter.
pub fn mapping_key_data(pid: u32, addr: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&pid.to_be_bytes());
    k[4..].copy_from_slice(&addr.to_be_bytes());
    k
}

/// `struct unwind_mapping`.
pub fn mapping_value(table: u32, bias: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(&table.to_ne_bytes());
    v[8..].copy_from_slice(&bias.to_ne_bytes());
    v
}

/// The aligned prefixes `(address, prefix bits)` that cover `[start, end)`
/// exactly: at most 2 × 64 of them.
pub fn prefixes(start: u64, end: u64) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    let mut a = start;
    while a < end {
        // The largest aligned block at `a` that fits.
        let align = if a == 0 { 64 } else { a.trailing_zeros() };
        let mut bits = align.min(63);
        while bits > 0 && (a.checked_add(1u64 << bits).is_none_or(|e| e > end)) {
            bits -= 1;
        }
        if bits == 0 && a.checked_add(1).is_none_or(|e| e > end) {
            break;
        }
        out.push((a, 64 - bits));
        match a.checked_add(1u64 << bits) {
            Some(n) => a = n,
            None => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_cover_the_range_exactly() {
        for &(s, e) in &[(0x1000u64, 0x2000u64), (0x55d0_0000_1000, 0x55d0_0004_3000), (0x401000, 0x401001), (7, 9)] {
            let p = prefixes(s, e);
            assert!(p.len() <= 128);
            let mut at = s;
            for &(a, len) in &p {
                assert_eq!(a, at, "contiguous");
                let size = 1u64 << (64 - len);
                assert_eq!(a % size, 0, "aligned");
                at = a + size;
            }
            assert_eq!(at, e, "{s:#x}..{e:#x}: {p:?}");
        }
        assert!(prefixes(5, 5).is_empty());
    }

    #[test]
    fn key_layout() {
        let k = mapping_key_data(0x01020304, 0x1122334455667788);
        assert_eq!(&k[..4], &[1, 2, 3, 4]);
        assert_eq!(k[4], 0x11);
        assert_eq!(k[11], 0x88);
    }
}
