//! Where each node of a YAML file starts, by config path.
//!
//! serde_yaml's values carry no positions, so the file is walked once more
//! with yaml-rust2's marked events to record the line and column of every key.

use crate::error::Position;
use std::collections::HashMap;
use std::path::Path;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// Path (keys and sequence indices as strings) → position, over every loaded file.
#[derive(Clone, Debug, Default)]
pub struct Positions {
    map: HashMap<Vec<String>, Position>,
}

enum Frame {
    /// `pushed`: whether this node's own path segment sits on `path`.
    Map {
        key: Option<String>,
        pushed: bool,
    },
    Seq {
        index: usize,
        pushed: bool,
    },
}

struct Walker<'a> {
    file: &'a Path,
    stack: Vec<Frame>,
    path: Vec<String>,
    out: &'a mut HashMap<Vec<String>, Position>,
}

impl Walker<'_> {
    fn pos(&self, m: Marker) -> Position {
        Position { file: self.file.to_path_buf(), line: m.line(), column: m.col() + 1 }
    }

    /// A node begins: either it is a map key, or a value at the current path.
    /// Returns true when the node is a value (and the path was pushed).
    fn begin_node(&mut self, scalar: Option<&str>, m: Marker) -> bool {
        match self.stack.last_mut() {
            Some(Frame::Map { key, .. }) if key.is_none() => {
                let k = scalar.unwrap_or("?").to_owned();
                *key = Some(k.clone());
                self.path.push(k);
                let p = self.pos(m);
                self.out.insert(self.path.clone(), p);
                self.path.pop();
                false
            }
            Some(Frame::Map { key, .. }) => {
                let k = key.take().unwrap_or_default();
                self.path.push(k);
                true
            }
            Some(Frame::Seq { index, .. }) => {
                let i = *index;
                *index += 1;
                self.path.push(i.to_string());
                let p = self.pos(m);
                self.out.insert(self.path.clone(), p);
                true
            }
            None => {
                self.path.clear();
                false
            }
        }
    }
}

impl Walker<'_> {
    /// A scalar value ends where it begins.
    fn pop_if(&mut self, pushed: bool) {
        if pushed {
            self.path.pop();
        }
    }
}

impl MarkedEventReceiver for Walker<'_> {
    fn on_event(&mut self, ev: Event, m: Marker) {
        match ev {
            Event::Scalar(v, ..) => {
                let pushed = self.begin_node(Some(&v), m);
                self.pop_if(pushed);
            }
            Event::Alias(_) => {
                let pushed = self.begin_node(None, m);
                self.pop_if(pushed);
            }
            Event::MappingStart(..) => {
                let pushed = self.begin_node(None, m);
                self.stack.push(Frame::Map { key: None, pushed });
            }
            Event::SequenceStart(..) => {
                let pushed = self.begin_node(None, m);
                self.stack.push(Frame::Seq { index: 0, pushed });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                if let Some(Frame::Map { pushed: true, .. } | Frame::Seq { pushed: true, .. }) = self.stack.pop() {
                    self.path.pop();
                }
            }
            _ => {}
        }
    }
}

impl Positions {
    /// Records the positions of `text` (already known to parse) from `file`;
    /// later files override earlier ones, as their values do.
    pub(crate) fn add_file(&mut self, file: &Path, text: &str) {
        let mut w = Walker { file, stack: Vec::new(), path: Vec::new(), out: &mut self.map };
        let mut parser = Parser::new_from_str(text);
        // Syntax errors were reported by serde_yaml already.
        let _ = parser.load(&mut w, false);
    }

    /// Position of the deepest located prefix of `path`.
    pub fn locate<S: AsRef<str>>(&self, path: &[S]) -> Option<Position> {
        let mut key: Vec<String> = path.iter().map(|s| s.as_ref().to_owned()).collect();
        while !key.is_empty() {
            if let Some(p) = self.map.get(&key) {
                return Some(p.clone());
            }
            key.pop();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_items_are_located() {
        let text =
            "receivers:\n  file:\n    path: a\nservice:\n  pipelines:\n    profiles:\n      receivers: [file, x]\n";
        let mut p = Positions::default();
        p.add_file(Path::new("c.yaml"), text);
        let at = |path: &[&str]| p.locate(path).map(|p| (p.line, p.column));
        assert_eq!(at(&["receivers", "file", "path"]), Some((3, 5)));
        assert_eq!(at(&["service", "pipelines", "profiles"]), Some((6, 5)));
        assert_eq!(at(&["service", "pipelines", "profiles", "receivers", "1"]), Some((7, 25)));
        assert_eq!(at(&["receivers", "file", "nope"]), Some((2, 3)));
    }
}
