//! Component ids (`type[/name]`) and kinds: what every other part names a
//! component by, kept apart so that telemetry and components can both use them.

use std::fmt;
use std::str::FromStr;

/// What a component is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Receiver,
    Processor,
    Exporter,
    Extension,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Receiver => "receiver",
            Kind::Processor => "processor",
            Kind::Exporter => "exporter",
            Kind::Extension => "extension",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// A component id, `type[/name]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ComponentId {
    ty: String,
    name: String,
}

/// Why a string is not a valid `type[/name]` id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("invalid id {0:?}: the type must match ^[a-z][a-z0-9_]*$ (e.g. \"otlp\" or \"otlp/backend\")")]
    BadType(String),
    #[error("invalid id {0:?}: the name after '/' must not be empty")]
    EmptyName(String),
}

pub(crate) fn is_valid_type(t: &str) -> bool {
    let mut c = t.chars();
    matches!(c.next(), Some('a'..='z')) && c.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}

impl ComponentId {
    pub fn new(ty: &str, name: &str) -> Result<Self, IdError> {
        if !is_valid_type(ty) {
            return Err(IdError::BadType(format!("{ty}/{name}").trim_end_matches('/').to_owned()));
        }
        Ok(ComponentId { ty: ty.to_owned(), name: name.to_owned() })
    }
    pub fn type_name(&self) -> &str {
        &self.ty
    }
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl FromStr for ComponentId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        match s.split_once('/') {
            None => ComponentId::new(s, ""),
            Some((_, "")) => Err(IdError::EmptyName(s.to_owned())),
            Some((t, n)) => ComponentId::new(t, n).map_err(|_| IdError::BadType(s.to_owned())),
        }
    }
}

impl fmt::Display for ComponentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name.is_empty() {
            f.write_str(&self.ty)
        } else {
            write!(f, "{}/{}", self.ty, self.name)
        }
    }
}
