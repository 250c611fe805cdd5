//! The policy file: YAML in the shape of `deploy/examples/policy.yaml`.
//!
//! ```yaml
//! apiVersion: tessera.dev/v1alpha1
//! kind: Policy
//! defaults:                      # optional; each field optional
//!   computeMode: hard            # hard | elastic
//!   priority: 0                  # 0 to 100, higher is served first
//!   bypassAction: alert          # alert | deny | freeze | kill
//!   memoryOverageAction: kill    # alert | deny | freeze | kill
//!   computeOverageAction: throttle  # alert | deny | throttle | freeze | kill
//! rules:                         # optional; the first match wins
//!   - name: research-lends-idle-compute   # unique
//!     match:                     # at least one criterion
//!       namespaces: [research]   # any of these
//!       podLabels: {tier: batch} # all of these
//!     computeMode: elastic       # at least one of the five fields
//! ```
//!
//! The file is checked completely before anything of it is used: unknown
//! fields, wrong types, unknown actions and modes, a priority out of
//! range, a wrong `apiVersion` or `kind`, a rule without a name, a name
//! used twice, a rule that sets nothing, an empty `match` (which would
//! match everything), an empty criterion (which would match nothing), and
//! namespaces and labels that Kubernetes would not accept. Every error
//! names the file, the line and column, the field path (e.g.
//! `rules[1].match.podLabels`) and what is accepted.
//!
//! The checks run inside the deserializer (visitors that refuse a bad
//! value where it is read), so the YAML parser attaches the position and
//! the path of the value to each error; nothing is checked after the
//! parse, where positions are no longer known.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::{Action, Match, Policy, Rule, Settings};
use crate::containers::labels;
use crate::containers::meta::MAX_PRIORITY;
use crate::control::Mode;

/// The `apiVersion` this agent reads.
pub const API_VERSION: &str = "tessera.dev/v1alpha1";
/// The `kind` of a policy file.
pub const KIND: &str = "Policy";
/// Largest policy file read (bytes).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be opened or read.
    #[error("cannot read policy file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The path names a directory or another non-file.
    #[error("policy file {path} is not a regular file; accepted: a YAML file")]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error("policy file {path} has {size} bytes; accepted: at most {MAX_FILE_BYTES}")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
    /// The text is not a policy of the accepted shape.
    #[error("policy file {path}{}: {}{message}", at(*.line, *.column), field_prefix(.field.as_deref()))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Line of the offending value (1-based), when known.
        line: Option<usize>,
        /// Its column (1-based), when known.
        column: Option<usize>,
        /// Its path in the document, e.g. `rules[1].match.podLabels`
        /// (none: the document itself).
        field: Option<String>,
        /// What is wrong and what is accepted.
        message: String,
    },
}

fn at(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(", line {l}, column {c}"),
        (Some(l), None) => format!(", line {l}"),
        _ => String::new(),
    }
}

fn field_prefix(field: Option<&str>) -> String {
    field.map(|f| format!("{f}: ")).unwrap_or_default()
}

impl PolicyError {
    /// The line named by the error, if any.
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::Invalid { line, .. } => *line,
            _ => None,
        }
    }

    /// The field path named by the error, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. } => field.as_deref(),
            _ => None,
        }
    }
}

/// The parser's error as [`PolicyError::Invalid`]: its position, and its
/// text split into the value's path and the message (the parser writes
/// `PATH: MESSAGE at line L column C`).
fn invalid(path: &Path, e: &serde_norway::Error) -> PolicyError {
    let location = e.location();
    let mut text = e.to_string();
    if let Some(l) = &location {
        let mark = format!(" at line {} column {}", l.line(), l.column());
        if let Some(i) = text.find(&mark) {
            text.replace_range(i..i + mark.len(), "");
        }
    }
    // A path has no spaces (`rules[1].match`, `.` for the root is not
    // written); a message's first word followed by ':' never stands alone.
    let (field, message) = match text.split_once(": ") {
        Some((p, rest)) if !p.is_empty() && !p.contains(char::is_whitespace) => {
            (Some(p.to_owned()), rest.to_owned())
        }
        _ => (None, text),
    };
    PolicyError::Invalid {
        path: path.to_path_buf(),
        line: location.as_ref().map(serde_norway::Location::line),
        column: location.as_ref().map(serde_norway::Location::column),
        field,
        message,
    }
}

