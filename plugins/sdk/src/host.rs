//! What the host offers a plugin: its log and its counters.
//!
//! In a wasm build these call the host (`profcol:plugin/host`): log lines go
//! to profcol's log labelled with the plugin's component id (rate-limited),
//! counters to `profcol_plugin_counter_total{component, name}`. In a native
//! build (the test harness) they are recorded for the test to read.

/// A log line's level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// Writes `message` to profcol's log.
pub fn log(level: Level, message: &str) {
    imp::log(level, message)
}

/// Adds `value` to the plugin's counter `name`.
pub fn counter_add(name: &str, value: u64) {
    imp::counter_add(name, value)
}

pub fn info(message: &str) {
    log(Level::Info, message)
}

pub fn warn(message: &str) {
    log(Level::Warn, message)
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::Level;
    use crate::guest::host as h;

    pub fn log(level: Level, message: &str) {
        let level = match level {
            Level::Trace => h::Level::Trace,
            Level::Debug => h::Level::Debug,
            Level::Info => h::Level::Info,
            Level::Warn => h::Level::Warn,
            Level::Error => h::Level::Error,
        };
        h::log(level, message)
    }

    pub fn counter_add(name: &str, value: u64) {
        h::counter_add(name, value)
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use super::Level;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    thread_local! {
        pub(crate) static RECORDED: RefCell<Recorded> = RefCell::default();
    }

    /// What a plugin told the host, in a native run.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Recorded {
        pub logs: Vec<(Level, String)>,
        pub counters: BTreeMap<String, u64>,
    }

    pub fn log(level: Level, message: &str) {
        RECORDED.with(|r| r.borrow_mut().logs.push((level, message.to_owned())))
    }

    pub fn counter_add(name: &str, value: u64) {
        RECORDED.with(|r| {
            let mut r = r.borrow_mut();
            let n = r.counters.entry(name.to_owned()).or_default();
            *n = n.saturating_add(value);
        })
    }

    /// Takes what was recorded on this thread so far.
    pub fn take() -> Recorded {
        RECORDED.with(|r| std::mem::take(&mut *r.borrow_mut()))
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use imp::take as take_recorded;
#[cfg(not(target_arch = "wasm32"))]
pub use imp::Recorded;
