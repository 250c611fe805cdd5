//! The agent's one-shot subcommands, each a module over the library's
//! parts: `container` (region directories of containers outside
//! Kubernetes), `region` (one region directory's files) and `policy`
//! (checking a node policy file). `run`, the long-running service, is
//! [`crate::daemon`]. Nothing below this module imports it.

pub mod container;
pub mod policy;
pub mod region;
