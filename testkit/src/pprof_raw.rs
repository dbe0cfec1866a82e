//! Profiles written as pprof files, read the way Go reads them: `go tool
//! pprof -raw` (an independent reader), parsed into stacks per pid.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One frame: function name, file and line; the mapping's file for native
/// and kernel frames.
#[derive(Clone, Debug)]
pub struct Frame {
    pub name: String,
    pub file: String,
    pub line: u64,
    pub mapping: String,
    /// The location's address as an offset in its mapping's file (the
    /// frames of one location's inlined functions share it); `None`
    /// without a mapping.
    pub file_offset: Option<u64>,
}

impl Frame {
    /// The base name of its mapping's file.
    pub fn mapping_base(&self) -> &str {
        self.mapping.rsplit('/').next().unwrap_or("")
    }
}

/// A stack, leaf first, and how many samples it had.
pub struct Stack {
    pub count: u64,
    /// The sampled thread (`tid` label; 0 where there is none).
    pub tid: u32,
    pub frames: Vec<Frame>,
    /// Every label, text and numeric alike, as `-raw` prints it (`state`
    /// → `sleeping`, `wakeup` → `4`).
    pub labels: BTreeMap<String, String>,
}

impl Stack {
    /// Label `key`, if the sample has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// Profcol's stacks per pid, from every pprof file in `dir`, read with
/// `go tool pprof -raw`.
pub fn profcol_stacks(dir: &Path) -> (BTreeMap<u32, Vec<Stack>>, usize) {
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    files.retain(|p| p.to_string_lossy().ends_with(".pb.gz"));
    let mut by_pid: BTreeMap<u32, Vec<Stack>> = BTreeMap::new();
    for file in &files {
        for (pid, stack) in read_raw(file) {
            by_pid.entry(pid).or_default().push(stack);
        }
    }
    (by_pid, files.len())
}

/// Samples (pid, stack) of one pprof file, read with `go tool pprof -raw`.
pub fn read_raw(file: &Path) -> Vec<(u32, Stack)> {
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw", "-symbolize=none"])
        .arg(file)
        .output()
        .expect("go tool pprof");
    assert!(out.status.success(), "go tool pprof -raw {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    parse_raw(&String::from_utf8_lossy(&out.stdout))
}

/// Samples (pid, stack) of one `go tool pprof -raw` text.
pub fn parse_raw(text: &str) -> Vec<(u32, Stack)> {
    // (count, pid, tid, location ids, labels) per sample.
    type Row = (u64, u32, u32, Vec<u64>, BTreeMap<String, String>);
    let mut samples: Vec<Row> = Vec::new();
    // Location id → (mapping id, address, its (name, file, line)s,
    // innermost first).
    type Lines = Vec<(String, String, u64)>;
    let mut locations: HashMap<u64, (u64, u64, Lines)> = HashMap::new();
    // Mapping id → (file, start, file offset).
    let mut mappings: HashMap<u64, (String, u64, u64)> = HashMap::new();
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let (mut section, mut skip_header, mut last_location) = ("", false, None);
    for line in text.lines() {
        match line {
            "Samples:" => {
                (section, skip_header) = ("samples", true);
                continue;
            }
            "Locations" | "Mappings" => {
                section = if line == "Locations" { "locations" } else { "mappings" };
                continue;
            }
            _ => {}
        }
        match section {
            "samples" if skip_header => skip_header = false,
            "samples" => {
                if let Some((values, locs)) = line.split_once(": ").filter(|(v, _)| !v.trim().contains(':')) {
                    let count = values.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0);
                    let ids = locs.split_whitespace().filter_map(|l| l.parse().ok()).collect();
                    samples.push((count, 0, 0, ids, BTreeMap::new()));
                } else if let Some(s) = samples.last_mut() {
                    // "key:[value]" tokens (values of one key space-separated).
                    for token in line.split_whitespace() {
                        if let Some((k, v)) = token.split_once(":[") {
                            s.4.insert(k.to_owned(), v.trim_end_matches(']').to_owned());
                        }
                    }
                    let label = |key: &str| {
                        let at = line.find(key)? + key.len();
                        line[at..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().ok()
                    };
                    if let Some(pid) = label("pid:[") {
                        s.1 = pid;
                    }
                    if let Some(tid) = label("tid:[") {
                        s.2 = tid;
                    }
                }
            }
            "locations" => {
                // "ID: 0xADDR [M=N ][[F] ]NAME FILE:LINE[:COL] s=N[(SYSTEM)]",
                // then one indented line per inlined caller.
                let t = line.trim_start();
                let rest = match t.split_once(": 0x").and_then(|(id, r)| Some((id.parse::<u64>().ok()?, r))) {
                    Some((id, r)) => {
                        let (address, r) = r.split_once(' ').unwrap_or((r, ""));
                        let (mapping, r) = match r.strip_prefix("M=") {
                            Some(m) => {
                                let (m, r) = m.split_once(' ').unwrap_or((m, ""));
                                (m.parse().unwrap_or(0), r)
                            }
                            None => (0, r),
                        };
                        locations.insert(id, (mapping, hex(address).unwrap_or(0), Vec::new()));
                        last_location = Some(id);
                        r.strip_prefix("[F] ").unwrap_or(r)
                    }
                    None => t,
                };
                let Some(id) = last_location else { continue };
                if let Some(l) = parse_location_line(rest) {
                    locations.get_mut(&id).unwrap().2.push(l);
                }
            }
            "mappings" => {
                let Some((id, rest)) = line.split_once(": ") else { continue };
                let Ok(id) = id.trim().parse::<u64>() else { continue };
                // "0xSTART/0xLIMIT/0xOFFSET FILE BUILDID"
                let mut fields = rest.split_whitespace();
                let range: Vec<u64> = fields.next().unwrap_or("").split('/').filter_map(hex).collect();
                let file = fields.next().unwrap_or("").to_owned();
                if let [start, _limit, offset] = range[..] {
                    mappings.insert(id, (file, start, offset));
                }
            }
            _ => {}
        }
    }
    samples
        .into_iter()
        .map(|(count, pid, tid, ids, labels)| {
            let mut frames = Vec::new();
            for id in ids {
                let Some((mapping, address, lines)) = locations.get(&id) else { continue };
                let (mapping, file_offset) = match mappings.get(mapping) {
                    Some((file, start, offset)) => {
                        (file.clone(), Some(address.wrapping_sub(*start).wrapping_add(*offset)))
                    }
                    None => (String::new(), None),
                };
                if lines.is_empty() {
                    frames.push(Frame { name: String::new(), file: String::new(), line: 0, mapping, file_offset });
                    continue;
                }
                // Innermost (leaf-most) inlined function first, as pprof lists them.
                for (name, file, line) in lines {
                    frames.push(Frame {
                        name: name.clone(),
                        file: file.clone(),
                        line: *line,
                        mapping: mapping.clone(),
                        file_offset,
                    });
                }
            }
            (pid, Stack { count, tid, frames, labels })
        })
        .collect()
}

/// (name, file, line) of "NAME FILE:LINE[:COL] s=N[(SYSTEM)]".
pub fn parse_location_line(text: &str) -> Option<(String, String, u64)> {
    let (text, _) = text.rsplit_once(" s=")?;
    // Names may hold spaces (`<T as Trait>::f`), files rarely: the file is
    // the last word, or a `<pseudo file>` (`<frozen runpy>`) whole.
    let file_start = {
        let no_line = text.trim_end_matches(|c: char| c.is_ascii_digit() || c == ':');
        match no_line.ends_with('>').then(|| no_line.rfind(" <")).flatten() {
            Some(at) => at,
            None => text.rfind(' ')?,
        }
    };
    let (name, file_line) = (&text[..file_start], &text[file_start + 1..]);
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let parts: Vec<&str> = file_line.rsplitn(3, ':').collect();
    let (file, line) = match parts[..] {
        [col, line, file] if numeric(col) && numeric(line) => (file.to_owned(), line),
        [line, ..] if numeric(line) => (file_line[..file_line.len() - line.len() - 1].to_owned(), line),
        _ => (file_line.to_owned(), "0"),
    };
    Some((name.to_owned(), file, line.parse().unwrap_or(0)))
}
