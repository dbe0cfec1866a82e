//! A unit's subprogram ranges and line sequences, from one walk over the
//! whole unit. A unit read a second time gets one: a profile keeps
//! sampling new addresses in units it sampled before, and each such
//! address otherwise streams the unit's DIEs and line program up to it
//! (up to a millisecond for a large Rust unit). With the map, it costs two
//! binary searches and one sequence's rows.
//!
//! The answers are the streaming ones ([`super::line_rows`],
//! [`super::subprograms`]): the first sequence in program order and the
//! first subprogram in DIE order holding the address, and the same edges
//! (exact here, since every span is known).

use gimli::UnitOffset;

use super::{Edges, LineFind, Reader, Row, SubprogramFind, UnitRef};

type Sequence = gimli::LineSequence<Reader>;

pub(super) struct UnitMap {
    /// (begin, end, DIE offset) of every subprogram range, by begin.
    subs: Box<[(u64, u64, u32)]>,
    /// The greatest end of `subs[..=i]`: ends a backwards scan.
    subs_reach: Box<[u64]>,
    program: Option<gimli::CompleteLineProgram<Reader>>,
    /// Non-empty sequences by start, each with its place in the program.
    seqs: Box<[(Sequence, u32)]>,
    seqs_reach: Box<[u64]>,
    bytes: usize,
}

