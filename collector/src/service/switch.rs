//! Starting the parts of a new graph that face the outside (extensions,
//! then receivers) in place of the old graph's, make before break.
//!
//! A new instance starts while the one it replaces still runs, so a new
//! instance that cannot start leaves the old one serving. New receivers'
//! `Next`s are pending: what they send waits until every part started (then
//! it is delivered) or one failed (then it is refused), so a rolled-back
//! receiver never delivers into exporters the running graph shares. Only when the two
//! name a common exclusive resource (a TCP port, the CPU sampler) does the
//! old one stop just before; if anything then fails, every new instance
//! started so far stops and every old one stopped for it starts again.

use super::{berr, BuildError};
use profcol_api::component::{ComponentId, Extension, Kind, Next, Receiver};
use profcol_api::ComponentError;
use std::sync::Arc;
use tracing::{error, info, warn};

/// An extension or a receiver (with the `Next` it sends into).
#[derive(Clone)]
pub(super) enum Live {
    Extension(Arc<dyn Extension>),
    Receiver(Arc<dyn Receiver>, Next),
}

impl Live {
    fn kind(&self) -> Kind {
        match self {
            Live::Extension(_) => Kind::Extension,
            Live::Receiver(..) => Kind::Receiver,
        }
    }

    async fn start(&self) -> Result<(), ComponentError> {
        match self {
            Live::Extension(x) => x.start().await,
            Live::Receiver(r, next) => r.start(next.clone()).await,
        }
    }

    async fn shutdown(&self) {
        let r = match self {
            Live::Extension(x) => x.shutdown().await,
            Live::Receiver(r, _) => r.shutdown().await,
        };
        if let Err(e) = r {
            warn!(kind = %self.kind(), error = %e, "shutdown failed");
        }
    }

    fn exclusive_resources(&self) -> Vec<String> {
        match self {
            Live::Extension(x) => x.exclusive_resources(),
            Live::Receiver(r, _) => r.exclusive_resources(),
        }
    }
}

/// One part, named.
pub(super) type Part = (ComponentId, Live);

/// Starts `fresh` in order, stopping first whatever of `replaced` holds an
/// exclusive resource a fresh part needs. Returns the replaced parts it
/// stopped (the caller stops the rest once the new graph is live). On
/// failure everything is as it was — fresh parts stopped, replaced ones
/// running again — unless one of those could not start again: the `bool`
/// says whether all did.
pub(super) async fn start_in_place_of(
    fresh: &[Part],
    replaced: &[Part],
) -> Result<Vec<ComponentId>, (BuildError, bool)> {
    let mut stopped: Vec<&Part> = Vec::new();
    let mut started: Vec<&Part> = Vec::new();
    let mut failure = None;
    for part in fresh {
        let (id, live) = part;
        let wants = live.exclusive_resources();
        for old in replaced {
            let holds = old.1.exclusive_resources();
            if stopped.iter().any(|s| std::ptr::eq(*s, old)) || !holds.iter().any(|x| wants.contains(x)) {
                continue;
            }
            info!(kind = %old.1.kind(), id = %old.0, "stopping the previous instance first: it holds what the new one needs");
            old.1.shutdown().await;
            stopped.push(old);
        }
        match live.start().await {
            Ok(()) => {
                match live {
                    Live::Receiver(..) => info!(receiver = %id, "started"),
                    Live::Extension(_) => info!(extension = %id, "started"),
                }
                started.push(part);
            }
            Err(e) => {
                failure = Some(berr(live.kind(), id, e));
                break;
            }
        }
    }
    let Some(err) = failure else {
        // The new graph is live: its receivers deliver.
        for (_, live) in fresh {
            if let Live::Receiver(_, next) = live {
                next.open();
            }
        }
        return Ok(stopped.iter().map(|(id, _)| id.clone()).collect());
    };
    // Nothing the new receivers produced (nor flush on shutdown) goes anywhere.
    for (_, live) in fresh {
        if let Live::Receiver(_, next) = live {
            next.close();
        }
    }
    for (_, live) in started.iter().rev() {
        live.shutdown().await;
    }
    let mut restored = true;
    for (id, live) in stopped {
        match live.start().await {
            Ok(()) => info!(kind = %live.kind(), id = %id, "the previous instance is running again"),
            Err(e) => {
                restored = false;
                error!(kind = %live.kind(), id = %id, error = %e,
                    "the previous instance could not start again; it is gone until a reload succeeds");
            }
        }
    }
    Err((err, restored))
}
