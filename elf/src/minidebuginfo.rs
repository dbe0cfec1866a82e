//! MiniDebugInfo (`.gnu_debugdata`): an xz-compressed ELF file holding the
//! `.symtab` of the functions that `.dynsym` leaves out (Fedora and its
//! kin strip binaries to this), so a stripped binary still names its
//! static functions without a separate debug file.
//!
//! Decompressed with `xz4rust` (pure Rust, streaming): the dictionary is
//! capped at [`MAX_DICTIONARY`] and the output at the caller's limit, so a
//! decompression bomb is an error after that many bytes, not an OOM.

use std::io::Read;
use std::num::NonZeroUsize;

use crate::ElfFile;

/// Largest LZMA2 dictionary allocated (xz's presets use at most 64 MiB;
/// MiniDebugInfo is made with far less).
pub(crate) const MAX_DICTIONARY: usize = 64 << 20;

/// Why `.gnu_debugdata` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum MiniDebugInfoError {
    #[error(".gnu_debugdata is not a valid xz stream: {0}")]
    Xz(std::io::Error),
    #[error(".gnu_debugdata decompresses to more than {0} bytes (refused as a decompression bomb)")]
    TooLarge(usize),
    #[error(".gnu_debugdata does not hold an ELF file: {0}")]
    NotElf(crate::Error),
}

/// The xz stream `data` decompressed, at most `max` bytes.
pub(crate) fn decompress_xz(data: &[u8], max: usize) -> Result<Vec<u8>, MiniDebugInfoError> {
    let decoder = xz4rust::XzDecoder::in_heap_with_alloc_dict_size(64 << 10, MAX_DICTIONARY);
    let buffer = NonZeroUsize::new(64 << 10).expect("non-zero");
    // XzReader wants an owned `'static` reader; the section is small.
    let reader =
        xz4rust::XzReader::new_with_buffer_size_and_decoder(std::io::Cursor::new(data.to_vec()), buffer, decoder);
    let mut out = Vec::new();
    reader.take(max as u64 + 1).read_to_end(&mut out).map_err(MiniDebugInfoError::Xz)?;
    if out.len() > max {
        return Err(MiniDebugInfoError::TooLarge(max));
    }
    Ok(out)
}

impl ElfFile {
    /// The ELF file inside `.gnu_debugdata`, if the file has that section;
    /// its decompressed size is at most `max` bytes.
    pub fn mini_debug_info(&self, max: usize) -> Result<Option<ElfFile>, MiniDebugInfoError> {
        let Some(compressed) = self.section_bytes(".gnu_debugdata", max) else {
            return Ok(None);
        };
        let bytes = decompress_xz(&compressed, max)?;
        ElfFile::from_vec(bytes).map(Some).map_err(MiniDebugInfoError::NotElf)
    }
}
