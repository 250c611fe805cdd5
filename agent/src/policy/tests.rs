use std::collections::BTreeMap;
use std::path::Path;

use super::*;
use crate::containers::meta::{GpuGrant, META_VERSION};

const HEAD: &str = "apiVersion: tessera.dev/v1alpha1\nkind: Policy\n";

fn parse(text: &str) -> Result<Policy, PolicyError> {
    file::parse(Path::new("/etc/tessera/policy.yaml"), text)
}

fn meta(namespace: Option<&str>, labels: &[(&str, &str)]) -> Metadata {
    Metadata {
        version: META_VERSION,
        namespace: namespace.map(str::to_owned),
        pod: None,
        container: None,
        claim: None,
        pod_uid: None,
        cgroup: None,
        sm_target: 30,
        mode: None,
        priority: None,
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        fail_open: false,
        gpus: vec![GpuGrant {
            uuid: "GPU-5e1a0000-0000-4000-8000-000051510000".into(),
            memory_limit_bytes: None,
            context_overhead_bytes: 0,
        }],
    }
}

#[test]
fn the_example_file_loads() {
    let text = include_str!("../../../deploy/examples/policy.yaml");
    let p = parse(text).unwrap();
    assert_eq!(p.defaults.mode, Mode::Hard);
    assert_eq!(p.defaults.bypass_action, Action::Freeze);
    assert_eq!(p.defaults.memory_overage_action, Action::Kill);
    let names: Vec<_> = p.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "research-lends-idle-compute",
            "inference-first",
            "notebooks-only-alert"
        ]
    );
    let e = p.effective(&meta(Some("research"), &[]));
    assert_eq!(
        (e.mode, e.rule.as_deref()),
        (Mode::Elastic, Some("research-lends-idle-compute"))
    );
    // What `policy check` prints is a policy file that loads to the same.
    assert_eq!(parse(&file::to_yaml(&p)).unwrap(), p);
}

#[test]
fn without_a_file_the_built_in_defaults_keep_todays_behaviour() {
    let p = Policy::default();
    let e = p.effective(&meta(Some("prod"), &[]));
    assert_eq!(
        e,
        Effective {
            mode: Mode::Hard,
            priority: 0,
            bypass_action: Action::Alert,
            memory_overage_action: Action::Kill,
            compute_overage_action: Action::Throttle,
            rule: None,
        }
    );
    // A file with only the header is the built-in defaults.
    assert_eq!(parse(HEAD).unwrap(), p);
}

const RULES: &str = "defaults:
  computeMode: hard
  priority: 10
  bypassAction: alert
  memoryOverageAction: kill
  computeOverageAction: kill
rules:
  - name: prod-inference
    match:
      namespaces: [prod, staging]
      podLabels:
        tier: inference
        app.kubernetes.io/part-of: shop
    priority: 90
    memoryOverageAction: freeze
  - name: prod
    match:
      namespaces: [prod]
    computeMode: elastic
  - name: notebooks
    match:
      podLabels: {component: notebook}
    bypassAction: deny
    computeOverageAction: alert
";

