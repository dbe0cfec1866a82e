//! Folded stacks, the text `flamegraph.pl` and inferno read: one
//! `comm;root;...;leaf count` line per distinct stack.
//!
//! Kernel frames get the `_[k]` suffix that `perf script | stackcollapse-perf`
//! uses, so flame graph palettes tell them apart; unsymbolized frames show as
//! `mapping+0xoffset` (the offset in the mapping's file: `sha256sum+0x3a2d`). The `flamegraph` exporter and the `folded_exporter`
//! example plugin both fold through [`Folder`], so their text is the same.

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use rustc_hash::FxHashMap;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// Location attribute that marks a frame's kind (`kernel`, `native`, ...).
pub const FRAME_TYPE_KEY: &str = "profile.frame.type";
/// Filename of the mapping that holds kernel (vmlinux) frames.
pub const KERNEL_MAPPING: &str = "[kernel.kallsyms]";
/// Attributes whose value roots every stack (the first that is set): the
/// thread's name, else the executable's.
pub(crate) const COMM_KEYS: [&str; 2] = ["thread.name", "process.executable.name"];
/// The line of a sample whose stack has no frame.
pub(crate) const NO_STACK: &str = "[no stack]";

/// Most bytes of folded-stack text one batch builds. A distinct stack costs
/// its depth × its names' length, from a few bytes per sample on the wire;
/// past the budget a stack folds to [`OVER_BUDGET`], so its samples still count.
pub const MAX_FOLDED_BYTES: usize = 64 << 20;
/// The one frame a stack past [`MAX_FOLDED_BYTES`] is drawn as.
pub const OVER_BUDGET: &str = "[stack_past_the_flame_graph_size_budget]";

/// What folding needs to know of one frame (a location of a stack).
pub trait Frame {
    /// The innermost non-empty function name, if the frame is symbolized.
    fn function_name(&self) -> Option<&str>;
    /// The filename of the frame's mapping ("" without one).
    fn mapping_filename(&self) -> &str;
    fn address(&self) -> u64;
    /// The address as an offset in the mapping's file: see [`offset_in_file`].
    fn file_offset(&self) -> Option<u64>;
    /// The frame's [`FRAME_TYPE_KEY`] attribute, when it is a string.
    fn frame_type(&self) -> Option<&str>;
}

/// Appends `name` as one folded frame: `;` separates frames and whitespace
/// the count (a line break would split the line), so they are replaced.
pub(crate) fn push_name(out: &mut String, name: &str) {
    out.extend(name.chars().map(|c| match c {
        ';' => ':',
        c if c.is_whitespace() || c.is_control() => '_',
        c => c,
    }));
}

/// Where `address` lies in the file of a mapping that places
/// `[memory_start, memory_limit)` at `file_offset` (the offset `objdump`,
/// `addr2line -e FILE` and a stripped binary's readers use), or `None`
/// when the mapping does not hold it (the kernel's, without a range).
pub fn offset_in_file(address: u64, memory_start: u64, memory_limit: u64, file_offset: u64) -> Option<u64> {
    (memory_start..memory_limit).contains(&address).then(|| address - memory_start + file_offset)
}

/// Appends the folded name of `f`: its function name, else
/// `mapping-basename+0xoffset` (the offset in the mapping's file when the
/// mapping places the frame, else the address), else `0xaddress` without a
/// mapping; `_[k]` after a kernel frame.
pub(crate) fn push_frame(out: &mut String, f: &impl Frame) {
    let mapping = f.mapping_filename();
    match f.function_name() {
        Some(n) => push_name(out, n),
        None => {
            let base = mapping.rsplit('/').next().unwrap_or("");
            if base.is_empty() {
                out.push_str(&format!("0x{:x}", f.address()));
            } else {
                push_name(out, base);
                out.push_str(&format!("+0x{:x}", f.file_offset().unwrap_or(f.address())));
            }
        }
    }
    if f.frame_type() == Some("kernel") || mapping == KERNEL_MAPPING {
        out.push_str("_[k]");
    }
}

