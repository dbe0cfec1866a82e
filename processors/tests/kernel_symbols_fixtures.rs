//! kernel_symbols against the fixture kernel in fixtures/kernel_symbols:
//! one test per kallsyms / sysfs quirk, generations, and batch output.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use profcol_api::model::{keys, str_at, Profiles};
use profcol_processors::kernel_symbols::bpf::progs::BpfFunc;
use profcol_processors::kernel_symbols::generations::{now_ns, Generations};
use profcol_processors::kernel_symbols::kallsyms::{self, ParseOptions};
use profcol_processors::kernel_symbols::snapshot::Symbol;
use profcol_processors::kernel_symbols::symbolize::symbolize;
use profcol_processors::kernel_symbols::sysfs::{self, hex};
use profcol_processors::kernel_symbols::{Store, StoreConfig};
use profcol_testkit::batch::kernel_batch;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kernel_symbols")
}

fn open_at(kallsyms: &Path, sysfs: &Path) -> Store {
    Store::open(StoreConfig {
        kallsyms: kallsyms.into(),
        sysfs: sysfs.into(),
        bpf_syscall: false,
        retain: Duration::from_secs(60),
    })
    .expect("fixture store opens")
}

fn open() -> Store {
    open_at(&fixtures().join("quirks.kallsyms"), &fixtures().join("sysfs"))
}

/// Name (and module) an address resolves to in the newest generation.
fn name_of(store: &Store, addr: u64) -> String {
    let g = store.generations().current();
    describe(g.snapshot.lookup(addr))
}

fn describe(s: Option<Symbol<'_>>) -> String {
    match s {
        Some(Symbol::Kernel { name, off }) => format!("{name}+{off:#x}"),
        Some(Symbol::Module { module, sym: Some((name, off)) }) => format!("{name}+{off:#x} [{}]", module.name),
        Some(Symbol::Module { module, sym: None }) => format!("? [{}]", module.name),
        Some(Symbol::Loose { module, name, off }) => format!("{name}+{off:#x} [{module}]"),
        Some(Symbol::Bpf { func, off, .. }) => format!("{}+{off:#x} [bpf]", func.name),
        None => "?".into(),
    }
}

#[test]
fn pfx_padding_never_names_an_address() {
    let s = open();
    assert_eq!(name_of(&s, 0xffffffff81000110 + 5), "vfs_read+0x5");
    assert_eq!(name_of(&s, 0xffffffff81000100), "_stext+0x100");
    assert_eq!(name_of(&s, 0xffffffffc0a00004), "? [live_mod]"); // only padding there
    assert_eq!(name_of(&s, 0xffffffffc0a00010), "lm_helper+0x0 [live_mod]");
    assert_eq!(s.last_parse().pfx_skipped, 3);
}

#[test]
fn aliases_prefer_global_then_real_names() {
    let s = open();
    assert_eq!(name_of(&s, 0xffffffff81000210), "ksys_read+0x0");
    assert_eq!(name_of(&s, 0xffffffff81000000), "_stext+0x0");
    assert_eq!(name_of(&s, 0xffffffffc0a00200), "lm_cleanup+0x0 [live_mod]");
    // init text lies outside the module's core: named by its table.
    assert_eq!(name_of(&s, 0xffffffffc0b10008), "lm_init+0x8 [live_mod]");
}

#[test]
fn cold_parts_are_their_own_symbols() {
    let s = open();
    assert_eq!(name_of(&s, 0xffffffff810004ff), "big_fn+0xff");
    assert_eq!(name_of(&s, 0xffffffff81000804), "big_fn.cold+0x4");
}

#[test]
fn data_symbols_are_skipped() {
    let s = open();
    assert_eq!(name_of(&s, 0xffffffff81000608), "after_big+0x108");
    assert_eq!(name_of(&s, 0xffffffff81000700), "after_big+0x200");
    assert_eq!(name_of(&s, 0xffffffffc0a00400), "lm_cleanup+0x200 [live_mod]");
    assert!(s.last_parse().non_text >= 3);
}

#[test]
fn long_names_are_truncated_and_counted() {
    let s = open();
    let name = name_of(&s, 0xffffffff81000900);
    assert!(name.starts_with("rust_long_xxx"), "{name}");
    assert_eq!(name.len(), 255 + "+0x0".len());
    assert_eq!(s.last_parse().truncated, 1);
}

#[test]
fn malformed_lines_are_counted_and_skipped() {
    let s = open();
    assert_eq!(s.last_parse().malformed, 4);
    assert_eq!(name_of(&s, 0xffffffff81000c00), "_etext+0x0");
    // A file of nothing but garbage is an error that says what to do.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("kallsyms");
    std::fs::write(&bad, "garbage\n\nzz T x\n").unwrap();
    let e =
        Store::open(StoreConfig { kallsyms: bad, sysfs: dir.path().into(), bpf_syscall: false, ..Default::default() })
            .err()
            .expect("no symbols is an error");
    let msg = e.to_string();
    assert!(msg.contains("no usable kernel text symbols") && msg.contains("3 malformed"), "{msg}");
}

