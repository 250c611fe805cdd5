//! Command-line and environment settings of GPU discovery.

use std::ffi::OsString;

use super::{GpuError, NvmlBackend};

/// The NVML library the agent loads when none is named.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

/// GPU discovery flags, to be flattened into the agent's arguments.
#[derive(clap::Args, Clone, Debug)]
pub struct GpuArgs {
    /// The NVML library to load: a file name looked up like any shared
    /// library, or a path (e.g. the simulator's libnvidia-ml.so.1).
    #[arg(
        long = "nvml-lib",
        value_name = "LIB",
        env = "TESSERA_NVML_LIB",
        default_value = DEFAULT_NVML_LIB,
        global = true
    )]
    pub nvml_lib: OsString,
}

impl GpuArgs {
    /// Loads and initialises NVML.
    pub fn backend(&self) -> Result<NvmlBackend, GpuError> {
        NvmlBackend::load(&self.nvml_lib)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        gpu: GpuArgs,
    }

    #[test]
    fn library_defaults_to_the_soname() {
        let cli = Cli::try_parse_from(["agent"]).unwrap();
        if std::env::var_os("TESSERA_NVML_LIB").is_none() {
            assert_eq!(cli.gpu.nvml_lib, DEFAULT_NVML_LIB);
        }
        let cli = Cli::try_parse_from(["agent", "--nvml-lib", "/x/libnvidia-ml.so.1"]).unwrap();
        assert_eq!(cli.gpu.nvml_lib, "/x/libnvidia-ml.so.1");
    }
}