/// The spans holding `p` (their indices) and the greatest end at or below
/// `p` of those that do not, scanning `spans` (by begin, `reach` their
/// running greatest end) backwards from the last that begins at or below
/// it; and the least begin above it.
fn around(
    p: u64,
    len: usize,
    span: impl Fn(usize) -> (u64, u64),
    reach: &[u64],
    holders: &mut Vec<usize>,
) -> (u64, u64) {
    holders.clear();
    let mut lo = 0;
    let mut hi = len;
    while lo < hi {
        let mid = (lo + hi) / 2;
        if span(mid).0 <= p {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let above = if lo < len { span(lo).0 } else { u64::MAX };
    let mut below = 0;
    let mut k = lo;
    // Nothing before k ends past `below`: no holder, no nearer edge.
    while k > 0 && reach[k - 1] > below {
        k -= 1;
        let (_, end) = span(k);
        if end > p {
            holders.push(k);
        } else {
            below = below.max(end);
        }
    }
    (below, above)
}

fn running_max(ends: impl Iterator<Item = u64>) -> Box<[u64]> {
    let mut max = 0;
    ends.map(|e| {
        max = max.max(e);
        max
    })
    .collect()
}

impl UnitMap {
    /// Walks all of `u`: its DIEs for subprogram ranges, its line program
    /// for sequences.
    pub(super) fn build(u: UnitRef<'_>) -> gimli::Result<Self> {
        let mut subs: Vec<(u64, u64, u32)> = Vec::new();
        super::subprogram_ranges(u, |die, begin, end| {
            if let Ok(die) = u32::try_from(die.0) {
                subs.push((begin, end, die));
            }
            true
        })?;
        subs.retain(|s| s.0 < s.1);
        // By begin, DIE order kept among equal begins.
        subs.sort_by_key(|s| s.0);
        let (program, mut seqs) = match u.line_program.clone() {
            Some(p) => {
                let (program, seqs) = p.sequences()?;
                let seqs: Vec<(Sequence, u32)> =
                    seqs.into_iter().zip(0u32..).filter(|(s, _)| s.start < s.end).collect();
                (Some(program), seqs)
            }
            None => (None, Vec::new()),
        };
        seqs.sort_by_key(|s| s.0.start);
        let subs_reach = running_max(subs.iter().map(|s| s.1));
        let seqs_reach = running_max(seqs.iter().map(|s| s.0.end));
        let header_bytes = program.as_ref().map_or(0, |p| {
            let h = p.header();
            std::mem::size_of_val(h.file_names()) + std::mem::size_of_val(h.include_directories())
        });
        let bytes = std::mem::size_of::<Self>()
            + subs.len() * (std::mem::size_of::<(u64, u64, u32)>() + 8)
            + seqs.len() * (std::mem::size_of::<(Sequence, u32)>() + 8)
            + header_bytes;
        Ok(UnitMap {
            subs: subs.into_boxed_slice(),
            subs_reach,
            program,
            seqs: seqs.into_boxed_slice(),
            seqs_reach,
            bytes,
        })
    }

    /// Estimated heap bytes.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// What [`super::subprograms`] finds for `probes`.
    pub(super) fn subprograms(&self, probes: &[u64]) -> SubprogramFind {
        let mut find = SubprogramFind { funcs: vec![None; probes.len()], edges: Edges::new(probes.len()) };
        let mut holders = Vec::new();
        for (i, &p) in probes.iter().enumerate() {
            let span = |k: usize| (self.subs[k].0, self.subs[k].1);
            let (below, above) = around(p, self.subs.len(), span, &self.subs_reach, &mut holders);
            (find.edges.below[i], find.edges.above[i]) = (below, above);
            // The first in DIE order.
            find.funcs[i] = holders
                .iter()
                .map(|&k| self.subs[k])
                .min_by_key(|s| s.2)
                .map(|(b, e, die)| (UnitOffset(die as usize), b, e));
        }
        find
    }

    /// What [`super::line_rows`] finds for `probes`: each probe's row from
    /// the first sequence (in program order) holding it that has one.
    pub(super) fn line_rows(&self, probes: &[u64]) -> gimli::Result<LineFind> {
        let mut find = LineFind {
            rows: vec![None; probes.len()],
            sequence: vec![None; probes.len()],
            held: Vec::new(),
            tangled: vec![false; probes.len()],
            edges: Edges::new(probes.len()),
        };
        let Some(program) = &self.program else {
            return Ok(find);
        };
        let mut holders = Vec::new();
        let mut run: Vec<Ran> = Vec::new();
        for (i, &p) in probes.iter().enumerate() {
            let span = |k: usize| (self.seqs[k].0.start, self.seqs[k].0.end);
            let (below, above) = around(p, self.seqs.len(), span, &self.seqs_reach, &mut holders);
            (find.edges.below[i], find.edges.above[i]) = (below, above);
            holders.sort_by_key(|&k| self.seqs[k].1);
            for &k in &holders {
                let at = match run.iter().position(|r| r.seq == k) {
                    Some(at) => at,
                    None => {
                        let (rows, growing) = sequence_rows(program, &self.seqs[k].0)?;
                        // A growing sequence answers each probe it holds:
                        // its rows go where the windows take them from.
                        let rows = if growing {
                            find.held.push(rows);
                            Rows::Held(find.held.len() - 1)
                        } else {
                            Rows::Tangled(rows)
                        };
                        run.push(Ran { seq: k, rows });
                        run.len() - 1
                    }
                };
                let seq = &self.seqs[k].0;
                let row = match &run[at].rows {
                    Rows::Held(h) => {
                        let rows = &find.held[*h];
                        let row = rows.partition_point(|r| r.0 <= p).checked_sub(1).map(|r| rows[r].1);
                        if row.is_some() {
                            find.sequence[i] = Some((seq.start, seq.end, *h));
                        }
                        row
                    }
                    Rows::Tangled(rows) => {
                        find.tangled[i] = true;
                        super::cover_unordered(rows, seq.end, p)
                    }
                };
                if row.is_some() {
                    find.rows[i] = row;
                    break;
                }
            }
        }
        Ok(find)
    }
}

/// A sequence run for one batch (its index in `seqs`) and its rows.
struct Ran {
    seq: usize,
    rows: Rows,
}

enum Rows {
    /// Addresses only grow: in `LineFind::held` at this index.
    Held(usize),
    /// Addresses go back and forth: no window is kept for them.
    Tangled(Vec<(u64, Row)>),
}

/// The rows of one sequence (one per address, the last of those at it)
/// and whether their addresses only grow.
fn sequence_rows(
    program: &gimli::CompleteLineProgram<Reader>,
    seq: &Sequence,
) -> gimli::Result<(Vec<(u64, Row)>, bool)> {
    let mut rows = program.resume_from(seq);
    let mut out: Vec<(u64, Row)> = Vec::new();
    let mut growing = true;
    while let Some((_, row)) = rows.next_row()? {
        if row.end_sequence() {
            break;
        }
        super::push_row(&mut out, &mut growing, row);
    }
    Ok((out, growing))
}