#[test]
fn parser_survives_arbitrary_bytes() {
    let text = std::fs::read(fixtures().join("quirks.kallsyms")).unwrap();
    for cut in (0..text.len()).step_by(7) {
        let mut t = text[..cut].to_vec();
        t.extend_from_slice(&[0xff, b'\t', b'[', b'\n', b']']);
        let _ = kallsyms::parse(&t, &ParseOptions::default());
    }
}

#[test]
fn stale_init_symbol_never_beats_live_owner() {
    let s = open();
    // gone_init is global and closer, but gone_mod is not loaded and
    // new_mod owns the address.
    assert_eq!(name_of(&s, 0xffffffffc0c00040), "nm_start+0x40 [new_mod]");
    assert_eq!(name_of(&s, 0xffffffffc0c00900), "nm_export+0x100 [new_mod]");
}

#[test]
fn module_in_sysfs_but_not_kallsyms_gets_mapping_and_build_id() {
    let s = open();
    let g = s.generations().current();
    match g.snapshot.lookup(0xffffffffc0d00010) {
        Some(Symbol::Module { module, sym: None }) => {
            assert_eq!(&*module.name, "fresh_mod");
            assert_eq!(hex(module.build_id.as_deref().unwrap()), "f".repeat(40));
        }
        other => panic!("{}", describe(other)),
    }
    // Past coresize nothing owns it.
    assert_eq!(name_of(&s, 0xffffffffc0d01000), "?");
}

#[test]
fn builtin_modules_and_build_ids_from_sysfs() {
    let mods = sysfs::read_modules(&fixtures().join("sysfs")).unwrap().unwrap();
    let names: Vec<&str> = mods.iter().map(|m| &*m.name).collect();
    assert_eq!(names, ["live_mod", "new_mod", "fresh_mod"]);
    assert_eq!(hex(mods[0].build_id.as_deref().unwrap()), "11223344556677889900aabbccddeeff00112233");
    let v = sysfs::vmlinux_build_id(&fixtures().join("sysfs")).unwrap();
    assert_eq!(hex(&v), "0123456789abcdef0123456789abcdef01234567");
    assert!(sysfs::read_modules(Path::new("/nonexistent")).unwrap().is_none());
}

#[test]
fn bpf_and_pseudo_module_lines() {
    let s = open();
    assert_eq!(name_of(&s, 0xffffffffc0e00010), "bpf_prog_6deef7357e7b4530_sd_fw_egress+0x10 [bpf]");
    assert_eq!(name_of(&s, 0xffffffffc0e00810), "bpf_prog_00112233aabbccdd_second+0x10 [bpf]");
    assert_eq!(name_of(&s, 0xffffffffc0f00010), "ftrace_trampoline+0x10 [__builtin__ftrace]");
}

#[test]
fn no_sysfs_takes_every_kallsyms_module_as_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let s = open_at(&fixtures().join("quirks.kallsyms"), dir.path());
    assert_eq!(name_of(&s, 0xffffffffc0a00110), "lm_export+0x10 [live_mod]");
    // Without sysfs nobody owns ranges: the closest symbol wins.
    assert_eq!(name_of(&s, 0xffffffffc0c00040), "gone_init+0x0 [gone_mod]");
}

/// Copies the fixture tree so a test can change it.
fn scratch() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let k = dir.path().join("kallsyms");
    std::fs::copy(fixtures().join("quirks.kallsyms"), &k).unwrap();
    let sys = dir.path().join("sysfs");
    copy_tree(&fixtures().join("sysfs"), &sys);
    (dir, k, sys)
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

fn add_module(sys: &Path, name: &str, text: u64, size: u64) {
    let d = sys.join("module").join(name);
    std::fs::create_dir_all(d.join("sections")).unwrap();
    std::fs::write(d.join("sections/.text"), format!("{text:#x}\n")).unwrap();
    std::fs::write(d.join("coresize"), format!("{size}\n")).unwrap();
}

#[test]
fn address_reuse_resolves_by_sample_time() {
    let (_dir, k, sys) = scratch();
    let s = open_at(&k, &sys);
    // live_mod's init text at X is freed; reuse_mod is then loaded at X.
    let x = 0xffffffffc0b10000u64;
    let before = now_ns();
    std::thread::sleep(Duration::from_millis(2));
    let loaded_at = now_ns();
    add_module(&sys, "reuse_mod", x, 4096);
    assert!(s.refresh_metadata(loaded_at).unwrap());
    let mut text = std::fs::read_to_string(&k).unwrap();
    text.push_str("ffffffffc0b10000 T reuse_fn\t[reuse_mod]\n");
    std::fs::write(&k, text).unwrap();
    s.reload_kallsyms().unwrap();
    let after = now_ns();

    let list = s.generations().load();
    let at = |ts| describe(Generations::at(&list, ts).snapshot.lookup(x + 8));
    assert_eq!(at(before), "lm_init+0x8 [live_mod]");
    // Names read later are filled into the generation the load published.
    assert_eq!(at(loaded_at), "reuse_fn+0x8 [reuse_mod]");
    assert_eq!(at(after), "reuse_fn+0x8 [reuse_mod]");
}

