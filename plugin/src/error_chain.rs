//! Errors as one line for a person to read, causes included.

use std::error::Error;

/// `error: cause: cause's cause…`.
pub fn with_causes(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading pod default/web")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn causes_follow_the_error() {
        let e = Outer(std::io::Error::other("connection reset"));
        assert_eq!(with_causes(&e), "reading pod default/web: connection reset");
    }
}
