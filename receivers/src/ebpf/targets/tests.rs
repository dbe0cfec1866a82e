use super::*;
use profcol_config::parse_section;

fn parse(yaml: &str) -> Result<TargetsConfig, String> {
    parse_section(yaml).unwrap().decode::<TargetsConfig>().map_err(|e| e.to_string())
}

fn targets(yaml: &str) -> Targets {
    let c = parse(yaml).unwrap();
    assert!(c.problems().is_empty(), "{:?}", c.problems());
    Targets::new(&c).unwrap()
}

fn pod<'a>(path: &'a str, ns: &'a str, pod: &'a str, container: &'a str) -> Facts<'a> {
    Facts {
        cgroup_path: path,
        container_id: Some("ab12"),
        k8s_namespace: Some(ns),
        k8s_pod: Some(pod),
        k8s_container: Some(container),
        executable: None,
    }
}

#[test]
fn include_then_exclude_with_globs() {
    let t = targets(
        "include: [{k8s_namespace: shop}, {cgroup_path: '/system.slice/nginx*'}]\n\
         exclude: [{k8s_container: istio-proxy}, {k8s_namespace: shop, k8s_pod: 'canary-*'}]",
    );
    let p = "/kubepods/pod1/ab12";
    assert_eq!(t.verdict(&pod(p, "shop", "cart-7d9", "app")), Verdict::In);
    assert_eq!(t.verdict(&pod(p, "shop", "cart-7d9", "istio-proxy")), Verdict::Out);
    assert_eq!(t.verdict(&pod(p, "shop", "canary-1", "app")), Verdict::Out);
    assert_eq!(t.verdict(&pod(p, "billing", "cart-7d9", "app")), Verdict::Out);
    let host = |path| Facts { cgroup_path: path, ..Default::default() };
    assert_eq!(t.verdict(&host("/system.slice/nginx.service")), Verdict::In);
    assert_eq!(t.verdict(&host("/system.slice/sshd.service")), Verdict::Out);
    // A fact the node does not know never matches (no pod: not in `shop`).
    assert_eq!(t.verdict(&host("/kubepods/pod1/ab12")), Verdict::Out);
}

#[test]
fn exclude_only_keeps_everything_else_and_a_pattern_without_slash_matches_the_last_part() {
    let t = targets("exclude: [{cgroup_path: 'noisy-*.scope'}]");
    let f = |path| Facts { cgroup_path: path, ..Default::default() };
    assert_eq!(t.verdict(&f("/user.slice/noisy-1.scope")), Verdict::Out);
    assert_eq!(t.verdict(&f("/user.slice/quiet.scope")), Verdict::In);
    assert_eq!(t.verdict(&f("/")), Verdict::In);
}

#[test]
fn an_executable_matcher_decides_per_process_only_where_the_cgroup_leaves_it_open() {
    let t = targets("include: [{k8s_namespace: shop, executable: java}]\nexclude: [{executable: '*/sh'}]");
    let mut f = pod("/k/ab12", "shop", "p", "c");
    assert_eq!(t.verdict(&f), Verdict::ByProcess);
    f.executable = Some("/usr/lib/jvm/bin/java");
    assert_eq!(t.verdict(&f), Verdict::In);
    f.executable = Some("/bin/sh");
    assert_eq!(t.verdict(&f), Verdict::Out);
    f.executable = Some("/usr/bin/python3");
    assert_eq!(t.verdict(&f), Verdict::Out);
    // Another namespace: out whatever runs there, no per-process verdicts.
    assert_eq!(t.verdict(&pod("/k/ab12", "billing", "p", "c")), Verdict::Out);
}

#[test]
fn bad_matchers_say_where_and_what() {
    let c = parse("include: [{}]\nexclude: [{k8s_pod: 'a[b'}]").unwrap();
    let p = c.problems();
    assert_eq!(p.len(), 2, "{p:?}");
    assert_eq!(p[0].0, "targets.include[0]");
    assert!(p[0].1.contains("empty matcher"), "{p:?}");
    assert_eq!(p[1].0, "targets.exclude[0].k8s_pod");
    assert!(p[1].1.contains("not closed"), "{p:?}");
    let e = parse("include: [{namespace: x}]").unwrap_err();
    assert!(e.contains("unknown field `namespace`"), "{e}");
}
