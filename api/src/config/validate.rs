//! The one check a decoded config goes through, for `profcol validate`, for
//! the start and for every reload alike.

use super::ConfigError;

/// What a config struct checks about itself beyond its types: everything
/// knowable without side effects (durations that must be positive, keys that
/// exclude each other, endpoints that parse, files that exist and parse,
/// directories that are writable, sizes within bounds). Nothing is created,
/// bound or started here; see [`super::checks`] for the common checks.
///
/// Configs with nothing to check implement it empty: `impl Validate for C {}`.
pub trait Validate {
    fn validate(&self, problems: &mut Problems) {
        let _ = problems;
    }
}

/// The problems found in one section, each at its dotted path inside it.
#[derive(Debug, Default)]
pub struct Problems {
    prefix: String,
    errors: Vec<ConfigError>,
}

impl Problems {
    pub fn new() -> Self {
        Problems::default()
    }

    /// Records a problem at `path` (dotted, relative to the struct being
    /// checked; empty for the struct itself). Say what to do in `message`.
    pub fn add(&mut self, path: &str, message: impl Into<String>) {
        let path = match (self.prefix.is_empty(), path.is_empty()) {
            (true, _) => path.to_owned(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}.{path}", self.prefix),
        };
        self.errors.push(ConfigError { path, message: message.into() });
    }

    /// Records `result`'s error, if any, at `path`.
    pub fn check(&mut self, path: &str, result: Result<(), String>) {
        if let Err(m) = result {
            self.add(path, m);
        }
    }

    /// Checks a nested struct: its problems are placed under `path`.
    pub fn within(&mut self, path: &str, check: impl FnOnce(&mut Problems)) {
        let saved = self.prefix.clone();
        if !path.is_empty() {
            self.prefix = if saved.is_empty() { path.to_owned() } else { format!("{saved}.{path}") };
        }
        check(self);
        self.prefix = saved;
    }

    /// Runs a nested struct's own [`Validate`] under `path`.
    pub fn nested(&mut self, path: &str, inner: &dyn Validate) {
        self.within(path, |p| inner.validate(p));
    }

    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    pub fn into_errors(self) -> Vec<ConfigError> {
        self.errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Inner(u32);
    impl Validate for Inner {
        fn validate(&self, p: &mut Problems) {
            if self.0 == 0 {
                p.add("size", "must be above 0");
            }
        }
    }

    #[test]
    fn nested_problems_carry_their_full_path() {
        let mut p = Problems::new();
        p.nested("a", &Inner(0));
        p.within("b", |p| p.nested("c", &Inner(0)));
        p.nested("d", &Inner(1));
        p.check("", Err("whole".into()));
        let paths: Vec<_> = p.into_errors().into_iter().map(|e| e.path).collect();
        assert_eq!(paths, ["a.size", "b.c.size", ""]);
    }
}
