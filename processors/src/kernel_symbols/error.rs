//! Errors of the kernel_symbols processor, written for the person who reads them.

use std::path::PathBuf;

/// What can go wrong while loading or refreshing kernel symbols.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read kernel symbols from {path}: {source}; check the `kallsyms` path in the kernel_symbols config and that the collector runs as root (non-root readers see zero addresses)")]
    ReadKallsyms {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} lists no usable kernel text symbols ({malformed} malformed lines); point `kallsyms` at a /proc/kallsyms copy, and read it as root so addresses are not zeroed")]
    NoSymbols { path: PathBuf, malformed: u64 },
    #[error("cannot read module metadata at {path}: {source}; check the `sysfs` root in the kernel_symbols config (it must hold module/ and kernel/notes)")]
    Sysfs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {what}; this file is written by the kernel, so the sysfs root is probably wrong")]
    SysfsFormat { path: PathBuf, what: String },
    #[error("bpf({cmd}) failed: {source}; BPF program names need CAP_SYS_ADMIN (or CAP_BPF+CAP_PERFMON), falling back to [bpf] lines of kallsyms")]
    Bpf {
        cmd: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("BTF of BPF program {prog_id} is malformed: {what}")]
    Btf { prog_id: u32, what: String },
    #[error("cannot open the dummy perf event for PERF_RECORD_KSYMBOL on cpu {cpu}: {source}; needs CAP_PERFMON or perf_event_paranoid <= 1, BPF programs loaded later are then only seen on kallsyms reloads")]
    PerfOpen {
        cpu: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot list the online CPUs for PERF_RECORD_KSYMBOL: {source}; BPF programs loaded later are then only seen on kallsyms reloads")]
    OnlineCpus {
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot open the kobject uevent netlink socket: {source}; module loads are then only seen on periodic reloads"
    )]
    Netlink {
        #[source]
        source: std::io::Error,
    },
    #[error("invalid kernel_symbols config: {0}")]
    Config(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