/// What one sample adds to its line: the sum of its values (negative ones
/// count 0), or without values the number of its timestamps, at least 1.
pub fn sample_count(values: &[i64], timestamps: usize) -> u64 {
    if values.is_empty() {
        return timestamps.max(1) as u64;
    }
    values.iter().fold(0u64, |a, &v| a.saturating_add(v.max(0) as u64))
}

/// An attribute value as text: strings as they are, numbers and booleans
/// printed; anything else (bytes, lists, maps, string-table references) has none.
pub fn value_text(v: &AnyValue) -> Option<Cow<'_, str>> {
    match v.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(Cow::Borrowed(s)),
        any_value::Value::IntValue(i) => Some(Cow::Owned(i.to_string())),
        any_value::Value::BoolValue(b) => Some(Cow::Owned(b.to_string())),
        any_value::Value::DoubleValue(d) => Some(Cow::Owned(d.to_string())),
        _ => None,
    }
}

/// Attribute `key` of a sample (the first with that key, given as resolved
/// `(key, value)` pairs), else of its resource, when it reads as text.
pub fn attribute<'a, I>(sample_attributes: I, resource: Option<&'a Resource>, key: &str) -> Option<&'a AnyValue>
where
    I: IntoIterator<Item = (&'a str, Option<&'a AnyValue>)>,
{
    let readable = |v: &&AnyValue| value_text(v).is_some();
    sample_attributes.into_iter().find(|(k, _)| *k == key).and_then(|(_, v)| v).filter(readable).or_else(|| {
        resource.and_then(|r| r.attributes.iter().find(|kv| kv.key == key)?.value.as_ref()).filter(readable)
    })
}

/// The name that roots a sample's stack: the first of [`COMM_KEYS`] set on
/// the sample or its resource.
pub fn comm<'a, I>(sample_attributes: impl Fn() -> I, resource: Option<&'a Resource>) -> Option<Cow<'a, str>>
where
    I: IntoIterator<Item = (&'a str, Option<&'a AnyValue>)>,
{
    COMM_KEYS.iter().find_map(|k| attribute(sample_attributes(), resource, k)).and_then(value_text)
}

/// Folds samples into lines per group, each distinct stack folded once (not
/// once per sample), all the text within [`MAX_FOLDED_BYTES`].
pub struct Folder<G> {
    budget: usize,
    /// Stack index → its frames root first, or None when over budget.
    stacks: FxHashMap<i32, Option<String>>,
    /// (group, comm, stack index) → count; lines are made once per key in `finish`.
    counts: BTreeMap<(G, Option<String>, i32), u64>,
}

impl<G: Ord> Default for Folder<G> {
    fn default() -> Self {
        Folder { budget: MAX_FOLDED_BYTES, stacks: FxHashMap::default(), counts: BTreeMap::new() }
    }
}

impl<G: Ord> Folder<G> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `count` to the line of stack `stack_index` under `group`, rooted
    /// at `comm`. `frames` (leaf first) is read only the first time the
    /// stack is seen.
    pub fn add<F: Frame, I: Iterator<Item = F>>(
        &mut self,
        group: G,
        stack_index: i32,
        frames: impl FnOnce() -> I,
        comm: Option<&str>,
        count: u64,
    ) {
        let budget = &mut self.budget;
        self.stacks.entry(stack_index).or_insert_with(|| {
            let folded = stack_frames(frames(), *budget);
            *budget = budget.saturating_sub(folded.as_ref().map_or(0, String::len));
            folded
        });
        let comm = comm.map(|c| {
            let mut s = String::with_capacity(c.len());
            push_name(&mut s, c);
            s
        });
        let n = self.counts.entry((group, comm, stack_index)).or_default();
        *n = n.saturating_add(count);
    }

    /// The lines of every group: `comm;root;...;leaf → count`.
    pub fn finish(self) -> BTreeMap<G, BTreeMap<String, u64>> {
        let mut budget = self.budget;
        let mut out: BTreeMap<G, BTreeMap<String, u64>> = BTreeMap::new();
        for ((group, comm, stack), count) in self.counts {
            let frames = match self.stacks.get(&stack) {
                Some(Some(f)) if !f.is_empty() => f.as_str(),
                Some(Some(_)) => NO_STACK,
                _ => OVER_BUDGET,
            };
            let need = frames.len() + comm.as_ref().map_or(0, |c| c.len() + 1);
            let line = match comm {
                _ if need > budget => OVER_BUDGET.to_owned(),
                Some(c) => format!("{c};{frames}"),
                None => frames.to_owned(),
            };
            budget = budget.saturating_sub(line.len());
            let n = out.entry(group).or_default().entry(line).or_default();
            *n = n.saturating_add(count);
        }
        out
    }
}

