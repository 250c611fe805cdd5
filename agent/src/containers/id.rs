//! Container ids: the names of region directories under the root.
//!
//! An id becomes a path component, so it is checked before any path is
//! built from it: 1 to 128 bytes of ASCII letters, digits, `_`, `-` and
//! `.`, starting with a letter or digit. That excludes `.`/`..`, path
//! separators, NUL, whitespace, control characters and the dot-prefixed
//! names the store uses for its own temporary entries.

use std::fmt;

/// Longest accepted id (bytes).
pub const MAX_ID_LEN: usize = 128;

/// Why an id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "container id {id:?} {problem}; accepted: 1 to {MAX_ID_LEN} ASCII letters, digits, '_', '-' or '.', starting with a letter or digit"
)]
pub struct IdError {
    /// The refused id (lossy if not UTF-8).
    pub id: String,
    /// What is wrong.
    pub problem: &'static str,
}

/// A validated container id (shared: a clone copies no text, and a period
/// clones ids into its maps and views).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerId(std::sync::Arc<str>);

impl ContainerId {
    /// Validates `id`.
    pub fn new(id: &str) -> Result<Self, IdError> {
        let bad = |problem| IdError {
            id: id.to_owned(),
            problem,
        };
        if id.is_empty() {
            return Err(bad("is empty"));
        }
        if id.len() > MAX_ID_LEN {
            return Err(bad("is too long"));
        }
        if !id.as_bytes()[0].is_ascii_alphanumeric() {
            return Err(bad("does not start with a letter or digit"));
        }
        if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return Err(bad("holds a character that is not accepted"));
        }
        Ok(Self(id.into()))
    }

    /// The id as text (safe as one path component).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for ContainerId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_ids_pass() {
        for id in ["a", "job-42", "slurm.1234.0", "0a1b2c3d4e5f", "ns_pod_ctr"] {
            assert_eq!(ContainerId::new(id).unwrap().as_str(), id);
        }
        assert!(ContainerId::new(&"x".repeat(MAX_ID_LEN)).is_ok());
    }

    #[test]
    fn hostile_ids_are_refused_with_the_reason() {
        for (id, why) in [
            ("", "is empty"),
            (".", "does not start"),
            ("..", "does not start"),
            ("../etc", "does not start"),
            ("a/../../etc", "character"),
            ("a/b", "character"),
            (".hidden", "does not start"),
            ("-rf", "does not start"),
            ("a b", "character"),
            ("a\0b", "character"),
            ("a\nb", "character"),
            ("é", "does not start"),
            ("aé", "character"),
        ] {
            let e = ContainerId::new(id).unwrap_err().to_string();
            assert!(e.contains(why), "{id:?}: {e}");
            assert!(e.contains("accepted"), "{e}");
        }
        let long = "x".repeat(MAX_ID_LEN + 1);
        assert!(
            ContainerId::new(&long)
                .unwrap_err()
                .to_string()
                .contains("too long")
        );
    }
}