#[test]
fn the_first_matching_rule_sets_only_its_fields() {
    let p = parse(&format!("{HEAD}{RULES}")).unwrap();
    let both = [("tier", "inference"), ("app.kubernetes.io/part-of", "shop")];
    // Every criterion matches: rule 0 (priority, overage), the rest from
    // the defaults; rule 1 (prod → elastic) is not consulted.
    let e = p.effective(&meta(Some("prod"), &both));
    assert_eq!(
        (
            e.rule.as_deref(),
            e.mode,
            e.priority,
            e.bypass_action,
            e.memory_overage_action
        ),
        (
            Some("prod-inference"),
            Mode::Hard,
            90,
            Action::Alert,
            Action::Freeze
        )
    );
    // Namespaces: any of.
    assert_eq!(
        p.effective(&meta(Some("staging"), &both)).rule.as_deref(),
        Some("prod-inference")
    );
    // Labels: all of (one missing, one different: the next rule).
    let e = p.effective(&meta(Some("prod"), &[("tier", "inference")]));
    assert_eq!(
        (e.rule.as_deref(), e.mode, e.priority),
        (Some("prod"), Mode::Elastic, 10)
    );
    let e = p.effective(&meta(
        Some("prod"),
        &[("tier", "batch"), ("app.kubernetes.io/part-of", "shop")],
    ));
    assert_eq!(e.rule.as_deref(), Some("prod"));
    // Label-only rules match in any namespace, and outside Kubernetes.
    let e = p.effective(&meta(Some("lab"), &[("component", "notebook")]));
    assert_eq!(
        (e.rule.as_deref(), e.bypass_action, e.compute_overage_action),
        (Some("notebooks"), Action::Deny, Action::Alert)
    );
    // The compute overage action: the file's default where the rule
    // sets none.
    assert_eq!(
        p.effective(&meta(Some("prod"), &both))
            .compute_overage_action,
        Action::Kill
    );
    let e = p.effective(&meta(None, &[("component", "notebook")]));
    assert_eq!(e.rule.as_deref(), Some("notebooks"));
    // A container without a namespace never matches a namespace rule,
    // even with the labels.
    let e = p.effective(&meta(None, &both));
    assert_eq!((e.rule, e.priority, e.mode), (None, 10, Mode::Hard));
    // Nothing matches: the defaults.
    assert_eq!(p.effective(&meta(Some("dev"), &[])).rule, None);
}

#[test]
fn explicit_metadata_wins_over_rules_and_defaults() {
    let p = parse(&format!("{HEAD}{RULES}")).unwrap();
    let mut m = meta(Some("prod"), &[]);
    m.mode = Some(Mode::Hard);
    m.priority = Some(3);
    let e = p.effective(&m);
    // The rule still decides what the metadata leaves to it.
    assert_eq!(
        (e.rule.as_deref(), e.mode, e.priority),
        (Some("prod"), Mode::Hard, 3)
    );
    let mut m = meta(Some("dev"), &[]);
    m.mode = Some(Mode::Elastic);
    m.priority = Some(0);
    let e = p.effective(&m);
    assert_eq!(
        (e.rule.as_deref(), e.mode, e.priority),
        (None, Mode::Elastic, 0)
    );
    // And the controller is asked for what the policy decided.
    let c = e.control(&m);
    assert_eq!(
        (c.mode, c.priority, c.target_percent),
        (Mode::Elastic, 0, 30.0)
    );
}

/// The error for `body` after the header: its line, field and text.
fn refused(body: &str) -> (Option<usize>, Option<String>, String) {
    let e = parse(&format!("{HEAD}{body}")).unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with("policy file /etc/tessera/policy.yaml, line "),
        "{text}"
    );
    (e.line(), e.field().map(str::to_owned), text)
}

#[track_caller]
fn assert_refused(body: &str, line: usize, field: Option<&str>, says: &[&str]) {
    let (l, f, text) = refused(body);
    assert_eq!(l, Some(line), "line of {text}");
    assert_eq!(f.as_deref(), field, "field of {text}");
    for s in says {
        assert!(text.contains(s), "{text:?} lacks {s:?}");
    }
}

#[test]
fn unknown_fields_are_named_with_their_line() {
    assert_refused(
        "rule:\n  - name: a\n",
        3,
        None,
        &["unknown field `rule`", "expected one of"],
    );
    assert_refused(
        "rules:\n  - name: a\n    match:\n      podLabel: {a: b}\n    priority: 1\n",
        6,
        Some("rules[0].match"),
        &["unknown field `podLabel`", "namespaces", "podLabels"],
    );
    assert_refused(
        "defaults:\n  computMode: hard\n",
        4,
        Some("defaults"),
        &["unknown field `computMode`", "computeMode"],
    );
    assert_refused(
        "rules:\n  - name: a\n    match: {namespaces: [x]}\n    throttle: 5\n",
        6,
        Some("rules[0]"),
        &["unknown field `throttle`"],
    );
}

