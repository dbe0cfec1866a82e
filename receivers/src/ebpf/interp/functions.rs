//! Interpreter functions met so far, each (name, file) once, and the stack
//! word that names one: a stack holds interpreter frames as words beside
//! native addresses, so stacks stay `u64` slices (hashed, counted and
//! compared as before) and a frame is named once, when its record is read.

use rustc_hash::FxHashMap;
use std::sync::Arc;

/// The top 16 bits of an interpreter frame's stack word: a non-canonical
/// address, so no native frame (user below 2^47, kernel from
/// 0xffff8000_00000000) is ever taken for one.
const TAG: u64 = 0x00ff << 48;
const TAG_MASK: u64 = 0xffff << 48;
/// Lines above this are kept as this.
const MAX_LINE: u32 = (1 << 24) - 1;
/// Functions kept at most (a word has 24 bits for one); new ones beyond
/// share [`FunctionTable::FULL`].
pub(crate) const MAX_FUNCTIONS: usize = 1 << 18;

/// The stack word of function `func` at `line`.
pub(crate) fn word(func: u32, line: u32) -> u64 {
    TAG | (u64::from(func & 0xff_ffff) << 24) | u64::from(line.min(MAX_LINE))
}

/// (function, line) of an interpreter frame's stack word; `None` for a
/// native address.
pub(crate) fn decode(w: u64) -> Option<(u32, u32)> {
    (w & TAG_MASK == TAG).then(|| (((w >> 24) & 0xff_ffff) as u32, (w & u64::from(MAX_LINE)) as u32))
}

/// One interpreter function.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Function {
    pub name: Arc<str>,
    pub file: Arc<str>,
    /// `profile.frame.type` of its frames (`cpython`).
    pub frame_type: &'static str,
}

/// Functions by id, each once; bounded by [`MAX_FUNCTIONS`].
pub struct FunctionTable {
    ids: FxHashMap<Function, u32>,
    all: Vec<Function>,
    /// Functions not kept because the table was full.
    pub overflow: u64,
}

impl FunctionTable {
    /// The id every function beyond [`MAX_FUNCTIONS`] gets.
    pub(crate) const FULL: u32 = 0;

    pub(crate) fn new() -> Self {
        let full = Function {
            name: Arc::from("[interpreter function table full]"),
            file: Arc::from(""),
            frame_type: "cpython",
        };
        let mut ids = FxHashMap::default();
        ids.insert(full.clone(), Self::FULL);
        FunctionTable { ids, all: vec![full], overflow: 0 }
    }

    /// The id of `f`, made on first use.
    pub(crate) fn id(&mut self, f: Function) -> u32 {
        if let Some(&id) = self.ids.get(&f) {
            return id;
        }
        if self.all.len() >= MAX_FUNCTIONS {
            self.overflow += 1;
            return Self::FULL;
        }
        let id = self.all.len() as u32;
        self.ids.insert(f.clone(), id);
        self.all.push(f);
        id
    }

    pub(crate) fn get(&self, id: u32) -> Option<&Function> {
        self.all.get(id as usize)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.all.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_never_look_like_addresses() {
        let w = word(1234, 56);
        assert_eq!(decode(w), Some((1234, 56)));
        assert_eq!(decode(word(7, u32::MAX)), Some((7, MAX_LINE)));
        assert_eq!(decode(0x7fff_ffff_f000), None, "a user address");
        assert_eq!(decode(0xffff_ffff_8100_0001), None, "a kernel address");
        assert_eq!(decode(word(MAX_FUNCTIONS as u32, 0)), Some((MAX_FUNCTIONS as u32, 0)));
    }

    #[test]
    fn functions_are_interned_and_bounded() {
        let mut t = FunctionTable::new();
        let f = |n: &str| Function { name: Arc::from(n), file: Arc::from("/app/x.py"), frame_type: "cpython" };
        let a = t.id(f("a"));
        assert_eq!(t.id(f("a")), a);
        assert_ne!(t.id(f("b")), a);
        assert_eq!(t.get(a).unwrap().name.as_ref(), "a");
        for i in 0..MAX_FUNCTIONS {
            t.id(f(&i.to_string()));
        }
        assert_eq!(t.len(), MAX_FUNCTIONS);
        assert_eq!(t.id(f("one too many")), FunctionTable::FULL);
        assert!(t.overflow >= 1);
    }
}
