//! The `v1beta1.DevicePlugin` service kubelet calls on our socket.

use std::pin::Pin;
use std::sync::Arc;

use tessera_kubelet_api::deviceplugin::v1beta1 as dp;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::gpu::InventoryGpu;

use super::allocator::Allocator;
use super::preferred::{Placement, preferred};
use super::vgpu;

/// What we ask kubelet for: GetPreferredAllocation yes, PreStartContainer
/// no.
pub const OPTIONS: dp::DevicePluginOptions = dp::DevicePluginOptions {
    pre_start_required: false,
    get_preferred_allocation_available: true,
};

/// The service state; cheap to clone (one per server instance).
#[derive(Clone, Debug)]
pub struct DevicePlugin {
    /// The node's GPUs, in NVML index order.
    pub gpus: Arc<Vec<InventoryGpu>>,
    /// vGPUs per GPU.
    pub split: u32,
    /// Single-vGPU placement.
    pub placement: Placement,
    /// Health per GPU (same order as `gpus`).
    pub health: watch::Receiver<Vec<bool>>,
    /// Becomes `true` when this server instance stops; open
    /// `ListAndWatch` streams end then.
    pub stop: watch::Receiver<bool>,
    /// `Allocate`; `None` when the plugin runs without the Kubernetes API
    /// (every `Allocate` is refused with the reason).
    pub allocator: Option<Arc<Allocator>>,
}

type DeviceStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<dp::ListAndWatchResponse, Status>> + Send>>;

impl DevicePlugin {
    fn list(&self, health: &[bool]) -> dp::ListAndWatchResponse {
        dp::ListAndWatchResponse {
            devices: vgpu::devices(&self.gpus, self.split, health),
        }
    }
}

#[tonic::async_trait]
impl dp::device_plugin_server::DevicePlugin for DevicePlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(OPTIONS))
    }

    type ListAndWatchStream = DeviceStream;

    /// The device list now, then again after every health change, until
    /// the client goes or this server stops.
    async fn list_and_watch(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let me = self.clone();
        let mut health = self.health.clone();
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let now = health.borrow_and_update().clone();
                if tx.send(Ok(me.list(&now))).await.is_err() {
                    return;
                }
                tokio::select! {
                    changed = health.changed() => if changed.is_err() { return },
                    _ = stop.wait_for(|s| *s) => return,
                    () = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        let mut container_responses = Vec::new();
        for (i, c) in request
            .into_inner()
            .container_requests
            .into_iter()
            .enumerate()
        {
            let size = usize::try_from(c.allocation_size).map_err(|_| {
                Status::invalid_argument(format!(
                    "container request {i}: allocation_size {} is negative",
                    c.allocation_size
                ))
            })?;
            let device_i_ds = preferred(
                &self.gpus,
                self.split,
                self.placement,
                &c.available_device_i_ds,
                &c.must_include_device_i_ds,
                size,
            );
            container_responses.push(dp::ContainerPreferredAllocationResponse { device_i_ds });
        }
        Ok(Response::new(dp::PreferredAllocationResponse {
            container_responses,
        }))
    }

    /// One answer per container request, in order (kubelet sends one
    /// and reads the first). A failure is a gRPC status whose message
    /// kubelet shows in the pod's events.
    async fn allocate(
        &self,
        request: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let Some(allocator) = &self.allocator else {
            return Err(Status::failed_precondition(
                "tessera-agent: Allocate is refused: the device plugin runs without the Kubernetes API, so no pod's assignment can be read",
            ));
        };
        let mut container_responses = Vec::new();
        for c in request.into_inner().container_requests {
            match allocator.allocate(&c.devices_ids).await {
                Ok(r) => container_responses.push(r),
                Err(e) => {
                    let message = format!("tessera-agent: {}", crate::error_chain::with_causes(&e));
                    tracing::warn!(devices = ?c.devices_ids, error = %message, "allocate refused");
                    return Err(Status::failed_precondition(message));
                }
            }
        }
        Ok(Response::new(dp::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}
