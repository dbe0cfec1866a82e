//! Every built-in factory, by kind and type name: the only place that knows
//! all component crates.

use profcol_api::component::{Factory, Kind};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Clone)]
pub struct Registry {
    factories: BTreeMap<(Kind, &'static str), Arc<dyn Factory>>,
}

impl Registry {
    pub fn builtin(host: &crate::extensions::HostStatus) -> Self {
        let mut r = Registry { factories: BTreeMap::new() };
        let all = profcol_receivers::factories()
            .into_iter()
            .chain(profcol_processors::factories())
            .chain(profcol_exporters::factories())
            .chain(profcol_plugins::factories())
            .chain(crate::extensions::factories(host));
        for f in all {
            let m = f.meta();
            r.factories.insert((m.kind, m.type_name), f);
        }
        r
    }

    /// Adds (or replaces) a factory: for embedding hosts and tests that bring
    /// their own components.
    pub fn with(mut self, f: Arc<dyn Factory>) -> Self {
        let m = f.meta();
        self.factories.insert((m.kind, m.type_name), f);
        self
    }

    pub fn get(&self, kind: Kind, type_name: &str) -> Option<&Arc<dyn Factory>> {
        self.factories.iter().find(|((k, t), _)| *k == kind && *t == type_name).map(|(_, f)| f)
    }

    /// Type names of one kind, for "did you mean" lists.
    pub fn types(&self, kind: Kind) -> Vec<&'static str> {
        self.factories.keys().filter(|(k, _)| *k == kind).map(|(_, t)| *t).collect()
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn Factory>> {
        self.factories.values()
    }
}
