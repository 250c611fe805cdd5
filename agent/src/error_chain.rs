//! Errors as one line for logs and the command line, causes included.

use std::error::Error;

/// `error: cause: cause's cause…`, leaving out a cause whose text the
/// previous message already quotes (nvml-wrapper repeats its libloading
/// error, for one).
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
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot load ebpf object /x.o")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("library: {0}")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn causes_follow_the_error_once() {
        let e = Outer(Middle(std::io::Error::other("no such file")));
        // The io error's text is already part of Middle's.
        assert_eq!(
            with_causes(&e),
            "cannot load ebpf object /x.o: library: no such file"
        );
        let plain = std::io::Error::other("denied");
        assert_eq!(with_causes(&plain), "denied");
    }
}
