//! Config errors: what went wrong, where (file:line:column and config path), what to do.

use std::fmt;
use std::path::PathBuf;

/// Where in which file a config node starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Position {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)
    }
}

/// One problem in the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Where the YAML gives one (the deepest located node of `path`).
    pub position: Option<Position>,
    /// Config path, e.g. `service::pipelines::profiles`; empty for file-level errors.
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = &self.position {
            write!(f, "{p}: ")?;
        }
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found, reported together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        writeln!(f, "invalid configuration ({n} error{}):", if n == 1 { "" } else { "s" })?;
        for e in &self.0 {
            writeln!(f, "  {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Renders a path as the OTel Collector does: `service::pipelines::profiles`.
pub(crate) fn render_path<S: AsRef<str>>(path: &[S]) -> String {
    path.iter().map(|s| s.as_ref()).collect::<Vec<_>>().join("::")
}
