//! Release builds of the `profcol` binary place the functions a node agent
//! runs next to each other (`hot-text.order`, written by
//! `collector/benches/hot_text.sh`). The kernel maps more of an
//! executable's text than each fault needs (the cached pages of a 64 KiB
//! window, or a whole large page-cache folio), so code scattered over the
//! 28 MB text section costs resident memory far beyond the bytes run;
//! packed together it is ~6 MiB (docs/PERFORMANCE.md).
//! A symbol the list names but the build lacks is skipped, so a stale list
//! costs locality, never correctness. The list holds the names of the
//! x86_64-unknown-linux-gnu build: other targets (the container image's
//! musl build) mangle every name differently and link with a linker
//! without the option, so they are linked as before.

fn main() {
    println!("cargo:rerun-if-changed=hot-text.order");
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    // rust-lld is the default linker of this target only; other linkers do
    // not take the option.
    let lld_target = std::env::var("TARGET").as_deref() == Ok("x86_64-unknown-linux-gnu");
    if release && lld_target {
        // The linker reads a copy in OUT_DIR: the link arg cargo keeps for
        // the next builds then names a file of the target directory, which
        // cargo shares between checkouts of the same workspace, not one of
        // a checkout that may be gone.
        let list = concat!(env!("CARGO_MANIFEST_DIR"), "/hot-text.order");
        let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
        let order = std::path::Path::new(&out).join("hot-text.order");
        std::fs::copy(list, &order).expect("collector/hot-text.order is readable");
        let order = order.display();
        println!("cargo:rustc-link-arg-bin=profcol=-Wl,--symbol-ordering-file={order}");
        println!("cargo:rustc-link-arg-bin=profcol=-Wl,--no-warn-symbol-ordering");
    }
}