#[test]
fn reload_reparses_only_changed_modules() {
    let (_dir, k, sys) = scratch();
    let s = open_at(&k, &sys);
    let before = s.generations().current();
    let table = |g: &Arc<profcol_processors::kernel_symbols::generations::Generation>, name: &str| {
        g.snapshot.modules.iter().find(|m| &*m.meta.name == name).and_then(|m| m.syms.clone()).unwrap()
    };
    s.reload_kallsyms().unwrap();
    assert_eq!(s.last_parse().symbols, 2, "only loose tables (gone_mod, ftrace) rebuilt");
    std::thread::sleep(Duration::from_millis(20));
    // new_mod is reloaded (new sysfs dir mtime): its table is rebuilt.
    let d = sys.join("module/new_mod");
    let t = std::time::SystemTime::now();
    std::fs::File::open(&d).unwrap().set_modified(t).unwrap();
    s.reload_kallsyms().unwrap();
    let after = s.generations().current();
    assert!(Arc::ptr_eq(&table(&before, "live_mod"), &table(&after, "live_mod")));
    assert!(!Arc::ptr_eq(&table(&before, "new_mod"), &table(&after, "new_mod")));
    assert!(Arc::ptr_eq(&before.snapshot.vmlinux, &after.snapshot.vmlinux));
}

#[test]
fn bpf_records_apply_without_kallsyms_reads() {
    let s = open();
    let reads = s.counters.full_reads.load(std::sync::atomic::Ordering::Relaxed);
    let t0 = now_ns();
    let f = BpfFunc {
        start: 0xffffffffc1000000,
        len: 0x80,
        prog_id: 0,
        name: "bpf_prog_0123456789abcdef_probe".into(),
        func: None,
        lines: Arc::from([]),
    };
    s.bpf_register(t0, f);
    assert_eq!(name_of(&s, 0xffffffffc1000010), "bpf_prog_0123456789abcdef_probe+0x10 [bpf]");
    assert_eq!(name_of(&s, 0xffffffffc1000080), "?");
    s.bpf_unregister(t0 + 1000, 0xffffffffc1000000, "bpf_prog_0123456789abcdef_probe");
    let list = s.generations().load();
    assert!(
        describe(Generations::at(&list, t0 + 999).snapshot.lookup_at(0xffffffffc1000010, t0 + 999)).contains("probe")
    );
    assert_eq!(describe(Generations::at(&list, t0 + 1000).snapshot.lookup_at(0xffffffffc1000010, t0 + 1000)), "?");
    // BPF records carry their own times: they add no generation.
    assert_eq!(list.len(), 1);
    assert_eq!(s.counters.full_reads.load(std::sync::atomic::Ordering::Relaxed), reads);
}

#[test]
fn retain_drops_old_generations_and_retired_bpf_functions() {
    let (_dir, k, sys) = scratch();
    let s = Store::open(StoreConfig {
        kallsyms: k,
        sysfs: sys.clone(),
        bpf_syscall: false,
        retain: Duration::from_millis(1),
    })
    .unwrap();
    for i in 0..5u64 {
        add_module(&sys, &format!("gen_mod{i}"), 0xffffffffc2000000 + i * 0x10000, 4096);
        assert!(s.refresh_metadata(now_ns()).unwrap());
        let start = 0xffffffffc1000000 + i * 0x100;
        s.bpf_register(now_ns(), bpf_func(start, "bpf_prog_x"));
        s.bpf_unregister(now_ns(), start, "bpf_prog_x");
        std::thread::sleep(Duration::from_millis(3));
    }
    assert!(s.generations().len() <= 2, "{}", s.generations().len());
    // Each unregister pruned what had retired more than `retain` before it.
    assert!(s.bpf().retired_len() <= 1, "{}", s.bpf().retired_len());
}

fn bpf_func(start: u64, name: &str) -> BpfFunc {
    BpfFunc { start, len: 0x40, prog_id: 0, name: name.into(), func: None, lines: Arc::from([]) }
}

/// One program's life as the kernel reports it: registered on one CPU,
/// freed (after an RCU grace period) on whichever CPU ran the callback.
struct Life {
    slot: u64,
    name: String,
    reg: (u64, usize),
    unreg: (u64, usize),
}

/// Programs loaded and freed at a few reused addresses over 4 CPUs.
fn churn_schedule(rng: &mut fastrand::Rng, t0: u64) -> Vec<Life> {
    let mut lives = Vec::new();
    for slot in 0..6u64 {
        let mut t = t0 + rng.u64(0..50_000);
        for n in 0..40 {
            let reg = t + rng.u64(1..200_000);
            let unreg = reg + rng.u64(1..300_000);
            lives.push(Life {
                slot,
                name: format!("bpf_prog_{slot:02x}{n:014x}_p"),
                reg: (reg, rng.usize(0..4)),
                unreg: (unreg, rng.usize(0..4)),
            });
            t = unreg;
        }
    }
    lives
}

fn slot_addr(slot: u64) -> u64 {
    0xffffffffc3000000 + slot * 0x40
}

