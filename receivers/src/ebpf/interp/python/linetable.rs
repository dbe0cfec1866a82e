//! Byte offset within a code object → source line, through the code's own
//! line table, in each format CPython has used since 3.9
//! (Objects/lnotab_notes.txt and Objects/locations.md of each version).

/// The line table format of a version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TableKind {
    /// 3.9 `co_lnotab`: (address delta, signed line delta) byte pairs.
    Lnotab,
    /// 3.10 `co_linetable` (PEP 626): (bytes delta, signed line delta)
    /// pairs, line delta -128 = no line.
    Pep626,
    /// 3.11+ location table: entries of varint-coded line and column data.
    Locations,
}

impl TableKind {
    pub(crate) fn of(version: (u8, u8)) -> Self {
        match version {
            (3, 9) => TableKind::Lnotab,
            (3, 10) => TableKind::Pep626,
            _ => TableKind::Locations,
        }
    }
}

/// The line of the instruction at byte `offset`, `None` where the table
/// gives none (no-line entries, an offset past the table).
pub(crate) fn line_at(kind: TableKind, table: &[u8], first_line: u32, offset: u32) -> Option<u32> {
    let line = match kind {
        TableKind::Lnotab => lnotab(table, first_line, offset),
        TableKind::Pep626 => pep626(table, first_line, offset),
        TableKind::Locations => locations(table, first_line, offset),
    }?;
    u32::try_from(line).ok().filter(|&l| l > 0)
}

/// 3.9's PyCode_Addr2Line: the line of the last entry starting at or
/// before `offset`.
fn lnotab(table: &[u8], first_line: u32, offset: u32) -> Option<i64> {
    let mut line = i64::from(first_line);
    let mut addr = 0u32;
    for pair in table.chunks_exact(2) {
        addr = addr.saturating_add(u32::from(pair[0]));
        if addr > offset {
            break;
        }
        line = line.saturating_add(i64::from(pair[1] as i8));
    }
    Some(line)
}

/// 3.10's address ranges: each pair ends a range `[start, start+delta)`.
fn pep626(table: &[u8], first_line: u32, offset: u32) -> Option<i64> {
    let mut line = i64::from(first_line);
    let mut end = 0u32;
    for pair in table.chunks_exact(2) {
        let start = end;
        end = end.saturating_add(u32::from(pair[0]));
        let delta = pair[1] as i8;
        let this = if delta == -128 {
            None
        } else {
            line = line.saturating_add(i64::from(delta));
            Some(line)
        };
        if offset >= start && offset < end {
            return this;
        }
    }
    None
}

/// 3.11+: each entry's first byte has its high bit set, a 4-bit code and
/// its length in code units (1..=8); the line delta comes from the code.
fn locations(table: &[u8], first_line: u32, offset: u32) -> Option<i64> {
    let mut line = i64::from(first_line);
    let mut end = 0u32;
    let mut at = 0usize;
    while at < table.len() {
        let head = table[at];
        if head & 0x80 == 0 {
            return None; // not an entry start: a corrupt or cut table
        }
        let code = (head >> 3) & 15;
        let start = end;
        end = end.saturating_add((u32::from(head & 7) + 1) * 2);
        let delta = match code {
            15 => 0, // no location
            13 | 14 => {
                let mut r = Reader { bytes: table, at: at + 1 };
                r.svarint()?
            }
            10..=12 => i64::from(code - 10),
            _ => 0,
        };
        line = line.saturating_add(delta);
        if offset >= start && offset < end {
            return (code != 15).then_some(line);
        }
        // Skip to the next entry start.
        at += 1;
        while at < table.len() && table[at] & 0x80 == 0 {
            at += 1;
        }
    }
    None
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    /// 6-bit little-endian groups, bit 6 = more follow.
    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        let mut shift = 0u32;
        loop {
            let b = *self.bytes.get(self.at)?;
            self.at += 1;
            if shift >= 64 {
                return None;
            }
            value |= u64::from(b & 63) << shift;
            shift += 6;
            if b & 64 == 0 {
                return Some(value);
            }
        }
    }

    /// Sign in the low bit.
    fn svarint(&mut self) -> Option<i64> {
        let v = self.varint()?;
        let magnitude = i64::try_from(v >> 1).ok()?;
        Some(if v & 1 != 0 { -magnitude } else { magnitude })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lnotab_pairs() {
        // Lines 10 (bytes 0..6), 11 (6..10), 9 (10..).
        let t = [6, 1, 4, 0xfe];
        assert_eq!(line_at(TableKind::Lnotab, &t, 10, 0), Some(10));
        assert_eq!(line_at(TableKind::Lnotab, &t, 10, 5), Some(10));
        assert_eq!(line_at(TableKind::Lnotab, &t, 10, 6), Some(11));
        assert_eq!(line_at(TableKind::Lnotab, &t, 10, 12), Some(9));
    }

    #[test]
    fn pep626_ranges_and_no_line() {
        // [0,4) line 5, [4,8) no line, [8,10) line 7 (delta 2 from the last line).
        let t = [4, 0, 4, 0x80, 2, 2];
        assert_eq!(line_at(TableKind::Pep626, &t, 5, 2), Some(5));
        assert_eq!(line_at(TableKind::Pep626, &t, 5, 4), None);
        assert_eq!(line_at(TableKind::Pep626, &t, 5, 9), Some(7));
        assert_eq!(line_at(TableKind::Pep626, &t, 5, 10), None);
    }

    #[test]
    fn location_entries() {
        // code 13 (no column) delta +1, 2 units; code 10 (one line, +0) 1 unit
        // with 2 column bytes; code 15 (none) 1 unit; code 14 (long) delta -2
        // with 3 more varints, 1 unit; code 0 (short, same line) 1 unit.
        let t = [
            0x80 | (13 << 3) | 1,
            2,
            0x80 | (10 << 3),
            4,
            9,
            0x80 | (15 << 3),
            0x80 | (14 << 3),
            5,
            0,
            1,
            3,
            0x80,
            0x11,
        ];
        let at = |off| line_at(TableKind::Locations, &t, 20, off);
        assert_eq!(at(0), Some(21));
        assert_eq!(at(2), Some(21));
        assert_eq!(at(4), Some(21));
        assert_eq!(at(6), None);
        assert_eq!(at(8), Some(19));
        assert_eq!(at(10), Some(19));
        assert_eq!(at(12), None);
    }

    #[test]
    fn random_tables_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..2000 {
            let len = (next() % 64) as usize;
            let table: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            for kind in [TableKind::Lnotab, TableKind::Pep626, TableKind::Locations] {
                let _ = line_at(kind, &table, next() as u32, next() as u32 % 256);
            }
        }
    }

    #[test]
    fn corrupt_tables_give_no_line() {
        assert_eq!(line_at(TableKind::Locations, &[0x01, 0x02], 1, 0), None);
        // A long entry cut before its varint.
        assert_eq!(line_at(TableKind::Locations, &[0x80 | (14 << 3)], 1, 0), None);
        // Endless continuation bits.
        assert_eq!(
            line_at(
                TableKind::Locations,
                &[0x80 | (13 << 3), 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f],
                1,
                0
            ),
            None
        );
        assert_eq!(line_at(TableKind::Pep626, &[1], 1, 0), None);
        // Line deltas past any real line: no overflow, no line.
        let huge = [0x80 | (13 << 3), 0x7e, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x0f];
        assert_eq!(line_at(TableKind::Locations, &[&huge[..], &huge[..]].concat(), 1, 2), None);
        assert_eq!(line_at(TableKind::Lnotab, &[], 3, 100), Some(3));
    }
}
