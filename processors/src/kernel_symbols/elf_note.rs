//! ELF note parsing (Elf{32,64}_Nhdr: namesz, descsz, type; name and desc
//! each padded to 4 bytes), enough to find the GNU build ID in the notes
//! files the kernel exposes in sysfs.

/// NT_GNU_BUILD_ID.
const NT_GNU_BUILD_ID: u32 = 3;

/// One note: owner name (without the trailing NUL), type and descriptor.
#[derive(Debug, PartialEq, Eq)]
pub struct Note<'a> {
    pub name: &'a [u8],
    pub kind: u32,
    pub desc: &'a [u8],
}

/// Iterates notes in native byte order; stops at the first truncated one.
pub fn notes(mut data: &[u8]) -> impl Iterator<Item = Note<'_>> {
    std::iter::from_fn(move || {
        let word = |d: &[u8], i: usize| -> Option<u32> { Some(u32::from_ne_bytes(d.get(i..i + 4)?.try_into().ok()?)) };
        let namesz = word(data, 0)? as usize;
        let descsz = word(data, 4)? as usize;
        let kind = word(data, 8)?;
        let name_end = 12usize.checked_add(namesz)?;
        let desc_start = 12usize.checked_add(align4(namesz)?)?;
        let desc_end = desc_start.checked_add(descsz)?;
        let next = desc_start.checked_add(align4(descsz)?)?;
        let name = data.get(12..name_end)?;
        let desc = data.get(desc_start..desc_end)?;
        let name = name.strip_suffix(b"\0").unwrap_or(name);
        data = data.get(next..).unwrap_or(&[]);
        Some(Note { name, kind, desc })
    })
}

fn align4(n: usize) -> Option<usize> {
    n.checked_add(3).map(|v| v & !3)
}

/// The GNU build ID in a notes blob, if any.
pub fn gnu_build_id(data: &[u8]) -> Option<&[u8]> {
    notes(data).find(|n| n.kind == NT_GNU_BUILD_ID && n.name == b"GNU" && !n.desc.is_empty()).map(|n| n.desc)
}

/// Encodes one note; used by tests and fixtures.
pub fn encode(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&((name.len() + 1) as u32).to_ne_bytes());
    out.extend_from_slice(&(desc.len() as u32).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(name);
    out.push(0);
    while out.len() % 4 != 0 {
        out.push(0);
    }
    out.extend_from_slice(desc);
    while out.len() % 4 != 0 {
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_build_id_among_other_notes() {
        let mut blob = encode(b"Xen", 6, b"abc");
        blob.extend(encode(b"Linux", 0x100, &[1, 2, 3, 4, 5]));
        blob.extend(encode(b"GNU", 3, &[0xde, 0xad, 0xbe, 0xef, 1]));
        assert_eq!(gnu_build_id(&blob), Some(&[0xde, 0xad, 0xbe, 0xef, 1][..]));
    }

    #[test]
    fn truncated_notes_do_not_panic() {
        let blob = encode(b"GNU", 3, &[1; 20]);
        for n in 0..blob.len() {
            let _ = gnu_build_id(&blob[..n]);
        }
        let huge = [0xff; 12];
        assert_eq!(notes(&huge).count(), 0);
    }
}
