//! The kubelet's gRPC contracts, as Tessera speaks them.
//!
//! - [`deviceplugin::v1beta1`]: the device plugin API (kubelet serves
//!   `Registration` on [`deviceplugin::KUBELET_SOCKET`], a plugin serves
//!   `DevicePlugin` on its own socket in the same directory);
//! - [`podresources::v1`]: the PodResources API (kubelet serves
//!   `PodResourcesLister` on [`podresources::KUBELET_SOCKET`]);
//! - [`pluginregistration::v1`]: the plugin watcher's API (a plugin
//!   serves `Registration` on a socket in
//!   [`pluginregistration::REGISTRY_PATH`]);
//! - [`dra::v1`]: the Dynamic Resource Allocation plugin API (a driver
//!   serves `DRAPlugin` on the socket it registers).
//!
//! The `.proto` files in `proto/` were written from the published field
//! tables; the generated code comes from `tonic-prost-build` at build time
//! (compiled by `protox`, no system `protoc`). `tests/wire.rs` pins the
//! field numbers against hand-computed protobuf bytes.

/// `pub mod $module`: the generated messages, clients and servers of gRPC
/// package `$package`, exempt from the lints the generator does not meet.
macro_rules! generated {
    ($module:ident, $package:literal) => {
        #[doc = concat!("Generated messages, clients and servers (gRPC package `", $package, "`).")]
        #[allow(
            missing_docs,
            clippy::all,
            clippy::pedantic,
            clippy::unwrap_used,
            reason = "generated code"
        )]
        pub mod $module {
            tonic::include_proto!($package);
        }
    };
}

pub mod deviceplugin {
    //! Device plugin API v1beta1 and its constants.

    generated!(v1beta1, "v1beta1");

    /// The API version a plugin registers with (`RegisterRequest.version`).
    pub const VERSION: &str = "v1beta1";
    /// Kubelet's device plugin directory (plugin sockets and
    /// `kubelet.sock`).
    pub const DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins/";
    /// File name of kubelet's registration socket in
    /// [`DEVICE_PLUGIN_PATH`].
    pub const KUBELET_SOCKET_NAME: &str = "kubelet.sock";
    /// Kubelet's registration socket.
    pub const KUBELET_SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";
    /// `Device.health` of a usable device.
    pub const HEALTHY: &str = "Healthy";
    /// `Device.health` of an unusable device.
    pub const UNHEALTHY: &str = "Unhealthy";
    /// Longest device ID kubelet accepts.
    pub const MAX_DEVICE_ID_LEN: usize = 63;
}

pub mod podresources {
    //! PodResources API v1 and its constants.

    generated!(v1, "v1");

    /// Kubelet's PodResources directory (mount the directory, not the
    /// socket: kubelet recreates the socket on restart).
    pub const POD_RESOURCES_PATH: &str = "/var/lib/kubelet/pod-resources/";
    /// Kubelet's PodResources socket.
    pub const KUBELET_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
}

pub mod pluginregistration {
    //! Plugin registration API v1 (kubelet's plugin watcher) and its
    //! constants.

    generated!(v1, "pluginregistration");

    /// The directory kubelet watches for registration sockets.
    pub const REGISTRY_PATH: &str = "/var/lib/kubelet/plugins_registry/";
    /// `PluginInfo.type` of a DRA driver.
    pub const DRA_PLUGIN: &str = "DRAPlugin";
}

pub mod dra {
    //! Dynamic Resource Allocation plugin API v1 and its constants.

    generated!(v1, "k8s.io.kubelet.pkg.apis.dra.v1");

    /// The entry of `PluginInfo.supported_versions` for this API.
    pub const SERVICE_V1: &str = "v1.DRAPlugin";
    /// Kubelet's directory for DRA drivers' own sockets and state
    /// (`<PLUGINS_PATH><driver>/`).
    pub const PLUGINS_PATH: &str = "/var/lib/kubelet/plugins/";
}
