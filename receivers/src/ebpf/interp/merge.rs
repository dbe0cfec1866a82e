//! Where interpreter frames go in a native stack: each group of frames one
//! call of the interpreter's eval function ran takes that call's place, so
//! a stack reads from `main` through Python into C and the kernel.

/// One interpreter frame, named: its stack word, and whether it is the
/// outermost frame of its eval call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Named {
    pub word: u64,
    pub entry: bool,
}

/// Writes into `out` the native stack `native` (leaf first) with each
/// frame in an eval call (`in_eval`) replaced by the interpreter frames
/// that call ran (`interp`, leaf first, up to and including the next entry
/// frame). Interpreter frames left when the native frames run out (a native
/// walk cut short) go at the root end; an eval frame with no interpreter
/// frame left stays as it is.
pub(crate) fn merge(native: &[u64], interp: &[Named], in_eval: impl Fn(u64) -> bool, out: &mut Vec<u64>) {
    out.clear();
    out.reserve(native.len() + interp.len());
    let mut rest = interp;
    for (i, &pc) in native.iter().enumerate() {
        // A return address may be just past its call: look up the call.
        let at = if i == 0 { pc } else { pc.saturating_sub(1) };
        if rest.is_empty() || !in_eval(at) {
            out.push(pc);
            continue;
        }
        let n = rest.iter().position(|f| f.entry).map_or(rest.len(), |i| i + 1);
        out.extend(rest[..n].iter().map(|f| f.word));
        rest = &rest[n..];
    }
    out.extend(rest.iter().map(|f| f.word));
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVAL: (u64, u64) = (0x1000, 0x2000);

    fn in_eval(pc: u64) -> bool {
        (EVAL.0..EVAL.1).contains(&pc)
    }

    fn py(word: u64, entry: bool) -> Named {
        Named { word, entry }
    }

    #[test]
    fn groups_replace_their_eval_calls() {
        // leaf: C extension 0x9000, eval (runs c, b), PyObject_Call 0x5000,
        // eval (runs a), main 0x400.
        let native = [0x9000, 0x1500, 0x5000, 0x1800, 0x400];
        let interp = [py(0xc, false), py(0xb, true), py(0xa, true)];
        let mut out = Vec::new();
        merge(&native, &interp, in_eval, &mut out);
        assert_eq!(out, vec![0x9000, 0xc, 0xb, 0x5000, 0xa, 0x400]);
    }

    #[test]
    fn leftovers_go_to_the_root_and_eval_frames_without_frames_stay() {
        let mut out = Vec::new();
        merge(&[0x1500], &[py(0xb, true), py(0xa, true)], in_eval, &mut out);
        assert_eq!(out, vec![0xb, 0xa], "a native walk cut after the first eval call");
        merge(&[0x1500, 0x1600, 0x400], &[py(0xa, true)], in_eval, &mut out);
        assert_eq!(out, vec![0xa, 0x1600, 0x400]);
        merge(&[0x1500, 0x400], &[], in_eval, &mut out);
        assert_eq!(out, vec![0x1500, 0x400], "no interpreter frames: the native stack");
    }

    #[test]
    fn a_return_address_just_past_the_eval_function_is_not_in_it() {
        let mut out = Vec::new();
        // 0x2000 as a caller's return address: the call is at 0x1fff, in eval.
        merge(&[0x9000, 0x2000], &[py(0xa, true)], in_eval, &mut out);
        assert_eq!(out, vec![0x9000, 0xa]);
        // As the leaf, 0x2000 is the next function.
        merge(&[0x2000], &[py(0xa, true)], in_eval, &mut out);
        assert_eq!(out, vec![0x2000, 0xa]);
    }
}
