//! Where the kernel's own text lies, `[_text, _etext)`, for counting in
//! the kernel: a stack whose kernel frames all lie there is named alike
//! whenever it was taken (BPF programs, modules and trampolines lie
//! outside), so its samples may be counted without their times.
//!
//! Read cheaply at start: `_text` from the first lines of /proc/kallsyms
//! (the file is ~5 MB and costs the kernel ~35 ms to print whole; its
//! head is generated alone), the text's length from /proc/iomem's
//! "Kernel code" resource, which spans `_text` to `_etext` in physical
//! addresses. Both show zeros without privilege: then there is no range
//! and only samples with no kernel frames are counted.

use std::io::Read;

/// `[start, end)` of the kernel's own text, or `None` (unreadable, zeros,
/// or inconsistent).
pub(crate) fn read() -> Option<(u64, u64)> {
    let mut head = [0u8; 8192];
    let n = read_head("/proc/kallsyms", &mut head)?;
    let start = text_start(std::str::from_utf8(head.get(..n)?).ok()?)?;
    let iomem = std::fs::read_to_string("/proc/iomem").ok()?;
    let len = code_len(&iomem)?;
    Some((start, start.checked_add(len)?))
}

fn read_head(path: &str, buf: &mut [u8]) -> Option<usize> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(_) => return None,
        }
    }
    Some(n)
}

/// The address of `_text` (or `_stext`) among the complete lines of a
/// kallsyms head; `None` when absent or zero (addresses hidden).
pub(crate) fn text_start(head: &str) -> Option<u64> {
    let complete = &head[..head.rfind('\n').map_or(0, |i| i + 1)];
    let mut stext = None;
    for line in complete.lines() {
        let mut f = line.split_ascii_whitespace();
        let (Some(addr), Some(_kind), Some(name)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let addr = u64::from_str_radix(addr, 16).ok()?;
        match name {
            "_text" => return (addr != 0).then_some(addr),
            "_stext" => stext = Some(addr),
            _ => {}
        }
    }
    stext.filter(|&a| a != 0)
}

/// Length of the "Kernel code" resource of /proc/iomem (`_etext - _text`);
/// `None` when absent or shown as zeros.
pub(crate) fn code_len(iomem: &str) -> Option<u64> {
    let line = iomem.lines().find(|l| l.trim_end().ends_with(": Kernel code"))?;
    let range = line.trim_start().split(' ').next()?;
    let (a, b) = range.split_once('-')?;
    let (a, b) = (u64::from_str_radix(a, 16).ok()?, u64::from_str_radix(b, 16).ok()?);
    (b > a).then(|| b - a + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "0000000000000000 A fixed_percpu_data\n\
                        ffffffff81000000 T _stext\n\
                        ffffffff81000000 T _text\n\
                        ffffffff81000010 T __entry_text_start\n\
                        ffffffff81000040 T entry_SYSCALL_64\n\
                        ffffffff810000";

    const IOMEM: &str = "00000000-00000fff : Reserved\n\
                         00100000-bffd9fff : System RAM\n  \
                         01000000-0220bb07 : Kernel code\n  \
                         02400000-02e09fff : Kernel rodata\n";

    #[test]
    fn text_range_from_kallsyms_head_and_iomem() {
        assert_eq!(text_start(HEAD), Some(0xffff_ffff_8100_0000));
        assert_eq!(code_len(IOMEM), Some(0x120_bb08));
    }

    #[test]
    fn hidden_or_missing_values_give_no_range() {
        // Without privilege both files show zeros.
        let hidden = HEAD.replace("ffffffff81000000", "0000000000000000");
        assert_eq!(text_start(&hidden), None);
        let iomem = "00000000-00000000 : System RAM\n  00000000-00000000 : Kernel code\n";
        assert_eq!(code_len(iomem), None);
        assert_eq!(code_len("00100000-bffd9fff : System RAM\n"), None);
        assert_eq!(text_start("ffffffff81000000 T _te"), None, "a cut line is not read");
        assert_eq!(text_start("zz T _text\n"), None);
        // Only _stext: taken.
        assert_eq!(text_start("ffffffff81000000 T _stext\n"), Some(0xffff_ffff_8100_0000));
    }

    #[test]
    fn this_hosts_range_matches_kallsyms_when_visible() {
        // As root on the test machines: the cheap read must equal the
        // symbols themselves (read whole here, once).
        let Ok(all) = std::fs::read_to_string("/proc/kallsyms") else { return };
        let addr = |name: &str| {
            all.lines().find_map(|l| {
                let mut f = l.split_ascii_whitespace();
                let a = f.next()?;
                f.next()?;
                (f.next()? == name).then(|| u64::from_str_radix(a, 16).ok()).flatten()
            })
        };
        match (addr("_text"), addr("_etext")) {
            (Some(t), Some(e)) if t != 0 => assert_eq!(read(), Some((t, e))),
            _ => assert_eq!(read(), None, "addresses hidden: no range"),
        }
    }
}
