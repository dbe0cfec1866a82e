//! The BPF maps of `ebpf/bpf/unwind.h` as a [`Sink`] / [`FileSink`].

use super::store::Sink;
use super::FileSink;
use aya::maps::{Array, HashMap as BpfHashMap, IterableMap, MapData};
use profcol_ebpf::unwind::{
    file_key, file_value, page_key, page_value, parse_file_key, FileSegment, KernelFile, Want, CHUNK_ELEMS,
    FILE_KEY_BYTES, FILE_VALUE_BYTES, WANT_BYTES,
};
use profcol_elf::unwind::Rule;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// `unwind_rows`: an array of maps whose chunks ([`CHUNK_ELEMS`] elements,
/// `BPF_F_MMAPABLE`) are created when a table first needs them and dropped
/// when the store frees their last table, each mapped into this process: a
/// table's rows are copied in with plain stores. A table's page entries
/// are written (by syscall) only after its rows, so the BPF program never
/// finds a page whose rows are not there yet.
pub(crate) struct RowChunks {
    outer: MapData,
    chunks: Vec<Option<Chunk>>,
}

/// One inner array, mapped read-write.
struct Chunk {
    mapped: profcol_ebpf::sys::MappedU64s,
    /// Keeps the inner map (and so the mapping's object) alive.
    _fd: OwnedFd,
}

impl Chunk {
    fn new(index: usize) -> std::io::Result<Self> {
        let fd = profcol_ebpf::sys::array_create_mmapable(&format!("unwind_rows{index}"), CHUNK_ELEMS)?;
        let mapped = profcol_ebpf::sys::MappedU64s::new(fd.as_fd(), CHUNK_ELEMS as usize)?;
        Ok(Chunk { mapped, _fd: fd })
    }
}

impl RowChunks {
    /// The outer array `map` of `slots` chunks, all empty.
    pub(crate) fn new(outer: MapData, slots: u32) -> Self {
        RowChunks { outer, chunks: (0..slots).map(|_| None).collect() }
    }

    /// Chunk `index`, created and put in the outer array if it is not yet.
    fn chunk(&mut self, index: usize) -> Result<&Chunk, String> {
        let slots = self.chunks.len();
        let slot = self.chunks.get_mut(index).ok_or_else(|| format!("unwind_rows: chunk {index} of {slots}"))?;
        if slot.is_none() {
            let chunk = Chunk::new(index).map_err(|e| format!("unwind_rows: creating chunk {index}: {e}"))?;
            let fd = chunk._fd.as_raw_fd() as u32;
            profcol_ebpf::sys::map_update(self.outer.fd().as_fd(), &(index as u32), &fd)
                .map_err(|e| format!("unwind_rows: inserting chunk {index}: {e}"))?;
            *slot = Some(chunk);
        }
        Ok(slot.as_ref().expect("just filled"))
    }
}

/// The unwinder's maps, taken from the loaded object.
pub(crate) struct KernelMaps {
    pub rows: RowChunks,
    pub pages: BpfHashMap<MapData, [u8; 8], [u8; 8]>,
    pub rules: Array<MapData, [u8; 8]>,
    pub files: BpfHashMap<MapData, [u8; FILE_KEY_BYTES], [u8; FILE_VALUE_BYTES]>,
    pub wanted: BpfHashMap<MapData, [u8; FILE_KEY_BYTES], [u8; WANT_BYTES]>,
}

impl Sink for KernelMaps {
    fn write_rows(&mut self, at: u32, elems: &[u64]) -> Result<(), String> {
        let (index, offset) = ((at / CHUNK_ELEMS) as usize, (at % CHUNK_ELEMS) as usize);
        if offset + elems.len() > CHUNK_ELEMS as usize {
            return Err(format!("unwind_rows: {} elements at {at} straddle a chunk", elems.len()));
        }
        let chunk = self.rows.chunk(index)?;
        // SAFETY: in bounds (checked above) of the live mapping, which
        // nothing in this process aliases.
        unsafe { std::ptr::copy_nonoverlapping(elems.as_ptr(), chunk.mapped.as_mut_ptr().add(offset), elems.len()) };
        Ok(())
    }

    fn release_chunk(&mut self, index: u32) {
        // The outer slot first: a program that looked the chunk up before
        // keeps it alive until it returns (the kernel frees inner maps
        // after an RCU grace period); its pages are gone already.
        let _ = profcol_ebpf::sys::map_delete(self.rows.outer.fd().as_fd(), &index);
        if let Some(slot) = self.rows.chunks.get_mut(index as usize) {
            *slot = None;
        }
    }

    fn set_page(&mut self, table: u32, page: u32, first: u32, count: u32) -> Result<(), String> {
        self.pages
            .insert(&page_key(table, page), &page_value(first, count), 0)
            .map_err(|e| format!("unwind_pages: {e}"))
    }

    fn remove_page(&mut self, table: u32, page: u32) {
        let _ = self.pages.remove(&page_key(table, page));
    }

    fn set_pages(&mut self, table: u32, pages: &[(u32, u32, u32)]) -> Result<(), String> {
        let keys: Vec<[u8; 8]> = pages.iter().map(|&(page, _, _)| page_key(table, page)).collect();
        let values: Vec<[u8; 8]> = pages.iter().map(|&(_, first, count)| page_value(first, count)).collect();
        profcol_ebpf::sys::map_update_batch(self.pages.map().fd().as_fd(), &keys, &values)
            .map_err(|e| format!("unwind_pages: {e}"))
    }

    fn remove_pages(&mut self, table: u32, pages: &[u32]) {
        let keys: Vec<[u8; 8]> = pages.iter().map(|&page| page_key(table, page)).collect();
        // A page already gone (a partial load) stops the batch: the rest
        // one by one.
        if profcol_ebpf::sys::map_delete_batch(self.pages.map().fd().as_fd(), &keys).is_err() {
            for k in &keys {
                let _ = self.pages.remove(k);
            }
        }
    }

    fn set_rule(&mut self, id: u32, rule: Rule) -> Result<(), String> {
        self.rules.set(id, &rule.to_bytes(), 0).map_err(|e| format!("unwind_rules: {e}"))
    }
}

impl FileSink for KernelMaps {
    fn set_file(&mut self, file: KernelFile, table: u32, segs: &[FileSegment]) -> Result<(), String> {
        self.files.insert(&file_key(file), &file_value(table, segs), 0).map_err(|e| format!("unwind_files: {e}"))
    }

    fn remove_files(&mut self, files: &[KernelFile]) {
        let keys: Vec<[u8; FILE_KEY_BYTES]> = files.iter().map(|&f| file_key(f)).collect();
        // A key already gone stops the batch: the rest one by one.
        if profcol_ebpf::sys::map_delete_batch(self.files.map().fd().as_fd(), &keys).is_err() {
            for k in &keys {
                let _ = self.files.remove(k);
            }
        }
    }

    fn wanted(&mut self, out: &mut Vec<(KernelFile, Want)>) {
        // Few entries (files met without a table); an entry deleted while
        // iterating only ends the walk early.
        for (k, v) in self.wanted.iter().flatten() {
            out.push((parse_file_key(&k), Want::parse(&v)));
        }
    }

    fn remove_wanted(&mut self, files: &[KernelFile]) {
        for &f in files {
            let _ = self.wanted.remove(&file_key(f));
        }
    }
}
