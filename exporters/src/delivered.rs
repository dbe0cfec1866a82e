//! The reports an exporter delivered lately, so that the host's retry of a
//! batch sends only what did not go out; used by `pprof`, `flamegraph` and
//! the OTLP balancer (for the parts of a split batch).

/// Reports delivered lately, by a hash of their content, so that the host's
/// retry of a batch whose export failed part-way (group 3 of 5, say) does not
/// write or push the groups that already went out a second time. A report's
/// bytes are a deterministic function of its batch and group, so the same
/// content means the same report; bounded to the last [`Delivered::CAPACITY`].
#[derive(Default)]
pub(crate) struct Delivered(std::sync::Mutex<(std::collections::VecDeque<u64>, std::collections::HashSet<u64>)>);

impl Delivered {
    pub(crate) const CAPACITY: usize = 4096;

    /// The key of a report: its group and content (in parts, so content
    /// spread over many buffers needs no joined copy).
    pub(crate) fn key<'a>(group: &str, content: impl IntoIterator<Item = &'a [u8]>) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        group.hash(&mut h);
        for part in content {
            part.hash(&mut h);
        }
        h.finish()
    }

    pub(crate) fn contains(&self, key: u64) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).1.contains(&key)
    }

    pub(crate) fn insert(&self, key: u64) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (order, set) = &mut *g;
        if set.insert(key) {
            order.push_back(key);
            if order.len() > Self::CAPACITY {
                if let Some(old) = order.pop_front() {
                    set.remove(&old);
                }
            }
        }
    }
}
