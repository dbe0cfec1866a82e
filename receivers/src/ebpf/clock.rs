//! Kernel time → unix time, shared with kernel_symbols (see `profcol_ebpf::clock`).

pub use profcol_ebpf::clock::{now_ns, KtimeToUnix};
