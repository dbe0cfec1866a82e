//! Which binaries a probe is for: `binary:` as a path, a base name or a glob.
//!
//! A pattern with a `/` is matched against the whole path (as the process
//! sees it, in its mount namespace), one without against the base name.
//! Globs know `*` (any run, `/` included, so `*/libssl.so.*` matches at
//! any depth), `?` and `[...]` / `[!...]` classes with ranges.

/// A parsed `binary:` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BinaryPattern {
    pattern: Vec<Token>,
    whole_path: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Byte(u8),
    Any,
    AnyRun,
    Class { negated: bool, ranges: Vec<(u8, u8)> },
}

impl BinaryPattern {
    /// Parses a pattern; the error says what is wrong with it.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("empty; give a path, a base name or a glob".into());
        }
        let b = s.as_bytes();
        let mut pattern = Vec::new();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'*' => {
                    if pattern.last() != Some(&Token::AnyRun) {
                        pattern.push(Token::AnyRun);
                    }
                }
                b'?' => pattern.push(Token::Any),
                b'[' => {
                    let start = i;
                    i += 1;
                    let negated = matches!(b.get(i), Some(b'!' | b'^'));
                    if negated {
                        i += 1;
                    }
                    let mut ranges = Vec::new();
                    let mut first = true;
                    loop {
                        let Some(&c) = b.get(i) else {
                            return Err(format!("{s:?}: the class opened at byte {start} is not closed with ']'"));
                        };
                        if c == b']' && !first {
                            break;
                        }
                        first = false;
                        if b.get(i + 1) == Some(&b'-') && b.get(i + 2).is_some_and(|&e| e != b']') {
                            ranges.push((c, b[i + 2]));
                            i += 3;
                        } else {
                            ranges.push((c, c));
                            i += 1;
                        }
                    }
                    pattern.push(Token::Class { negated, ranges });
                }
                c => pattern.push(Token::Byte(c)),
            }
            i += 1;
        }
        Ok(BinaryPattern { pattern, whole_path: s.contains('/') })
    }

    /// Whether `path` (absolute, as in /proc/PID/maps) is one of ours.
    pub(crate) fn matches(&self, path: &str) -> bool {
        let subject = if self.whole_path { path } else { path.rsplit('/').next().unwrap_or(path) };
        glob(&self.pattern, subject.as_bytes())
    }
}

/// Iterative glob match with one backtrack point (the last `*`).
fn glob(p: &[Token], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        let step = match p.get(pi) {
            Some(Token::AnyRun) => {
                star = Some((pi, si));
                pi += 1;
                continue;
            }
            Some(Token::Any) => true,
            Some(Token::Byte(c)) => *c == s[si],
            Some(Token::Class { negated, ranges }) => {
                ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&s[si])) != *negated
            }
            None => false,
        };
        if step {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|t| *t == Token::AnyRun)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, path: &str) -> bool {
        BinaryPattern::parse(p).unwrap().matches(path)
    }

    #[test]
    fn paths_base_names_and_globs() {
        assert!(m("libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(!m("libc.so.6", "/usr/lib/libc.so.60"));
        assert!(!m("libc.so", "/usr/lib/libc.so.6"));
        assert!(m("/usr/bin/python3", "/usr/bin/python3"));
        assert!(!m("/usr/bin/python3", "/opt/usr/bin/python3"));
        assert!(m("python3*", "/usr/bin/python3.11"));
        assert!(m("*/libssl.so.*", "/usr/lib/x86_64-linux-gnu/libssl.so.3"));
        assert!(!m("*/libssl.so.*", "/usr/lib/libssl.so"));
        assert!(m("lib?.so", "/x/liba.so"));
        assert!(m("lib[a-c].so", "/x/libb.so"));
        assert!(!m("lib[!a-c].so", "/x/libb.so"));
        assert!(m("lib[]x].so", "/x/lib].so"));
        assert!(m("*", "/anything"));
        assert!(m("a*b*c", "/d/aXXbYYc"));
        assert!(!m("a*b*c", "/d/aXXbYY"));
    }

    #[test]
    fn bad_patterns_say_why() {
        assert!(BinaryPattern::parse("").unwrap_err().contains("empty"));
        assert!(BinaryPattern::parse("lib[c.so").unwrap_err().contains("not closed"));
        assert!(BinaryPattern::parse("[").is_err());
    }
}
