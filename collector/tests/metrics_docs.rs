//! Every series a built-in component declares (its factory's `metrics()`,
//! and the exporter helper's own) has a row in docs/CONFIG.md's
//! "Self-telemetry: the metrics" table that names it and says what it means.

use profcol::extensions::HostStatus;
use profcol::registry::Registry;
use profcol_api::component::Kind;
use profcol_api::telemetry::MetricDef;

const SECTION: &str = "## Self-telemetry: the metrics";

/// One table row: the series it names (siblings written `_suffix` after a
/// first full name are expanded) and the whole row's text.
struct Row {
    names: Vec<String>,
    text: String,
}

/// The backticked words of `cell`, without a `{labels}` tail.
fn ticked(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).map(|w| w.split('{').next().unwrap_or(w).trim()).collect()
}

/// `_sibling` written after `first`: the names `first` would have with one
/// of its trailing `_`-parts replaced (`profcol_exporter_pprof_files`,
/// `_pprof_files_removed_total` names `profcol_exporter_pprof_files_removed_total`).
fn expand(first: &str, sibling: &str) -> Vec<String> {
    let tail = sibling.trim_start_matches('_');
    // The kind (`profcol_<kind>_`) always stays.
    let keep = first.match_indices('_').nth(1).map_or(first.len(), |(i, _)| i);
    first.match_indices('_').filter(|(i, _)| *i >= keep).map(|(i, _)| format!("{}_{tail}", &first[..i])).collect()
}

fn rows(doc: &str) -> Vec<Row> {
    let start = doc.find(SECTION).unwrap_or_else(|| panic!("docs/CONFIG.md has no {SECTION:?} section"));
    let body = &doc[start + SECTION.len()..];
    let body = &body[..body.find("\n## ").unwrap_or(body.len())];
    let mut out = Vec::new();
    for line in body.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
        let (Some(series), Some(meaning)) = (cells.first(), cells.get(1)) else { continue };
        let meaning = meaning.trim();
        if meaning.is_empty() || meaning.starts_with("---") {
            continue;
        }
        let mut names = Vec::new();
        let mut first: Option<&str> = None;
        for w in ticked(series) {
            if w.starts_with("profcol_") {
                names.push(w.to_owned());
                first.get_or_insert(w);
            } else if let (Some(f), true) = (first, w.starts_with('_')) {
                names.extend(expand(f, w));
            }
        }
        out.push(Row { names, text: line.to_owned() });
    }
    out
}

/// What is wrong with the documentation of `def` for a component of `kind`.
fn problem(rows: &[Row], owner: &str, kind: Kind, def: &MetricDef) -> Option<String> {
    let full = def.full_name(kind);
    let Some(row) = rows.iter().find(|r| r.names.contains(&full)) else {
        return Some(format!("{owner}: `{full}` ({}) has no row", def.help));
    };
    for label in [def.label, def.label2].into_iter().flatten() {
        if !row.text.contains(label) {
            return Some(format!("{owner}: the row of `{full}` does not name its label `{label}`"));
        }
    }
    None
}

#[test]
fn every_declared_series_has_a_row_in_config_md() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/CONFIG.md")).expect("docs/CONFIG.md");
    let rows = rows(&doc);
    let registry = Registry::builtin(&HostStatus::default());
    let mut declared = vec![
        ("exporter helper".to_owned(), Kind::Exporter, profcol::exporter_helper::METRICS),
        ("pipeline".to_owned(), Kind::Processor, profcol::service::PROCESSOR_METRICS),
    ];
    for f in registry.all() {
        let m = f.meta();
        declared.push((format!("{} {}", m.kind.as_str(), m.type_name), m.kind, f.metrics()));
    }
    let mut checked = 0;
    let mut problems = Vec::new();
    for (owner, kind, defs) in &declared {
        for def in defs.iter() {
            checked += 1;
            assert!(!def.help.is_empty(), "{owner}: {} has no help text", def.name);
            assert!(!def.unit.is_empty(), "{owner}: {} has no unit", def.name);
            problems.extend(problem(&rows, owner, *kind, def));
        }
    }
    assert!(checked >= 30, "only {checked} series declared: are the factories' metrics() lists wired?");
    assert!(problems.is_empty(), "docs/CONFIG.md's metric table misses:\n{}", problems.join("\n"));
}

#[test]
fn siblings_written_as_suffixes_expand_to_full_names() {
    let doc = format!(
        "{SECTION}\n\n| series | meaning |\n|---|---|\n\
         | `profcol_exporter_pprof_files`, `_pprof_files_removed_total` | kept, removed |\n\
         | `profcol_processor_user_symbols_cache_dir_writes_total{{outcome}}`, `_cache_dir_evictions_total` | w |\n\
         \n## Next\n| `profcol_exporter_elsewhere` | not this table |\n"
    );
    let rows = rows(&doc);
    let has = |n: &str| rows.iter().any(|r| r.names.iter().any(|x| x == n));
    assert!(has("profcol_exporter_pprof_files"));
    assert!(has("profcol_exporter_pprof_files_removed_total"));
    assert!(has("profcol_processor_user_symbols_cache_dir_writes_total"));
    assert!(has("profcol_processor_user_symbols_cache_dir_evictions_total"));
    assert!(!has("profcol_exporter_elsewhere"), "a later section's table is not the metric table");
    let def = MetricDef::counter("user_symbols_cache_dir_writes_total", "1", "w").by("reason");
    assert!(problem(&rows, "t", Kind::Processor, &def).is_some(), "an unnamed label is a problem");
    let def = MetricDef::counter("user_symbols_cache_dir_writes_total", "1", "w").by("outcome");
    assert!(problem(&rows, "t", Kind::Processor, &def).is_none());
    let def = MetricDef::counter("pprof_undocumented_total", "1", "w");
    assert!(problem(&rows, "t", Kind::Exporter, &def).is_some());
}