/// The kernel's order is per CPU only: each ring is time-ordered, the rings
/// are not ordered against each other, and a record shows up in its ring a
/// little after its timestamp. The reader wakes at random times, drains the
/// rings in a random CPU order and merges by timestamp; the store must then
/// name every address at every time with exactly the program live then.
#[test]
fn bpf_records_shuffled_across_cpus_resolve_to_the_program_live_at_each_time() {
    use profcol_processors::kernel_symbols::ordering::{Reorder, SLACK_NS};
    use profcol_processors::kernel_symbols::store::BpfEvent;
    for seed in 0..20 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let s = open();
        let live_before = s.bpf().live_len();
        let t0 = now_ns();
        let lives = churn_schedule(&mut rng, t0);
        // Per-CPU rings: (visible at, ts, event), in ring (time) order.
        let mut rings: Vec<Vec<(u64, u64, BpfEvent)>> = vec![Vec::new(); 4];
        for l in &lives {
            let addr = slot_addr(l.slot);
            rings[l.reg.1].push((0, l.reg.0, BpfEvent::Register(bpf_func(addr, &l.name))));
            rings[l.unreg.1].push((0, l.unreg.0, BpfEvent::Unregister { start: addr, name: l.name.as_str().into() }));
        }
        for r in &mut rings {
            r.sort_by_key(|e| e.1);
            // Published up to SLACK after its stamp, never before the one ahead of it.
            let mut prev = 0;
            for e in r.iter_mut() {
                e.0 = (e.1 + rng.u64(0..SLACK_NS)).max(prev);
                prev = e.0;
            }
        }
        let end = lives.iter().map(|l| l.unreg.0).max().unwrap() + 10 * SLACK_NS;
        let mut cursor = [0usize; 4];
        let mut held = Reorder::default();
        let mut now = t0;
        let mut batches = 0;
        while now < end {
            now += rng.u64(1..SLACK_NS / 4);
            let watermark = now - SLACK_NS;
            let mut order: Vec<usize> = (0..4).collect();
            rng.shuffle(&mut order);
            for cpu in order {
                while let Some((vis, ts, e)) = rings[cpu].get(cursor[cpu]).filter(|e| e.0 <= now) {
                    let _ = vis;
                    held.push(*ts, e.clone());
                    cursor[cpu] += 1;
                }
            }
            let mut ready = Vec::new();
            held.ready(watermark, &mut ready);
            if !ready.is_empty() {
                batches += 1;
                s.apply_bpf(ready);
            }
        }
        assert!(held.is_empty() && batches > 10, "seed {seed}: {} held, {batches} batches", held.len());
        assert_eq!(held.late, 0, "seed {seed}: the watermark let a record through early");
        let h = s.bpf();
        for l in &lives {
            let addr = slot_addr(l.slot) + 8;
            for ts in [l.reg.0, (l.reg.0 + l.unreg.0) / 2, l.unreg.0 - 1] {
                let got = h.lookup(addr, ts).map(|f| f.name.to_string());
                assert_eq!(got.as_deref(), Some(l.name.as_str()), "seed {seed}: {} at {}", l.name, ts - t0);
            }
            // Just outside its life the slot is free or someone else's.
            for ts in [l.reg.0 - 1, l.unreg.0] {
                assert_ne!(h.lookup(addr, ts).map(|f| f.name.to_string()).as_deref(), Some(l.name.as_str()));
            }
        }
        assert_eq!(h.live_len(), live_before, "seed {seed}: every program was freed");
        assert_eq!(s.generations().len(), 1, "BPF records add no generation");
    }
}

/// The same schedule applied with no merge at all (each CPU's records in a
/// random interleaving, one by one): the ledger still places each at its time.
#[test]
fn bpf_records_in_any_cross_cpu_order_still_land_at_their_times() {
    use profcol_processors::kernel_symbols::store::BpfEvent;
    for seed in 100..110 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let s = open();
        let t0 = now_ns();
        let lives = churn_schedule(&mut rng, t0);
        let mut rings: Vec<Vec<(u64, BpfEvent)>> = vec![Vec::new(); 4];
        for l in &lives {
            let addr = slot_addr(l.slot);
            rings[l.reg.1].push((l.reg.0, BpfEvent::Register(bpf_func(addr, &l.name))));
            rings[l.unreg.1].push((l.unreg.0, BpfEvent::Unregister { start: addr, name: l.name.as_str().into() }));
        }
        for r in &mut rings {
            r.sort_by_key(|e| e.0);
            r.reverse();
        }
        while rings.iter().any(|r| !r.is_empty()) {
            let cpu = rng.usize(0..4);
            if let Some(e) = rings[cpu].pop() {
                s.apply_bpf(vec![e]);
            }
        }
        let h = s.bpf();
        for l in &lives {
            let addr = slot_addr(l.slot) + 8;
            let mid = (l.reg.0 + l.unreg.0) / 2;
            assert_eq!(
                h.lookup(addr, mid).map(|f| f.name.to_string()).as_deref(),
                Some(l.name.as_str()),
                "seed {seed}"
            );
            assert!(h.lookup(addr, l.unreg.0).is_none_or(|f| *f.name != *l.name), "seed {seed}");
        }
    }
}

