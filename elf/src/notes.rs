//! ELF notes (`Elf{32,64}_Nhdr`: namesz, descsz, type; name and desc each
//! padded to 4 bytes): the GNU build ID and the Go build ID.
//!
//! Used for note segments/sections of a mapped file ([`crate::ElfFile`]) and
//! for the bare note blobs the kernel exposes in sysfs
//! (`/sys/kernel/notes`, `/sys/module/*/notes/.note.gnu.build-id`).

use object::read::elf::NoteIterator;
use object::Endianness;

/// NT_GNU_BUILD_ID (owner "GNU").
pub(crate) const NT_GNU_BUILD_ID: u32 = 3;
/// NT_GO_BUILD_ID (owner "Go"), in `.note.go.buildid`.
pub(crate) const NT_GO_BUILD_ID: u32 = 4;
/// Longest build ID accepted (SHA-1 is 20 bytes, some linkers use 32).
const MAX_GNU_BUILD_ID: usize = 64;
/// Longest Go build ID accepted (four base64 hashes and slashes, ~83 bytes).
const MAX_GO_BUILD_ID: usize = 256;

/// One note: owner name (without the trailing NUL), type and descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Note<'a> {
    pub name: &'a [u8],
    pub kind: u32,
    pub desc: &'a [u8],
}

/// Iterates the notes of `data` (4-byte aligned, byte order `endian`);
/// stops at the first malformed or truncated note.
pub fn iter(data: &[u8], endian: Endianness) -> impl Iterator<Item = Note<'_>> {
    let mut it = NoteIterator::<object::elf::FileHeader64<Endianness>>::new(endian, 4, data).ok();
    std::iter::from_fn(move || {
        let note = it.as_mut()?.next().ok()??;
        Some(Note { name: note.name(), kind: note.n_type(endian).0, desc: note.desc() })
    })
}

/// The GNU build ID among `notes`.
pub fn gnu_build_id<'a>(mut notes: impl Iterator<Item = Note<'a>>) -> Option<&'a [u8]> {
    notes
        .find(|n| {
            n.kind == NT_GNU_BUILD_ID && n.name == b"GNU" && !n.desc.is_empty() && n.desc.len() <= MAX_GNU_BUILD_ID
        })
        .map(|n| n.desc)
}

/// The Go build ID among `notes` (printable ASCII, as `go tool buildid` shows it).
pub fn go_build_id<'a>(mut notes: impl Iterator<Item = Note<'a>>) -> Option<&'a str> {
    notes
        .find(|n| n.kind == NT_GO_BUILD_ID && n.name == b"Go" && !n.desc.is_empty() && n.desc.len() <= MAX_GO_BUILD_ID)
        .and_then(|n| std::str::from_utf8(n.desc).ok())
        .filter(|s| s.bytes().all(|b| b.is_ascii_graphic()))
}

/// The GNU build ID in a bare notes blob in native byte order (sysfs).
pub fn gnu_build_id_in_blob(data: &[u8]) -> Option<&[u8]> {
    gnu_build_id(iter(data, native()))
}

/// This machine's byte order.
pub fn native() -> Endianness {
    if cfg!(target_endian = "little") {
        Endianness::Little
    } else {
        Endianness::Big
    }
}

/// Lower-case hex of a build ID.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Encodes one note in native byte order; for tests and fixtures.
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
    fn finds_build_ids_among_other_notes() {
        let mut blob = encode(b"Xen", 6, b"abc");
        blob.extend(encode(b"Linux", 0x100, &[1, 2, 3, 4, 5]));
        blob.extend(encode(b"Go", NT_GO_BUILD_ID, b"abc/def"));
        blob.extend(encode(b"GNU", NT_GNU_BUILD_ID, &[0xde, 0xad, 0xbe, 0xef, 1]));
        assert_eq!(gnu_build_id_in_blob(&blob), Some(&[0xde, 0xad, 0xbe, 0xef, 1][..]));
        assert_eq!(go_build_id(iter(&blob, native())), Some("abc/def"));
        assert_eq!(hex(&[0xde, 0xad, 0x01]), "dead01");
    }

    #[test]
    fn truncated_and_absurd_notes_do_not_panic() {
        let blob = encode(b"GNU", NT_GNU_BUILD_ID, &[1; 20]);
        for n in 0..blob.len() {
            assert_eq!(gnu_build_id_in_blob(&blob[..n]), None, "cut at {n}");
        }
        assert_eq!(gnu_build_id_in_blob(&blob), Some(&[1; 20][..]));
        assert_eq!(iter(&[0xff; 12], native()).count(), 0);
        let mut huge = vec![0xff; 12];
        huge.extend_from_slice(&[0; 8]);
        assert_eq!(gnu_build_id_in_blob(&huge), None);
        // A GNU note of the wrong type or an over-long id is not a build id.
        assert_eq!(gnu_build_id_in_blob(&encode(b"GNU", 1, &[1; 20])), None);
        assert_eq!(gnu_build_id_in_blob(&encode(b"GNU", NT_GNU_BUILD_ID, &[1; 100])), None);
    }
}