#[test]
fn header_errors_name_the_field() {
    let e = parse("apiVersion: tessera.dev/v1\nkind: Policy\n").unwrap_err();
    let t = e.to_string();
    assert_eq!((e.line(), e.field()), (Some(1), Some("apiVersion")), "{t}");
    assert!(t.contains("accepted: tessera.dev/v1alpha1"), "{t}");
    let e = parse("apiVersion: tessera.dev/v1alpha1\nkind: ConfigMap\n").unwrap_err();
    assert_eq!((e.line(), e.field()), (Some(2), Some("kind")), "{e}");
    assert!(e.to_string().contains("accepted: Policy"), "{e}");
    let e = parse("kind: Policy\n").unwrap_err().to_string();
    assert!(e.contains("missing field `apiVersion`"), "{e}");
    let e = parse("# nothing here\n\n").unwrap_err();
    assert!(e.to_string().contains("the file is empty"), "{e}");
    let e = parse("just a string\n").unwrap_err().to_string();
    assert!(e.contains("line 1"), "{e}");
}

#[test]
fn actions_modes_and_priorities_out_of_range_are_refused() {
    assert_refused(
        "defaults:\n  bypassAction: throttle\n",
        4,
        Some("defaults.bypassAction"),
        &[
            "\"throttle\", which holds compute only (computeOverageAction)",
            "accepted: alert, deny, freeze, kill",
        ],
    );
    assert_refused(
        "defaults:\n  memoryOverageAction: hold\n",
        4,
        Some("defaults.memoryOverageAction"),
        &["unknown variant `hold`", "alert", "deny", "freeze", "kill"],
    );
    assert_refused(
        "rules:\n  - name: a\n    match: {namespaces: [x]}\n    computeOverageAction: cap\n",
        6,
        Some("rules[0].computeOverageAction"),
        &["unknown variant `cap`", "throttle"],
    );
    assert_refused(
        "rules:\n  - name: a\n    match: {namespaces: [x]}\n    memoryOverageAction: Kill\n",
        6,
        Some("rules[0].memoryOverageAction"),
        &["unknown variant `Kill`"],
    );
    assert_refused(
        "rules:\n  - name: a\n    match: {namespaces: [x]}\n    computeMode: soft\n",
        6,
        Some("rules[0].computeMode"),
        &["unknown variant `soft`", "hard", "elastic"],
    );
    for (value, says) in [
        ("101", "is 101; accepted: 0 to 100"),
        ("-1", "is -1; accepted: 0 to 100"),
        ("99999999999999999999", "0 to 100"),
        ("high", "an integer from 0 to 100"),
        ("1.5", "an integer from 0 to 100"),
        ("", "an integer from 0 to 100"),
    ] {
        assert_refused(
            &format!("defaults:\n  priority: {value}\n"),
            4,
            Some("defaults.priority"),
            &[says],
        );
    }
}

#[test]
fn rule_errors_point_at_the_rule() {
    // The second rule of this name is the one named, at its line.
    assert_refused(
        "rules:\n  - name: a\n    match: {namespaces: [x]}\n    priority: 1\n  - name: b\n    match: {namespaces: [y]}\n    priority: 2\n  - name: a\n    match: {namespaces: [z]}\n    priority: 3\n",
        10,
        Some("rules[2]"),
        &["rule name \"a\" is also the name of rules[0]"],
    );
    assert_refused(
        "rules:\n  - name: a\n    match: {namespaces: [x]}\n",
        4,
        Some("rules[0]"),
        &[
            "sets nothing",
            "computeMode, priority, bypassAction, memoryOverageAction",
        ],
    );
    assert_refused(
        "rules:\n  - match: {namespaces: [x]}\n    priority: 1\n",
        4,
        Some("rules[0]"),
        &["missing field `name`"],
    );
    assert_refused(
        "rules:\n  - name: a\n    priority: 1\n",
        4,
        Some("rules[0]"),
        &["missing field `match`"],
    );
    assert_refused(
        "rules:\n  - name: Not A Name\n    match: {namespaces: [x]}\n    priority: 1\n",
        4,
        Some("rules[0].name"),
        &["is not a rule name"],
    );
    assert_refused(
        "rules:\n  - name: a\n    match: {namespaces: [x]}\n    priority: 1\n    priority: 2\n",
        4,
        Some("rules[0]"),
        &["duplicate field `priority`"],
    );
    assert_refused(
        "rules:\n  name: a\n",
        4,
        Some("rules"),
        &["expected a list of rules"],
    );
}