// ---- batch output ----

/// (function, mapping file, address, build id) of each frame of sample 0.
fn frames(p: &Profiles) -> Vec<(String, String, u64, String)> {
    let d = p.dictionary().unwrap();
    let s = &p.profiles().next().unwrap().samples[0];
    let st = &d.stack_table[s.stack_index as usize];
    st.location_indices
        .iter()
        .map(|&li| {
            let l = &d.location_table[li as usize];
            let m = &d.mapping_table[l.mapping_index as usize];
            let f = l.lines.first().map_or(String::new(), |ln| {
                str_at(&d.string_table, d.function_table[ln.function_index as usize].name_strindex).to_owned()
            });
            let bid = m
                .attribute_indices
                .iter()
                .map(|&a| &d.attribute_table[a as usize])
                .find(|kv| str_at(&d.string_table, kv.key_strindex) == keys::BUILD_ID_GNU)
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    profcol_api::model::any_value::Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            let kind_ok = l
                .attribute_indices
                .iter()
                .any(|&a| str_at(&d.string_table, d.attribute_table[a as usize].key_strindex) == keys::FRAME_TYPE);
            assert!(kind_ok, "frame type attribute kept");
            (f, str_at(&d.string_table, m.filename_strindex).to_owned(), l.address, bid)
        })
        .collect()
}

#[test]
fn batch_frames_get_function_mapping_build_id() {
    let s = open();
    // leaf in vfs_read; caller's return address is the first byte after
    // lm_helper (== lm_export's start) so it must be looked up at -1; then a
    // frame in fresh_mod (no names) and one nothing owns.
    let batch =
        kernel_batch(&[0xffffffff81000115, 0xffffffffc0a00100, 0xffffffffc0d00020, 0xffffffffc0ff0000], now_ns());
    let (out, outcome) = symbolize(batch, &s.generations().load());
    let f = frames(&out);
    assert_eq!(
        f[0],
        (
            "vfs_read".into(),
            "[kernel.kallsyms]".into(),
            0xffffffff81000115,
            "0123456789abcdef0123456789abcdef01234567".into()
        )
    );
    assert_eq!(f[1], ("lm_helper".into(), "live_mod".into(), 0x100, "11223344556677889900aabbccddeeff00112233".into()));
    assert_eq!(f[2], (String::new(), "fresh_mod".into(), 0x20, "f".repeat(40)));
    assert_eq!(f[3].0, "");
    assert_eq!((outcome.kernel_frames, outcome.resolved, outcome.module_only, outcome.unresolved), (4, 2, 1, 1));
    out.validate().expect("output is a valid batch");
}

/// Addresses in one vmlinux function share its name and function entry
/// (named once per batch), and each keeps its own address; the function
/// after them is still named on its own.
#[test]
fn frames_in_one_function_share_it_and_keep_their_addresses() {
    let s = open();
    let batch =
        kernel_batch(&[0xffffffff81000115, 0xffffffff81000140, 0xffffffff81000181, 0xffffffff81000215], now_ns());
    let (out, outcome) = symbolize(batch, &s.generations().load());
    let f = frames(&out);
    let names: Vec<(&str, u64)> = f.iter().map(|(n, _, a, _)| (n.as_str(), *a)).collect();
    assert_eq!(
        names,
        vec![
            ("vfs_read", 0xffffffff81000115),
            ("vfs_read", 0xffffffff81000140),
            ("vfs_read", 0xffffffff81000181),
            ("ksys_read", 0xffffffff81000215)
        ]
    );
    let d = out.dictionary().unwrap();
    let functions: Vec<i32> =
        d.location_table.iter().filter_map(|l| l.lines.first()).map(|l| l.function_index).collect();
    let vfs_read: std::collections::BTreeSet<i32> = functions.iter().copied().take(3).collect();
    assert_eq!(vfs_read.len(), 1, "one function entry for vfs_read: {functions:?}");
    assert_eq!(outcome.resolved, 4);
    out.validate().expect("output is a valid batch");
}

/// Locations still as the receiver wrote them: kernel mapping, no lines.
fn raw_kernel_locations(p: &Profiles) -> Vec<u64> {
    let d = p.dictionary().unwrap();
    d.location_table
        .iter()
        .skip(1)
        .filter(|l| {
            l.lines.is_empty()
                && str_at(&d.string_table, d.mapping_table[l.mapping_index as usize].filename_strindex)
                    == keys::KERNEL_MAPPING
        })
        .map(|l| l.address)
        .collect()
}

