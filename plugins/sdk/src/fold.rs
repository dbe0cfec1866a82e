//! Folded stacks of a batch, by the rules the `flamegraph` exporter uses
//! (`profcol_model_rules::folded`), so a plugin's folded text and the
//! exporter's are the same for the same batch.

use crate::Batch;
use profcol_model_rules::folded;
use std::collections::BTreeMap;

impl Batch {
    /// `comm;root;...;leaf → count` for the whole batch, as the `flamegraph`
    /// exporter folds it with `group_by: none`; `root_comm` puts the thread
    /// (else executable) name at the root, as its default does. Write it
    /// with [`folded::text`].
    pub fn folded(&self, root_comm: bool) -> BTreeMap<String, u64> {
        let mut folder = folded::Folder::new();
        for s in self.samples() {
            let comm = if root_comm { folded::comm(|| s.raw_attributes(), s.resource) } else { None };
            let count = folded::sample_count(&s.raw.values, s.raw.timestamps_unix_nano.len());
            folder.add((), s.raw.stack_index, || s.frames(), comm.as_deref(), count);
        }
        folder.finish().remove(&()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use crate::harness::cpu_batch;

    #[test]
    fn folds_the_fixture() {
        let text = crate::folded::text(&cpu_batch().folded(true));
        assert_eq!(
            text,
            "app-worker;main;app::work 1\n\
             app-worker;main;app::work;alloc::vec::Vec<T>::push 2\n\
             app;main;app::work;__memcpy_avx_unaligned;do_syscall_64_[k];ksys_write_[k] 1\n\
             app;main;app::work;alloc::vec::Vec<T>::push;__memcpy_avx_unaligned 1\n\
             app;main;libssl.so.3+0x3f2a0 1\n\
             python3;[no stack] 1\n\
             python3;main;do_syscall_64_[k] 1\n"
        );
    }
}
