//! The synthetic report the receiver's and the node agent's per-report
//! benches share (receivers/benches/aggregate.rs,
//! collector/benches/node_pipeline.rs): a process mapping dash and libc,
//! and a deterministic generator for its stacks.

use profcol_ebpf::UnwindEnd;
use profcol_receivers::ebpf::process::{Mapping, MappingSet};
use profcol_receivers::ebpf::stacks::aggregate::{SampleIn, SampleProfile};
use std::sync::Arc;

/// A small deterministic generator (xorshift), so every run sees the same stacks.
pub(super) struct Rng(pub u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A shell's mappings: dash at 0x5555_0000_0000, libc at 0x7f00_0000_0000.
pub(super) fn dash_and_libc() -> Arc<MappingSet> {
    Arc::new(MappingSet {
        generation: 1,
        mappings: vec![
            Mapping {
                start: 0x5555_0000_0000,
                end: 0x5555_0010_0000,
                file_offset: 0,
                path: "/usr/bin/dash".into(),
                build_id: Some("0123456789abcdef0123456789abcdef01234567".into()),
                file_id: None,
            },
            Mapping {
                start: 0x7f00_0000_0000,
                end: 0x7f00_0020_0000,
                file_offset: 0x28000,
                path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
                build_id: Some("fedcba9876543210fedcba9876543210fedcba98".into()),
                file_id: None,
            },
        ],
    })
}

/// 15 user frames of stack `i`: the leaf its own, the callers drawn from
/// 32 places per depth, alternating between dash and libc.
pub(super) fn user_stack(rng: &mut Rng, i: u64) -> Vec<u64> {
    (0..15u64)
        .map(|d| {
            let base = if d % 2 == 0 { 0x5555_0000_1000 } else { 0x7f00_0000_1000 };
            base + if d == 0 { i * 2 } else { (rng.next() % 32) * 16 + d * 0x800 }
        })
        .collect()
}

/// An on-CPU sample of `dash` (pid = tid = `pid`) with these stacks.
pub(super) fn dash_sample<'a>(pid: u32, kstack: &'a [u64], ustack: &'a [u64]) -> SampleIn<'a> {
    SampleIn {
        profile: SampleProfile::Cpu,
        pid,
        tid: pid,
        cpu: 0,
        comm: *b"dash\0\0\0\0\0\0\0\0\0\0\0\0",
        unix_ns: 1,
        kstack,
        ustack,
        unwind_end: UnwindEnd::Outermost,
        interp_end: profcol_ebpf::python::WalkEnd::None,
    }
}
