//! Where a sampled stack really ends.
//!
//! The kernel walks user stacks by frame pointers: from each frame it reads
//! the saved frame pointer and the return address above it, until it meets
//! an invalid frame pointer or the depth limit. Code built without frame
//! pointers (a stripped distribution binary, glibc, LLVM) uses `rbp` as an
//! ordinary register, so the walk goes on through whatever the register
//! held: the "return addresses" it then reports are 0, small integers,
//! heap or stack pointers, or random 64-bit values. And the outermost frame
//! of a process (`_start`'s) ends the chain with a saved return address of
//! 0. Such frames are not code; shown, they become `0x0` / `<unknown>`
//! frames that gather a good share of a process's time in every backend.
//!
//! A stack therefore ends before its first frame that cannot be a return
//! address: outside the range user code can live in, or (when the process's
//! executable mappings are known) outside every one of them. Frames after
//! that one came from the same broken walk and are cut too. The leaf, the
//! sampled instruction pointer itself, is real whenever it is a plausible
//! address, even when the mappings have not caught up with it yet.

use crate::ebpf::process::MappingSet;

/// Lowest address user code can be at: `vm.mmap_min_addr` is at least one
/// page, so nothing executable is ever mapped below it.
const MIN_USER_ADDR: u64 = 4096;
/// User addresses stay below this on every 64-bit architecture Linux runs
/// on (x86_64 with 5-level paging: 2^56; arm64 with 52-bit VAs: 2^52).
const USER_ADDR_LIMIT: u64 = 1 << 56;
/// Kernel text lives in the upper half of the address space.
const KERNEL_HALF: u64 = 1 << 63;

/// Whether `addr` can be a user-space code address at all.
fn plausible_user(addr: u64) -> bool {
    (MIN_USER_ADDR..USER_ADDR_LIMIT).contains(&addr)
}

/// How many leading frames of a user stack (leaf first) are real: the walk
/// is cut at its first frame that is no code address. `maps`, when the
/// process's mappings are known, must hold every caller frame.
pub(crate) fn user_frames(stack: &[u64], maps: Option<&MappingSet>) -> usize {
    let real_caller = |addr: u64| plausible_user(addr) && maps.is_none_or(|m| m.find(addr).is_some());
    match stack.split_first() {
        None => 0,
        Some((&leaf, _)) if !plausible_user(leaf) => 0,
        Some((_, callers)) => 1 + callers.iter().take_while(|&&a| real_caller(a)).count(),
    }
}

/// How many leading frames of a kernel stack (leaf first) are real: the
/// kernel's unwinder reports kernel text addresses only, so a frame outside
/// the kernel half (a 0 left in a buffer) ends it.
pub(crate) fn kernel_frames(stack: &[u64]) -> usize {
    stack.iter().take_while(|&&a| a >= KERNEL_HALF).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ebpf::process::procfs::parse_maps;
    use crate::ebpf::process::Mapping;
    use std::sync::Arc;

    fn maps(text: &str) -> MappingSet {
        let mappings = parse_maps(text)
            .into_iter()
            .map(|e| Mapping {
                start: e.start,
                end: e.end,
                file_offset: e.offset,
                path: Arc::from(e.path.as_str()),
                build_id: None,
                file_id: None,
            })
            .collect();
        MappingSet { generation: 1, mappings }
    }

    /// A user stack of a real `sha256sum` sample, as the BPF program
    /// recorded it (the bytes of its ring buffer record, and the process's
    /// /proc/PID/maps read at the time; see `recorded/`): the leaf in libc's
    /// `read`, then the 0 that ends the frame-pointer chain.
    #[test]
    fn a_recorded_stack_ending_in_zero_ends_at_its_last_real_frame() {
        let record = hex(include_str!("recorded/sha256sum_read.record.hex"));
        let sample = profcol_ebpf::Sample::parse(&record).expect("the recorded record decodes");
        assert_eq!(sample.comm(), "sha256sum");
        let user: Vec<u64> = sample.user_stack().collect();
        assert_eq!(user.last(), Some(&0), "the recorded walk ends in 0: {user:x?}");
        let m = maps(include_str!("recorded/sha256sum_read.maps"));
        let n = user_frames(&user, Some(&m));
        assert_eq!(n, user.len() - 1, "only the trailing 0 is cut: {user:x?}");
        assert!(user[..n].iter().all(|&a| m.find(a).is_some()), "every frame kept is in a mapping");
        let kernel: Vec<u64> = sample.kernel_stack().collect();
        assert!(!kernel.is_empty());
        assert_eq!(kernel_frames(&kernel), kernel.len(), "the kernel stack is whole: {kernel:x?}");
        // Without the mappings (a process already gone) the 0 still goes.
        assert_eq!(user_frames(&user, None), user.len() - 1);
    }

    fn hex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits.chunks_exact(2).map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap()).collect()
    }

    #[test]
    fn a_walk_through_code_without_frame_pointers_is_cut_at_its_first_non_code_frame() {
        let m = maps(
            "555555554000-555555556000 r-xp 00002000 08:01 42 /usr/bin/sha256sum\n\
             7ffff7dd0000-7ffff7f50000 r-xp 00028000 08:01 43 /usr/lib/x86_64-linux-gnu/libc.so.6\n",
        );
        let leaf = 0x5555_5555_4321;
        let libc = 0x7fff_f7e0_0000;
        // Random 64-bit values, a heap pointer, small integers: no code.
        for junk in [0x50ce_feea_3ae4_c6df, 0x5555_5577_0000, 0x1, 0x14_0000_0014, 0xffff_ffff_8100_0000] {
            assert_eq!(user_frames(&[leaf, libc, junk, libc], Some(&m)), 2, "{junk:#x}");
        }
        assert_eq!(user_frames(&[leaf, libc, libc], Some(&m)), 3);
        // The leaf is the sampled instruction: kept while plausible, even
        // outside the mappings read so far (code mapped since).
        assert_eq!(user_frames(&[0x6000_0000_0000, libc], Some(&m)), 2);
        assert_eq!(user_frames(&[0, libc], Some(&m)), 0);
        assert_eq!(user_frames(&[], Some(&m)), 0);
        // Unknown mappings: only the address range decides.
        assert_eq!(user_frames(&[leaf, 0x5555_5577_0000, 0x8000_0000_0000_0000, libc], None), 2);
        assert_eq!(kernel_frames(&[0xffff_ffff_8100_0000, 0xffff_ffff_8200_0000, 0, 0xffff_ffff_8100_0000]), 2);
        assert_eq!(kernel_frames(&[0]), 0);
    }
}