/// The frames of a stack (given leaf first) root first, `;`-joined; `None`
/// when they would take more than `budget` bytes.
fn stack_frames<F: Frame>(frames: impl Iterator<Item = F>, budget: usize) -> Option<String> {
    let mut names: Vec<String> = Vec::new();
    let mut len = 0usize;
    for f in frames {
        let mut name = String::new();
        push_frame(&mut name, &f);
        len += name.len() + 1;
        if len > budget {
            return None;
        }
        names.push(name);
    }
    names.reverse();
    Some(names.join(";"))
}

/// The folded text of one group: `stack count` lines in order, each ending in
/// a line break.
pub fn text(lines: &BTreeMap<String, u64>) -> String {
    let mut out = String::new();
    for (stack, count) in lines {
        out.push_str(stack);
        out.push(' ');
        out.push_str(&count.to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    struct F(Option<&'static str>, &'static str, u64, Option<&'static str>);
    /// Where test frames' user mappings sit: [0x5000, 0x9000) from file offset 0x2000.
    const MAPPED: (u64, u64, u64) = (0x5000, 0x9000, 0x2000);
    impl Frame for F {
        fn file_offset(&self) -> Option<u64> {
            let (start, limit, offset) = MAPPED;
            offset_in_file(self.2, start, limit, offset)
        }
        fn function_name(&self) -> Option<&str> {
            self.0
        }
        fn mapping_filename(&self) -> &str {
            self.1
        }
        fn address(&self) -> u64 {
            self.2
        }
        fn frame_type(&self) -> Option<&str> {
            self.3
        }
    }

    fn name(f: F) -> String {
        let mut s = String::new();
        push_frame(&mut s, &f);
        s
    }

    #[test]
    fn frames_are_named_like_stackcollapse() {
        assert_eq!(name(F(Some("a b;c\n"), "/bin/x", 1, None)), "a_b:c_");
        // Unnamed frames of a stripped binary: the offset in its file.
        assert_eq!(name(F(None, "/usr/bin/sha256sum", 0x5a2d, None)), "sha256sum+0x2a2d");
        // Outside the mapping's range (or a mapping without one): the address.
        assert_eq!(name(F(None, "/usr/lib/libc.so.6", 0x1f, None)), "libc.so.6+0x1f");
        assert_eq!(
            name(F(None, KERNEL_MAPPING, 0xffff_ffff_8100_0130, None)),
            "[kernel.kallsyms]+0xffffffff81000130_[k]"
        );
        // No mapping: the address alone, never `unknown`.
        assert_eq!(name(F(None, "", 0x7f00_0010, None)), "0x7f000010");
        assert_eq!(name(F(Some("do_sys"), KERNEL_MAPPING, 0, None)), "do_sys_[k]");
        assert_eq!(name(F(None, "", 0xff, Some("kernel"))), "0xff_[k]");
    }

    #[test]
    fn counts_sum_values_else_timestamps() {
        assert_eq!(sample_count(&[3, -2, 4], 3), 7);
        assert_eq!(sample_count(&[], 5), 5);
        assert_eq!(sample_count(&[], 0), 1);
    }

    #[test]
    fn one_line_per_distinct_stack_and_comm() {
        let mut f = Folder::new();
        let stack = || vec![F(Some("leaf"), "", 0, None), F(Some("main"), "", 0, None)].into_iter();
        f.add((), 1, stack, Some("my app"), 2);
        f.add(
            (),
            1,
            || -> std::vec::IntoIter<F> { unreachable!("a stack seen before is not read again") },
            Some("my app"),
            3,
        );
        f.add((), 2, || Vec::<F>::new().into_iter(), None, 1);
        let out = f.finish();
        assert_eq!(text(&out[&()]), "[no stack] 1\nmy_app;main;leaf 5\n");
    }
}
