//! Errors as one line for logs and the command line, causes included (the
//! shared helper of every Tessera crate, `tessera-error-chain`).

pub use tessera_error_chain::with_causes;
