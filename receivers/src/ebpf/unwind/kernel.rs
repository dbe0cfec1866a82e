//! The BPF maps of `ebpf/bpf/unwind.h` as a [`Sink`] / [`MappingSink`].

use super::store::Sink;
use super::MappingSink;
use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, HashMap as BpfHashMap, IterableMap, MapData};
use profcol_ebpf::unwind::{mapping_key_data, mapping_value, page_key, page_value};
use profcol_elf::unwind::Rule;
use std::os::fd::AsFd;

/// Row-array elements per `BPF_MAP_UPDATE_BATCH` (the key scratch is this
/// many `u32`s).
const ROWS_PER_BATCH: usize = 16 * 1024;

/// The unwinder's maps, taken from the loaded object.
pub struct KernelMaps {
    pub rows: Array<MapData, u64>,
    pub pages: BpfHashMap<MapData, [u8; 8], [u8; 8]>,
    pub rules: Array<MapData, [u8; 8]>,
    pub mappings: LpmTrie<MapData, [u8; 12], [u8; 16]>,
    /// Indexes of one batch of rows (reused).
    pub row_keys: Vec<u32>,
}

fn trie_key(pid: u32, addr: u64, bits: u32) -> Key<[u8; 12]> {
    Key::new(32 + bits, mapping_key_data(pid, addr))
}

impl Sink for KernelMaps {
    /// One syscall per [`ROWS_PER_BATCH`] elements: a table of a large
    /// binary is hundreds of thousands of them.
    fn write_rows(&mut self, at: u32, elems: &[u64]) -> Result<(), String> {
        let fd = self.rows.map().fd().as_fd();
        for (n, chunk) in elems.chunks(ROWS_PER_BATCH).enumerate() {
            let first = at + (n * ROWS_PER_BATCH) as u32;
            self.row_keys.clear();
            self.row_keys.extend((0..chunk.len() as u32).map(|i| first + i));
            profcol_ebpf::sys::map_update_batch(fd, &self.row_keys, chunk).map_err(|e| format!("unwind_rows: {e}"))?;
        }
        Ok(())
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

impl MappingSink for KernelMaps {
    fn set_mapping(&mut self, pid: u32, addr: u64, bits: u32, table: u32, bias: u64) -> Result<(), String> {
        self.mappings
            .insert(&trie_key(pid, addr, bits), &mapping_value(table, bias), 0)
            .map_err(|e| format!("unwind_mappings: {e}"))
    }

    fn remove_mapping(&mut self, pid: u32, addr: u64, bits: u32) {
        let _ = self.mappings.remove(&trie_key(pid, addr, bits));
    }
}
