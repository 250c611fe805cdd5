//! The agent's unit of management: a container's region directory under
//! one root, `<root>/<id>/{control,usage,meta.json}`.
//!
//! - [`id`]: container ids, safe as one path component;
//! - [`labels`]: Kubernetes label and namespace syntax;
//! - [`meta`]: the metadata file (who the container is, what it was
//!   granted), validated as untrusted input;
//! - [`store`]: atomic create / update / remove / list under the root, with
//!   malformed and foreign entries skipped with the reason;
//! - [`pids`]: host pids of a container (its cgroup, `NSpid`) joined with
//!   the processes registered in its usage region;
//! - [`live`]: whether any process still uses a directory;

pub mod id;
pub mod labels;
pub mod live;
pub mod meta;
pub mod pids;
pub mod proc_cache;
pub mod reclaim;
pub mod store;

pub use id::{ContainerId, IdError};
pub use meta::{GpuGrant, META_FILE, MetaError, Metadata, Mode};
pub use store::{Container, Listing, Skipped, Store, StoreError};
