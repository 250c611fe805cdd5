//! Kubernetes label and namespace syntax, checked wherever labels enter
//! the agent: a container's metadata (its pod's labels) and the node
//! policy's rules (the labels and namespaces they match).
//!
//! The rules are Kubernetes' own (so a label Kubernetes accepts is
//! accepted here, and nothing else):
//! - a key is `[prefix/]name`; the name has 1 to 63 characters of
//!   `[A-Za-z0-9-_.]` and starts and ends with a letter or digit; the
//!   optional prefix is a DNS subdomain (lowercase RFC 1123 labels joined
//!   by `.`, at most 253 characters);
//! - a value is empty or, like a name, 1 to 63 characters of
//!   `[A-Za-z0-9-_.]` starting and ending with a letter or digit;
//! - a namespace is an RFC 1123 label: 1 to 63 characters of `[a-z0-9-]`
//!   starting and ending with a letter or digit.

use std::collections::BTreeMap;

/// Longest label name and value.
pub const MAX_LABEL_LEN: usize = 63;
/// Longest label key prefix (a DNS subdomain).
pub const MAX_PREFIX_LEN: usize = 253;
/// Most labels a container's metadata may carry.
pub const MAX_LABELS: usize = 256;

const KEY_RULE: &str = "accepted: [prefix/]name, the name 1 to 63 of [A-Za-z0-9-_.] starting and ending with a letter or digit, the prefix a lowercase DNS subdomain (e.g. app.kubernetes.io/name)";
const VALUE_RULE: &str =
    "accepted: empty, or 1 to 63 of [A-Za-z0-9-_.] starting and ending with a letter or digit";
const NAMESPACE_RULE: &str = "accepted: 1 to 63 of [a-z0-9-] starting and ending with a letter or digit (a Kubernetes namespace)";

/// Why a label key, label value, namespace or `--label` argument was
/// refused; the message says what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// Not a label key.
    #[error("{key:?} is not a label key; {KEY_RULE}")]
    Key {
        /// The key as given.
        key: String,
    },
    /// Not a label value.
    #[error("{value:?} is not a label value; {VALUE_RULE}")]
    Value {
        /// The value as given.
        value: String,
    },
    /// Not a namespace name.
    #[error("{namespace:?} is not a namespace name; {NAMESPACE_RULE}")]
    Namespace {
        /// The name as given.
        namespace: String,
    },
    /// A `--label` argument of neither form.
    #[error("{arg:?} is neither key=value nor key- (remove); e.g. tier=inference")]
    Arg {
        /// The argument as given.
        arg: String,
    },
}

/// 1 to 63 of `[A-Za-z0-9-_.]`, alphanumeric at both ends.
fn is_qualified_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL_LEN
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// An RFC 1123 label: 1 to 63 of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let end = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= MAX_LABEL_LEN
        && end(&b[0])
        && end(&b[b.len() - 1])
        && b.iter().all(|c| end(c) || *c == b'-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_PREFIX_LEN && s.split('.').all(is_dns_label)
}

/// Checks a label key; the error says what is accepted.
pub fn check_key(key: &str) -> Result<(), LabelError> {
    let ok = match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_qualified_name(name),
        None => is_qualified_name(key),
    };
    if ok {
        Ok(())
    } else {
        Err(LabelError::Key {
            key: key.to_owned(),
        })
    }
}

/// Checks a label value; the error says what is accepted.
pub fn check_value(value: &str) -> Result<(), LabelError> {
    if value.is_empty() || is_qualified_name(value) {
        Ok(())
    } else {
        Err(LabelError::Value {
            value: value.to_owned(),
        })
    }
}

/// Checks a namespace name; the error says what is accepted.
pub fn check_namespace(ns: &str) -> Result<(), LabelError> {
    if is_dns_label(ns) {
        Ok(())
    } else {
        Err(LabelError::Namespace {
            namespace: ns.to_owned(),
        })
    }
}

/// Checks a set of labels: the key of the first bad one (or `None` when
/// there are too many) and why.
pub fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), (Option<String>, String)> {
    if labels.len() > MAX_LABELS {
        return Err((
            None,
            format!("has {} labels; accepted: up to {MAX_LABELS}", labels.len()),
        ));
    }
    for (k, v) in labels {
        check_key(k).map_err(|e| (Some(k.clone()), e.to_string()))?;
        check_value(v).map_err(|e| (Some(k.clone()), e.to_string()))?;
    }
    Ok(())
}

/// What a `--label` argument asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelEdit {
    /// `key=value`: set the label.
    Set(String, String),
    /// `key-`: remove the label (as `kubectl label` writes it; a valid
    /// key never ends in `-`).
    Remove(String),
}

/// Parses `key=value` or `key-`, checking both parts.
pub fn parse_label_arg(arg: &str) -> Result<LabelEdit, LabelError> {
    if let Some((k, v)) = arg.split_once('=') {
        check_key(k)?;
        check_value(v)?;
        return Ok(LabelEdit::Set(k.to_owned(), v.to_owned()));
    }
    if let Some(k) = arg.strip_suffix('-') {
        check_key(k)?;
        return Ok(LabelEdit::Remove(k.to_owned()));
    }
    Err(LabelError::Arg {
        arg: arg.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_kubernetes() {
        for ok in [
            "tier",
            "app.kubernetes.io/component",
            "a",
            "A_b-c.d",
            "tessera.dev/x9",
            &"a".repeat(63),
        ] {
            assert!(check_key(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "a b",
            "/a",
            "a/",
            "Upper.Case/a",
            "a..b/c",
            "a/b/c",
            "ä",
            &"a".repeat(64),
            &format!("{}/a", "a".repeat(254)),
        ] {
            let e = check_key(bad).unwrap_err().to_string();
            assert!(e.contains("accepted: [prefix/]name"), "{bad}: {e}");
        }
    }

    #[test]
    fn values_and_namespaces_follow_kubernetes() {
        for ok in ["", "inference", "v1.2_3-x", &"Z".repeat(63)] {
            assert!(check_value(ok).is_ok(), "{ok:?}");
        }
        for bad in ["-x", "x.", "a/b", "a b", &"z".repeat(64)] {
            assert!(check_value(bad).is_err(), "{bad:?}");
        }
        for ok in ["prod", "kube-system", "a1"] {
            assert!(check_namespace(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Prod", "a_b", "a.b", "-a", &"a".repeat(64)] {
            assert!(check_namespace(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn label_arguments_set_or_remove() {
        assert_eq!(
            parse_label_arg("tier=inference").unwrap(),
            LabelEdit::Set("tier".into(), "inference".into())
        );
        assert_eq!(
            parse_label_arg("tier=").unwrap(),
            LabelEdit::Set("tier".into(), String::new())
        );
        assert_eq!(
            parse_label_arg("tier-").unwrap(),
            LabelEdit::Remove("tier".into())
        );
        assert!(parse_label_arg("tier").is_err());
        assert!(parse_label_arg("ti er=x").is_err());
        assert!(parse_label_arg("tier=a=b").is_err());
    }
}