/// Parses and checks the text of the policy file `path` (named in errors).
pub fn parse(path: &Path, text: &str) -> Result<Policy, PolicyError> {
    let blank = text.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#') || l == "---"
    });
    if blank {
        return Err(PolicyError::Invalid {
            path: path.to_path_buf(),
            line: Some(1),
            column: Some(1),
            field: None,
            message: format!(
                "the file is empty; accepted: a policy (apiVersion: {API_VERSION}, kind: {KIND}, defaults, rules)"
            ),
        });
    }
    let file: FilePolicy = serde_norway::from_str(text).map_err(|e| invalid(path, &e))?;
    Ok(file.into_policy())
}

/// Reads, parses and checks the policy file `path` (symlinks followed).
pub fn read(path: &Path) -> Result<Policy, PolicyError> {
    let read_err = |source| PolicyError::Read {
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::File::open(path).map_err(read_err)?;
    let meta = f.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(PolicyError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(PolicyError::TooLarge {
            path: path.to_path_buf(),
            size: meta.len().max(bytes.len() as u64),
        });
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        let good = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = good.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = good.len() - good.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) + 1;
        PolicyError::Invalid {
            path: path.to_path_buf(),
            line: Some(line),
            column: Some(column),
            field: None,
            message: "the text is not UTF-8; accepted: a UTF-8 YAML file".to_owned(),
        }
    })?;
    parse(path, &text)
}

/// `policy` in the file's shape (every default written out), as YAML.
pub fn to_yaml(policy: &Policy) -> String {
    let d = &policy.defaults;
    let out = OutPolicy {
        api_version: API_VERSION,
        kind: KIND,
        defaults: OutSettings {
            compute_mode: Some(d.mode),
            priority: Some(d.priority),
            bypass_action: Some(d.bypass_action),
            memory_overage_action: Some(d.memory_overage_action),
            compute_overage_action: Some(d.compute_overage_action),
        },
        rules: policy
            .rules
            .iter()
            .map(|r| OutRule {
                name: &r.name,
                matcher: OutMatch {
                    namespaces: &r.matcher.namespaces,
                    pod_labels: &r.matcher.pod_labels,
                },
                set: OutSettings {
                    compute_mode: r.set.mode,
                    priority: r.set.priority,
                    bypass_action: r.set.bypass_action,
                    memory_overage_action: r.set.memory_overage_action,
                    compute_overage_action: r.set.compute_overage_action,
                },
            })
            .collect(),
    };
    serde_norway::to_string(&out).unwrap_or_else(|e| format!("# cannot write the policy: {e}\n"))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OutPolicy<'a> {
    api_version: &'static str,
    kind: &'static str,
    defaults: OutSettings,
    rules: Vec<OutRule<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OutSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    compute_mode: Option<Mode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bypass_action: Option<Action>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_overage_action: Option<Action>,
    #[serde(skip_serializing_if = "Option::is_none")]
    compute_overage_action: Option<Action>,
}

#[derive(Serialize)]
struct OutRule<'a> {
    name: &'a str,
    #[serde(rename = "match")]
    matcher: OutMatch<'a>,
    #[serde(flatten)]
    set: OutSettings,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OutMatch<'a> {
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    namespaces: &'a [String],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pod_labels: &'a BTreeMap<String, String>,
}

// ---- The file as read. Each check sits in the visitor of the value it
// ---- checks, so the parser names that value's line and path.

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FilePolicy {
    #[serde(deserialize_with = "api_version")]
    #[allow(dead_code, reason = "checked while parsing; nothing to keep")]
    api_version: (),
    #[serde(deserialize_with = "kind")]
    #[allow(dead_code, reason = "checked while parsing; nothing to keep")]
    kind: (),
    #[serde(default)]
    defaults: FileSettings,
    #[serde(default)]
    rules: Rules,
}

impl FilePolicy {
    fn into_policy(self) -> Policy {
        let mut p = Policy::default();
        let d = self.defaults.into_settings();
        let e = &mut p.defaults;
        e.mode = d.mode.unwrap_or(e.mode);
        e.priority = d.priority.unwrap_or(e.priority);
        e.bypass_action = d.bypass_action.unwrap_or(e.bypass_action);
        e.memory_overage_action = d.memory_overage_action.unwrap_or(e.memory_overage_action);
        e.compute_overage_action = d.compute_overage_action.unwrap_or(e.compute_overage_action);
        p.rules = self.rules.0;
        p
    }
}

