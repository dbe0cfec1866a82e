//! The BPF maps of `ebpf/bpf/unwind.h` as a [`Sink`] / [`MappingSink`].

use super::store::Sink;
use super::MappingSink;
use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use profcol_ebpf::unwind::{mapping_key_data, mapping_value, page_key, page_value};
use profcol_elf::unwind::Rule;

/// The unwinder's maps, taken from the loaded object.
pub struct KernelMaps {
    pub rows: Array<MapData, u64>,
    pub pages: BpfHashMap<MapData, [u8; 8], [u8; 8]>,
    pub rules: Array<MapData, [u8; 8]>,
    pub mappings: LpmTrie<MapData, [u8; 12], [u8; 16]>,
}

fn trie_key(pid: u32, addr: u64, bits: u32) -> Key<[u8; 12]> {
    Key::new(32 + bits, mapping_key_data(pid, addr))
}

impl Sink for KernelMaps {
    fn write_rows(&mut self, at: u32, elems: &[u64]) -> Result<(), String> {
        for (i, e) in elems.iter().enumerate() {
            self.rows.set(at + i as u32, e, 0).map_err(|e| format!("unwind_rows: {e}"))?;
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