#[test]
fn symbolized_batches_carry_no_raw_kernel_entries() {
    let s = open();
    let gens = s.generations().load();
    // vmlinux leaf, live_mod caller, fresh_mod (mapping only): all rewritten.
    let batch = kernel_batch(&[0xffffffff81000115, 0xffffffffc0a00100, 0xffffffffc0d00020], now_ns());
    assert_eq!(raw_kernel_locations(&batch).len(), 3);
    let (out, outcome) = symbolize(batch.clone(), &gens);
    assert_eq!(outcome.unresolved, 0);
    out.validate().expect("valid");
    assert_eq!(profcol_api::model::canonical::samples(&out).len(), 1);
    assert!(raw_kernel_locations(&out).is_empty(), "{:?}", raw_kernel_locations(&out));
    // The receiver's catch-all kernel mapping went with the raw locations.
    assert!(out.dictionary().unwrap().mapping_table.iter().all(|m| m.memory_limit != u64::MAX));
    // strings: "", [kernel.kallsyms], profile.frame.type, samples, count,
    //   cpu, nanoseconds, build-id key, vfs_read, live_mod, lm_helper, fresh_mod;
    // attributes: 0, frame type, 3 build IDs; mappings: 0, vmlinux, live_mod,
    // fresh_mod; functions: 0, vfs_read, lm_helper; locations: 0 + 3;
    // stacks: 0 + 1; links: 0.
    assert_eq!(out.table_sizes(), [12, 5, 4, 3, 4, 2, 1]);
    // Nothing left to rewrite: a second pass returns the batch as it is.
    assert_eq!(symbolize(out.clone(), &gens).0, out);

    // An unresolved frame keeps its raw location (and mapping): it is still used.
    let batch = kernel_batch(&[0xffffffff81000115, 0xffffffffc0ff0000], now_ns());
    let (out, outcome) = symbolize(batch, &gens);
    assert_eq!((outcome.resolved, outcome.unresolved), (1, 1));
    out.validate().expect("valid");
    assert_eq!(raw_kernel_locations(&out), [0xffffffffc0ff0000]);
    // mappings: 0, raw catch-all, vmlinux; locations: 0, vfs_read, raw.
    assert_eq!(out.table_sizes()[2..6], [3, 2, 3, 2]);
}

#[test]
fn the_leaf_is_looked_up_exactly() {
    let s = open();
    let batch = kernel_batch(&[0xffffffffc0a00100], now_ns());
    let (out, _) = symbolize(batch, &s.generations().load());
    assert_eq!(frames(&out)[0].0, "lm_export");
}

/// One raw location met as a leaf in one stack (its exact address: the
/// function that starts there) and as a return address in another (address
/// − 1: the function before it) gets both names, each in its own stack
/// (named where it stands, the exact uses get a location of their own).
#[test]
fn a_location_that_is_a_leaf_here_and_a_return_address_there_gets_both_names() {
    let s = open();
    let t = now_ns();
    let mut batch = kernel_batch(&[0xffffffffc0a00100], t);
    batch.merge(kernel_batch(&[0xffffffff81000115, 0xffffffffc0a00100], t));
    // And both ways in one stack.
    batch.merge(kernel_batch(&[0xffffffffc0a00100, 0xffffffff81000115, 0xffffffffc0a00100], t));
    assert_eq!(raw_kernel_locations(&batch).len(), 2, "the stacks share the raw location");
    let (out, outcome) = symbolize(batch, &s.generations().load());
    out.validate().expect("valid");
    let d = out.dictionary().unwrap();
    let names: Vec<Vec<String>> = out
        .profiles()
        .map(|p| {
            d.stack_table[p.samples[0].stack_index as usize]
                .location_indices
                .iter()
                .map(|&l| {
                    let ln = &d.location_table[l as usize].lines[0];
                    str_at(&d.string_table, d.function_table[ln.function_index as usize].name_strindex).to_owned()
                })
                .collect()
        })
        .collect();
    assert_eq!(names, [vec!["lm_export"], vec!["vfs_read", "lm_helper"], vec!["lm_export", "vfs_read", "lm_helper"]]);
    assert_eq!((outcome.kernel_frames, outcome.resolved), (6, 6));
    assert!(raw_kernel_locations(&out).is_empty());
}

#[test]
fn samples_use_the_generation_of_their_timestamp() {
    let s = open();
    let t0 = now_ns();
    let f = BpfFunc {
        start: 0xffffffffc1000000,
        len: 0x100,
        prog_id: 7,
        name: "bpf_prog_aa_x".into(),
        func: Some("handle".into()),
        lines: Arc::from([]),
    };
    s.bpf_register(t0 + 10, f);
    let mut early = kernel_batch(&[0xffffffffc1000010], t0);
    early.merge(kernel_batch(&[0xffffffffc1000010], t0 + 20));
    let (out, _) = symbolize(early, &s.generations().load());
    let d = out.dictionary().unwrap();
    let names: Vec<String> = out
        .profiles()
        .map(|p| {
            let st = &d.stack_table[p.samples[0].stack_index as usize];
            let l = &d.location_table[st.location_indices[0] as usize];
            l.lines.first().map_or("?".into(), |ln| {
                str_at(&d.string_table, d.function_table[ln.function_index as usize].name_strindex).to_owned()
            })
        })
        .collect();
    assert_eq!(names, ["?", "handle"]);
}