/// The overridable fields, as `defaults` and every rule write them.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileSettings {
    #[serde(default, deserialize_with = "present")]
    compute_mode: Option<Mode>,
    #[serde(default, deserialize_with = "present")]
    priority: Option<Priority>,
    #[serde(default, deserialize_with = "process_action")]
    bypass_action: Option<Action>,
    #[serde(default, deserialize_with = "process_action")]
    memory_overage_action: Option<Action>,
    #[serde(default, deserialize_with = "present")]
    compute_overage_action: Option<Action>,
}

impl FileSettings {
    fn into_settings(self) -> Settings {
        Settings {
            mode: self.compute_mode,
            priority: self.priority.map(|p| p.0),
            bypass_action: self.bypass_action,
            memory_overage_action: self.memory_overage_action,
            compute_overage_action: self.compute_overage_action,
        }
    }
}

/// A field that, when written, must hold a value (an empty `priority:`
/// is refused as the wrong type rather than read as "not set").
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// `bypassAction`, `memoryOverageAction`: any action but the throttle,
/// which holds compute and nothing else.
fn process_action<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Action>, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = Action;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("one of alert, deny, freeze, kill")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Action, E> {
            match Action::ALL.iter().find(|a| a.as_str() == v) {
                Some(Action::Throttle) => Err(E::custom(
                    "is \"throttle\", which holds compute only (computeOverageAction); accepted: alert, deny, freeze, kill",
                )),
                Some(a) => Ok(*a),
                None => Err(E::custom(format!(
                    "unknown variant `{v}`, expected one of `alert`, `deny`, `freeze`, `kill`"
                ))),
            }
        }
    }
    d.deserialize_str(V).map(Some)
}

/// A string that must be exactly `.0`.
struct Exact(&'static str);

impl Visitor<'_> for Exact {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the string {}", self.0)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        if v == self.0 {
            Ok(())
        } else {
            Err(E::custom(format!("is {v:?}; accepted: {}", self.0)))
        }
    }
}

fn api_version<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    d.deserialize_str(Exact(API_VERSION))
}

fn kind<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    d.deserialize_str(Exact(KIND))
}

/// `priority`: 0 to [`MAX_PRIORITY`].
struct Priority(u32);

impl<'de> Deserialize<'de> for Priority {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Priority;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "an integer from 0 to {MAX_PRIORITY} (higher is served first)"
                )
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Priority, E> {
                match u32::try_from(v) {
                    Ok(p) if p <= MAX_PRIORITY => Ok(Priority(p)),
                    _ => Err(E::custom(format!(
                        "is {v}; accepted: 0 to {MAX_PRIORITY} (higher is served first)"
                    ))),
                }
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Priority, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!(
                        "is {v}; accepted: 0 to {MAX_PRIORITY} (higher is served first)"
                    ))),
                }
            }
        }
        // Any: a negative number reaches visit_i64 and is named as such.
        d.deserialize_any(V)
    }
}

/// A string checked by `check` (label keys and values, namespaces, rule
/// names); the check's error is the message.
struct CheckedStr<P> {
    what: &'static str,
    check: fn(&str) -> Result<(), P>,
}

impl<P: fmt::Display> Visitor<'_> for CheckedStr<P> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        (self.check)(v).map_err(E::custom)?;
        Ok(v.to_owned())
    }
}

/// A rule name that is not one (the message of a [`PolicyError::Invalid`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "{name:?} is not a rule name; accepted: 1 to 63 of [A-Za-z0-9-_.] starting and ending with a letter or digit"
)]
struct BadRuleName {
    name: String,
}

fn check_rule_name(name: &str) -> Result<(), BadRuleName> {
    if !name.is_empty() && labels::check_value(name).is_ok() {
        Ok(())
    } else {
        Err(BadRuleName {
            name: name.to_owned(),
        })
    }
}

macro_rules! checked_string {
    ($name:ident, $what:expr, $check:expr) => {
        struct $name(String);

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_str(CheckedStr {
                    what: $what,
                    check: $check,
                })
                .map($name)
            }
        }
    };
}

checked_string!(RuleName, "a rule name (a string)", check_rule_name);
checked_string!(
    Namespace,
    "a namespace name (a string)",
    labels::check_namespace
);
checked_string!(LabelKey, "a label key (a string)", labels::check_key);
// A plain scalar is its text as written (`tier: 010` is "010").
checked_string!(LabelValue, "a label value (a string)", labels::check_value);

/// `rules`: a list whose names are unique.
#[derive(Default)]
struct Rules(Vec<Rule>);

impl<'de> Deserialize<'de> for Rules {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Rules;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of rules")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Rules, A::Error> {
                let mut rules = Vec::new();
                while let Some(r) = seq.next_element_seed(RuleSeed { earlier: &rules })? {
                    rules.push(r);
                }
                Ok(Rules(rules))
            }
        }
        d.deserialize_seq(V)
    }
}

