//! Links the `profcol` executable at a fixed address (not PIE) on glibc
//! targets. A PIE's relocated read-only data (vtables, panic locations,
//! the GOT: 0.9 MiB here) is written by the dynamic loader at start, so
//! its pages are private and dirty: anonymous memory the agent's memory
//! cgroup charges for the process's whole life. Linked at a fixed address,
//! those pages stay clean pages of the file. Shared libraries, stacks, the
//! heap and mappings are still randomized. The static musl build of the
//! container image gets the same from deploy/container/build.sh
//! (`-C relocation-model=static`).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
}
