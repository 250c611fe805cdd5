//! Where the container's region is, from the filesystem and (for
//! development outside containers only) the environment.
//!
//! Inside a Tessera container the agent mounts the region at
//! `/run/tessera`. `TESSERA_REGION_DIR` is honoured only when
//! `/run/tessera/control` does not exist, so a container cannot point the
//! library at a region of its own making.
//!
//! The environment is read once, through [`Env`], so tests can supply
//! their own.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The region directory inside a container.
pub const CONTAINER_REGION_DIR: &str = "/run/tessera";
/// Development override of the region directory.
pub const ENV_REGION_DIR: &str = "TESSERA_REGION_DIR";

/// Environment lookups.
pub trait Env {
    /// The value of `name`, if set and not empty.
    fn var(&self, name: &str) -> Option<OsString>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<OsString> {
        std::env::var_os(name).filter(|v| !v.is_empty())
    }
}

/// The region directory to use: `/run/tessera` when it has a control
/// file, else `TESSERA_REGION_DIR`, else `/run/tessera` (which then fails
/// with a clear error).
pub fn region_dir(env: &dyn Env, container_dir: &Path) -> PathBuf {
    if container_dir.join("control").exists() {
        return container_dir.to_path_buf();
    }
    env.var(ENV_REGION_DIR)
        .map(PathBuf::from)
        .unwrap_or_else(|| container_dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct MapEnv(HashMap<&'static str, &'static str>);
    impl Env for MapEnv {
        fn var(&self, name: &str) -> Option<OsString> {
            self.0.get(name).map(OsString::from)
        }
    }

    #[test]
    fn override_only_outside_containers() {
        let dir = tempfile::tempdir().unwrap();
        let env = MapEnv(HashMap::from([(ENV_REGION_DIR, "/tmp/dev-region")]));
        // No control file in the container dir: the override applies.
        assert_eq!(
            region_dir(&env, dir.path()),
            PathBuf::from("/tmp/dev-region")
        );
        std::fs::write(dir.path().join("control"), b"x").unwrap();
        assert_eq!(region_dir(&env, dir.path()), dir.path());
        let empty = MapEnv(HashMap::new());
        let other = tempfile::tempdir().unwrap();
        assert_eq!(region_dir(&empty, other.path()), other.path());
    }
}