/// One rule, checked against the rules before it (its name is new).
struct RuleSeed<'a> {
    earlier: &'a [Rule],
}

impl<'de> DeserializeSeed<'de> for RuleSeed<'_> {
    type Value = Rule;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Rule, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RuleSeed<'_> {
    type Value = Rule;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a rule: a map with name, match and the fields it sets")
    }

    fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<Rule, M::Error> {
        let raw = FileRule::deserialize(MapAccessDeserializer::new(map))?;
        let name = raw.name.0;
        if let Some(i) = self.earlier.iter().position(|r| r.name == name) {
            return Err(de::Error::custom(format!(
                "rule name {name:?} is also the name of rules[{i}]; accepted: names used by one rule only"
            )));
        }
        let set = FileSettings {
            compute_mode: raw.compute_mode,
            priority: raw.priority,
            bypass_action: raw.bypass_action,
            memory_overage_action: raw.memory_overage_action,
            compute_overage_action: raw.compute_overage_action,
        }
        .into_settings();
        if set.is_empty() {
            return Err(de::Error::custom(format!(
                "rule {name:?} sets nothing; accepted: at least one of computeMode, priority, bypassAction, memoryOverageAction, computeOverageAction"
            )));
        }
        Ok(Rule {
            name,
            matcher: raw.matcher.0,
            set,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileRule {
    name: RuleName,
    #[serde(rename = "match")]
    matcher: Criteria,
    #[serde(default, deserialize_with = "present")]
    compute_mode: Option<Mode>,
    #[serde(default, deserialize_with = "present")]
    priority: Option<Priority>,
    #[serde(default, deserialize_with = "process_action")]
    bypass_action: Option<Action>,
    #[serde(default, deserialize_with = "process_action")]
    memory_overage_action: Option<Action>,
    #[serde(default, deserialize_with = "present")]
    compute_overage_action: Option<Action>,
}

/// `match`: at least one criterion.
struct Criteria(Match);

impl<'de> Deserialize<'de> for Criteria {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Criteria;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map with namespaces, podLabels or both")
            }

            fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<Criteria, M::Error> {
                let raw = FileMatch::deserialize(MapAccessDeserializer::new(map))?;
                if raw.namespaces.is_none() && raw.pod_labels.is_none() {
                    return Err(de::Error::custom(
                        "sets no criterion (it would match every container); accepted: namespaces (a list), podLabels (a map), or both",
                    ));
                }
                Ok(Criteria(Match {
                    namespaces: raw.namespaces.map(|n| n.0).unwrap_or_default(),
                    pod_labels: raw.pod_labels.map(|l| l.0).unwrap_or_default(),
                }))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileMatch {
    #[serde(default, deserialize_with = "present")]
    namespaces: Option<Namespaces>,
    #[serde(default, deserialize_with = "present")]
    pod_labels: Option<Labels>,
}

/// `namespaces`: a non-empty list.
struct Namespaces(Vec<String>);

impl<'de> Deserialize<'de> for Namespaces {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Namespaces;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of namespaces, e.g. [research, prod]")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Namespaces, A::Error> {
                let mut out = Vec::new();
                while let Some(Namespace(ns)) = seq.next_element()? {
                    if !out.contains(&ns) {
                        out.push(ns);
                    }
                }
                if out.is_empty() {
                    return Err(de::Error::custom(
                        "is an empty list (it would match no container); accepted: one or more namespaces, or no namespaces field",
                    ));
                }
                Ok(Namespaces(out))
            }
        }
        d.deserialize_seq(V)
    }
}

/// `podLabels`: a non-empty map without repeated keys.
struct Labels(BTreeMap<String, String>);

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Labels;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of label keys to values, e.g. {tier: inference}")
            }

            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Labels, M::Error> {
                let mut out = BTreeMap::new();
                while let Some(LabelKey(k)) = map.next_key()? {
                    let LabelValue(v) = map.next_value()?;
                    if out.contains_key(&k) {
                        return Err(de::Error::custom(format!(
                            "label {k:?} is given twice; accepted: each key once"
                        )));
                    }
                    out.insert(k, v);
                }
                if out.is_empty() {
                    return Err(de::Error::custom(
                        "is an empty map; accepted: one or more labels, or no podLabels field",
                    ));
                }
                Ok(Labels(out))
            }
        }
        d.deserialize_map(V)
    }
}
