//! The processor: opens the store at start, runs the listeners and the
//! reload task, and symbolizes each batch against lock-free generations.

use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use profcol_api::component::{ComponentError, Processor};
use profcol_api::Profiles;
use tokio::task::JoinHandle;

use super::config::Config;
use super::store::Store;
use super::{perf_ksymbol, reload, symbolize, uevent};

pub struct KernelSymbols {
    cfg: Config,
    store: OnceLock<Arc<Store>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl KernelSymbols {
    pub fn new(cfg: Config) -> Self {
        KernelSymbols { cfg, store: OnceLock::new(), tasks: Mutex::new(Vec::new()) }
    }

    /// The store, once started.
    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.get()
    }
}

#[async_trait]
impl Processor for KernelSymbols {
    async fn start(&self) -> Result<(), ComponentError> {
        let sc = self.cfg.store();
        let store = tokio::task::spawn_blocking(move || Store::open(sc))
            .await
            .map_err(|e| ComponentError::msg(format!("kernel_symbols: loading symbols panicked: {e}")))?
            .map_err(|e| ComponentError::msg(format!("kernel_symbols: {e}")))?;
        let store = Arc::new(store);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        if self.cfg.uevents {
            match uevent::spawn(tx.clone()) {
                Ok(t) => tasks.push(t),
                Err(e) => tracing::warn!(error = %e, "kernel_symbols: no module uevents"),
            }
        }
        if self.cfg.bpf {
            match perf_ksymbol::spawn(tx.clone()) {
                Ok(t) => tasks.extend(t),
                Err(e) => tracing::warn!(error = %e, "kernel_symbols: no PERF_RECORD_KSYMBOL"),
            }
        }
        drop(tx);
        tasks.push(reload::spawn(store.clone(), self.cfg.reload.clone(), rx));
        let _ = self.store.set(store);
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).extend(tasks);
        Ok(())
    }

    async fn process(&self, batch: Profiles) -> Result<Option<Profiles>, ComponentError> {
        let Some(store) = self.store.get() else {
            return Ok(Some(batch)); // not started: pass through untouched
        };
        let gens = store.generations().load();
        let (batch, outcome) = symbolize::symbolize(batch, &gens);
        if outcome.unresolved > 0 {
            tracing::debug!(?outcome, "kernel frames left unresolved");
        }
        Ok(Some(batch))
    }

    async fn shutdown(&self) -> Result<(), ComponentError> {
        for t in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            t.abort();
        }
        Ok(())
    }
}