#[test]
fn empty_or_malformed_criteria_are_refused() {
    let rule = |m: &str| format!("rules:\n  - name: a\n    priority: 1\n    match:{m}\n");
    assert_refused(
        &rule(" {}"),
        6,
        Some("rules[0].match"),
        &[
            "sets no criterion",
            "namespaces (a list), podLabels (a map)",
        ],
    );
    assert_refused(&rule(""), 6, Some("rules[0].match"), &["sets no criterion"]);
    assert_refused(
        &rule(" {namespaces: []}"),
        6,
        Some("rules[0].match.namespaces"),
        &["is an empty list"],
    );
    assert_refused(
        &rule(" {podLabels: {}}"),
        6,
        Some("rules[0].match.podLabels"),
        &["is an empty map"],
    );
    assert_refused(
        &rule("\n      namespaces: prod"),
        7,
        Some("rules[0].match.namespaces"),
        &["expected a list of namespaces"],
    );
    assert_refused(
        &rule("\n      namespaces: [prod, Research]"),
        7,
        Some("rules[0].match.namespaces[1]"),
        &["\"Research\" is not a namespace name", "[a-z0-9-]"],
    );
    assert_refused(
        &rule("\n      podLabels:\n        tier: [a]"),
        8,
        Some("rules[0].match.podLabels.tier"),
        &["expected a label value"],
    );
    // A number is the text written (as Kubernetes would store it quoted).
    let p = parse(&format!(
        "{HEAD}{}",
        rule("\n      podLabels:\n        tier: 010")
    ))
    .unwrap();
    assert_eq!(p.rules[0].matcher.pod_labels["tier"], "010");
    assert_refused(
        &rule("\n      podLabels:\n        tier: -x"),
        8,
        Some("rules[0].match.podLabels.tier"),
        &["\"-x\" is not a label value"],
    );
    let (line, field, text) = refused(&rule("\n      podLabels:\n        bad key!: x"));
    assert_eq!(line, Some(8), "{text}");
    assert!(
        field.is_some_and(|f| f.starts_with("rules[0].match.podLabels")),
        "{text}"
    );
    assert!(text.contains("is not a label key"), "{text}");
    assert_refused(
        &rule("\n      podLabels:\n        tier: a\n        tier: b"),
        8,
        Some("rules[0].match.podLabels"),
        &["label \"tier\" is given twice"],
    );
}

#[test]
fn yaml_syntax_errors_name_the_line() {
    let (line, _, text) = refused("rules:\n  - name: a\n    match: {namespaces: [x}\n");
    assert_eq!(line, Some(5), "{text}");
    let (line, _, text) = refused("defaults:\n  priority: 1\n bypassAction: kill\n");
    assert_eq!(line, Some(5), "{text}");
    let (line, _, text) = refused("defaults:\n\tpriority: 1\n");
    assert_eq!(line, Some(4), "{text}");
    let (line, _, text) = refused("defaults:\n  priority: [1\n");
    assert!(line.is_some_and(|l| l >= 4), "{text}");
}

#[test]
fn files_too_large_not_utf8_or_not_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("policy.yaml");
    std::fs::write(&p, format!("{HEAD}# {}\n", "x".repeat(2 << 20))).unwrap();
    let e = file::read(&p).unwrap_err().to_string();
    assert!(e.contains("accepted: at most 1048576"), "{e}");
    std::fs::write(&p, b"apiVersion: tessera.dev/v1alpha1\nkind: \xff\n").unwrap();
    let e = file::read(&p).unwrap_err();
    assert_eq!(e.line(), Some(2), "{e}");
    assert!(e.to_string().contains("not UTF-8"), "{e}");
    let e = file::read(dir.path()).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
    let e = file::read(&dir.path().join("none.yaml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot read policy file"), "{e}");
}

#[test]
fn matching_labels_are_exact() {
    let m = Match {
        namespaces: Vec::new(),
        pod_labels: BTreeMap::from([("tier".to_owned(), String::new())]),
    };
    // An empty value matches only an empty value, not a missing label.
    assert!(!m.matches(Some("x"), &BTreeMap::new()));
    assert!(m.matches(
        Some("x"),
        &BTreeMap::from([("tier".to_owned(), String::new())])
    ));
    assert!(!m.matches(
        Some("x"),
        &BTreeMap::from([("Tier".to_owned(), String::new())])
    ));
}
