//! An error and its causes on one line: `error: cause: cause's cause…`.
//!
//! Every Tessera binary reports errors this way — the agent and scheduler
//! in logs and HTTP answers, `libtessera.so` and the simulated driver on
//! stderr of the process they are loaded into — so one line always holds
//! the whole story and nothing else. Two rules keep it readable:
//!
//! - a cause whose text the previous message already quotes is left out
//!   (some libraries repeat their source in their own message, e.g.
//!   nvml-wrapper with its libloading error);
//! - line breaks inside any message become spaces, so the result is one
//!   line whatever the causes say.
//!
//! [`PathIoError`] is the one error of a file system call on a path
//! (`cannot {action} {path}`, the I/O error as its cause), which the
//! crates' error enums wrap rather than each spelling it out.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::error::Error;
use std::fmt;
use std::path::{Path, PathBuf};

/// `error: cause: cause's cause…` on one line.
pub fn with_causes(error: &dyn Error) -> String {
    let mut out = error.to_string();
    let mut last = out.clone();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !last.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
            last = text;
        }
        source = cause.source();
    }
    if out.contains(['\n', '\r']) {
        out = out
            .split(['\n', '\r'])
            .filter(|part| !part.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
    }
    out
}

/// A file system call on a path failed: `cannot {action} {path}`, with
/// the I/O error as its cause.
#[derive(Debug)]
pub struct PathIoError {
    /// What was attempted, e.g. `read` or `attach device guard to`.
    pub action: &'static str,
    /// The path involved.
    pub path: PathBuf,
    /// The cause.
    pub source: std::io::Error,
}

impl PathIoError {
    /// `cannot {action} {path}` because of `source`.
    pub fn new(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self {
            action,
            path: path.into(),
            source,
        }
    }

    /// For `map_err`: the I/O error of `action` on `path` (copied only
    /// when there is an error).
    pub fn at<'a>(
        action: &'static str,
        path: &'a Path,
    ) -> impl FnOnce(std::io::Error) -> Self + 'a {
        move |source| Self::new(action, path, source)
    }
}

impl fmt::Display for PathIoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot {} {}", self.action, self.path.display())
    }
}

impl Error for PathIoError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot load ebpf object /x.o")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("parsing BTF")]
    struct Middle(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("cannot open libnvidia-ml.so.1: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn causes_follow_the_error_in_order() {
        let e = Outer(Middle(std::io::Error::other("no such file")));
        assert_eq!(
            with_causes(&e),
            "cannot load ebpf object /x.o: parsing BTF: no such file"
        );
    }

    #[test]
    fn a_cause_the_message_already_quotes_is_left_out() {
        let e = Repeats(std::io::Error::other("not found"));
        assert_eq!(with_causes(&e), "cannot open libnvidia-ml.so.1: not found");
    }

    #[test]
    fn line_breaks_become_spaces() {
        let e = Middle(std::io::Error::other("no\nway\r\n"));
        assert_eq!(with_causes(&e), "parsing BTF: no way");
    }

    #[test]
    fn a_path_io_error_names_the_action_and_the_path() {
        let e = PathIoError::at("read", Path::new("/run/tessera/usage"))(std::io::Error::other(
            "permission denied",
        ));
        assert_eq!(e.to_string(), "cannot read /run/tessera/usage");
        assert_eq!(
            with_causes(&e),
            "cannot read /run/tessera/usage: permission denied"
        );
        let e = PathIoError::new("map", "/x", std::io::Error::other("mmap returned null"));
        assert_eq!((e.action, e.path.as_path()), ("map", Path::new("/x")));
    }
}