/// One raw stack sampled twice: once in program a, once (after a was freed
/// and b loaded at the same address) in b. The receiver merged them into one
/// Sample; each timestamp must still be named by its own program.
#[test]
fn a_sample_spanning_an_address_reuse_is_split_by_time() {
    let s = open();
    let t0 = now_ns();
    let addr = 0xffffffffc1000000;
    s.bpf_register(t0 + 10, bpf_func(addr, "bpf_prog_aa_a"));
    s.bpf_unregister(t0 + 20, addr, "bpf_prog_aa_a");
    s.bpf_register(t0 + 30, bpf_func(addr, "bpf_prog_bb_b"));
    let mut batch = kernel_batch(&[addr + 8], t0 + 15);
    let smp = &mut batch.0.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
    (smp.values, smp.timestamps_unix_nano) = (vec![1, 1, 1], vec![t0 + 15, t0 + 35, t0 + 16]);
    let (out, outcome) = symbolize(batch, &s.generations().load());
    let d = out.dictionary().unwrap();
    let mut named: Vec<(String, Vec<u64>)> = out
        .profiles()
        .flat_map(|p| &p.samples)
        .map(|smp| {
            let l = &d.location_table[d.stack_table[smp.stack_index as usize].location_indices[0] as usize];
            let f = &d.function_table[l.lines[0].function_index as usize];
            let ts = smp.timestamps_unix_nano.iter().map(|t| t - t0).collect();
            (str_at(&d.string_table, f.name_strindex).to_owned(), ts)
        })
        .collect();
    named.sort();
    assert_eq!(named, [("bpf_prog_aa_a".to_owned(), vec![15, 16]), ("bpf_prog_bb_b".to_owned(), vec![35])]);
    assert_eq!(outcome.resolved, 3);
}

// ---- exact-address frames ----

/// The recorded stack of `interrupted.stack`: (address, function perf names).
fn recorded_interrupted_stack() -> Vec<(u64, String)> {
    std::fs::read_to_string(fixtures().join("interrupted.stack"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (a, n) = l.split_once(' ').unwrap();
            (u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap(), n.to_owned())
        })
        .collect()
}

fn names_of(store: &Store, addrs: &[u64]) -> Vec<String> {
    let (out, _) = symbolize(kernel_batch(addrs, now_ns()), &store.generations().load());
    frames(&out).into_iter().map(|f| f.0).collect()
}

#[test]
fn frame_after_an_interrupt_entry_is_the_interrupted_instruction() {
    let s = open_at(&fixtures().join("interrupted.kallsyms"), &fixtures().join("no-sysfs"));
    let recorded = recorded_interrupted_stack();
    let addrs: Vec<u64> = recorded.iter().map(|r| r.0).collect();
    let want: Vec<String> = recorded.iter().map(|r| r.1.clone()).collect();
    assert_eq!(names_of(&s, &addrs), want);

    // The same interrupt arriving at __dd_dispatch_request's first byte: its
    // address − 1 is padding (named by the function before it), so it is
    // looked up as it is.
    let at = recorded.iter().position(|r| r.1 == "asm_common_interrupt").unwrap() + 1;
    let first_byte = s.generations().current().snapshot.find("__dd_dispatch_request").unwrap();
    assert_eq!(s.generations().current().snapshot.find("__pfx___dd_dispatch_request"), None);
    let mut moved = addrs.clone();
    moved[at] = first_byte;
    let got = names_of(&s, &moved);
    assert_eq!(got[at], "__dd_dispatch_request", "{got:?}");
    assert_eq!(got[..at], want[..at]);
    assert_eq!(got[at + 1..], want[at + 1..]);
}

#[test]
fn jump_target_after_a_thunk_leaf_and_padded_starts_are_exact() {
    let s = open_at(&fixtures().join("interrupted.kallsyms"), &fixtures().join("no-sysfs"));
    let snap = s.generations().current().snapshot.clone();
    let thunk = snap.find("__x86_indirect_thunk_rax").unwrap();
    let x64_sys_call = snap.find("x64_sys_call").unwrap();
    let do_syscall_64 = snap.find("do_syscall_64").unwrap();
    // Sampled in the retpoline thunk: the next frame is where it jumps.
    assert_eq!(
        names_of(&s, &[thunk + 3, x64_sys_call, do_syscall_64 + 0x80]),
        ["__x86_indirect_thunk_rax", "x64_sys_call", "do_syscall_64"]
    );
    // Not after a thunk or an entry: a function's padded first byte is
    // still exact (no call returns there), whatever the frame above it.
    assert_eq!(names_of(&s, &[do_syscall_64 + 0x10, x64_sys_call]), ["do_syscall_64", "x64_sys_call"]);
    // A return address inside a function keeps the − 1 rule.
    assert_eq!(names_of(&s, &[do_syscall_64 + 0x10, x64_sys_call + 0x10]), ["do_syscall_64", "x64_sys_call"]);
    // With the plain − 1 rule, x64_sys_call's first byte falls in
    // rewind_stack_and_make_dead (the padding symbol is not kept).
    assert!(
        matches!(snap.lookup(x64_sys_call - 1), Some(Symbol::Kernel { name, .. }) if name == "rewind_stack_and_make_dead")
    );
}

// ---- config and the processor through the component API ----

#[test]
fn config_defaults_and_unknown_fields() {
    use profcol_processors::kernel_symbols::Config;
    let c: Config = profcol_api::config::ConfigValue::null().decode().unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.reload.min_interval, Duration::from_secs(10));
    assert_eq!(c.reload.max_backoff, Duration::from_secs(300));
    assert_eq!(c.reload.debounce, Duration::from_millis(100));
    assert_eq!(c.retain, Duration::from_secs(60));
    let v = profcol_config::parse_section("reload: {min_intervall: 1s}").unwrap();
    let e = v.decode::<Config>().unwrap_err();
    assert_eq!(e.path, "reload.min_intervall");
    let v = profcol_config::parse_section("reload: {min_interval: 0s}").unwrap();
    let e = profcol_processors::kernel_symbols::factory().check(&v).unwrap_err();
    assert_eq!(e[0].path, "reload.min_interval", "{e:?}");
}

#[tokio::test]
async fn processor_symbolizes_batches_after_start() {
    use profcol_api::component::Processor;
    use profcol_processors::kernel_symbols::{Config, KernelSymbols};
    let p = KernelSymbols::new(Config {
        kallsyms: fixtures().join("quirks.kallsyms"),
        sysfs: fixtures().join("sysfs"),
        uevents: false,
        bpf: false,
        ..Default::default()
    });
    // Before start batches pass through untouched.
    let batch = kernel_batch(&[0xffffffff81000115], now_ns());
    assert_eq!(p.process(batch.clone()).await.unwrap().forwarded().unwrap(), batch);
    p.start().await.unwrap();
    let out = p.process(batch).await.unwrap().forwarded().unwrap();
    assert_eq!(frames(&out)[0].0, "vfs_read");
    // Already symbolized frames are left alone.
    let again = p.process(out.clone()).await.unwrap().forwarded().unwrap();
    assert_eq!(frames(&again), frames(&out));
    p.shutdown().await.unwrap();
}

#[tokio::test]
async fn processor_counts_frames_and_store_work_in_metrics() {
    use profcol_api::component::{ComponentId, Kind, Processor};
    use profcol_api::telemetry::Telemetry;
    use profcol_processors::kernel_symbols::{Config, KernelSymbols};
    let registry = Telemetry::new();
    let id: ComponentId = "kernel_symbols".parse().unwrap();
    let cfg = Config {
        kallsyms: fixtures().join("quirks.kallsyms"),
        sysfs: fixtures().join("sysfs"),
        uevents: false,
        bpf: false,
        ..Default::default()
    };
    let p = KernelSymbols::with_telemetry(cfg, &registry.component(Kind::Processor, &id));
    p.start().await.unwrap();
    // One frame inside vfs_read, one far outside every symbol.
    p.process(kernel_batch(&[0xffffffff81000115, 0x1000], now_ns())).await.unwrap().forwarded().unwrap();
    // Three observations of one stack: three frames, one location.
    let ts = now_ns();
    let mut thrice = kernel_batch(&[0xffffffff81000115], ts);
    let sample = &mut thrice.0.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
    (sample.values, sample.timestamps_unix_nano) = (vec![1; 3], vec![ts; 3]);
    p.process(thrice).await.unwrap().forwarded().unwrap();
    let m = registry.render();
    let series_in = |m: &str, name: &str| {
        m.lines()
            .find(|l| l.starts_with(&format!("profcol_processor_kernel_symbols_{name}{{")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let series = |name: &str| series_in(&m, name);
    assert_eq!(series("frames_resolved_total"), Some(4), "{m}");
    assert_eq!(series("frames_unresolved_total"), Some(1), "{m}");
    // The store's one full read at start, mirrored once, not once per batch.
    assert_eq!(series("kallsyms_reads_total"), Some(1), "{m}");
    assert_eq!(series("generations"), Some(1), "{m}");
    assert_eq!(series("bpf_rescans_total"), Some(0), "{m}");
    // Store work shows up with no batch passing, at the next collection
    // (no timer of the processor's own copies it).
    let store = p.store().unwrap().clone();
    store.rescan_bpf();
    let m = registry.render();
    assert_eq!(series_in(&m, "bpf_rescans_total"), Some(1), "{m}");
    // Shut down, the processor stops copying (and lets the store go).
    p.shutdown().await.unwrap();
    store.rescan_bpf();
    let m = registry.render();
    assert_eq!(series_in(&m, "bpf_rescans_total"), Some(1), "{m}");
}

#[tokio::test]
async fn processor_start_fails_with_a_clear_error() {
    use profcol_api::component::Processor;
    use profcol_processors::kernel_symbols::{Config, KernelSymbols};
    let p = KernelSymbols::new(Config {
        kallsyms: "/nonexistent/kallsyms".into(),
        uevents: false,
        bpf: false,
        ..Default::default()
    });
    let e = p.start().await.unwrap_err().to_string();
    assert!(e.contains("/nonexistent/kallsyms") && e.contains("kallsyms` path"), "{e}");
}
