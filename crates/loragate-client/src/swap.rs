//! The trainer's side: swap an adapter's weights as one operation (abort → load → resume) that always reopens the
//! adapter, whatever fails and even if the caller drops the future half-way.

use loragate_proto::v1::lora_control_client::LoraControlClient;
use loragate_proto::v1::{AbortLoraRequestsRequest, LoadLoraAdapterRequest, ResumeLoraRequestsRequest};
use tonic::transport::Channel;

use crate::channel::{BearerKey, KeyedChannel, connect};
use crate::error::ClientError;

/// What a swap did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwapReport {
    /// The adapter's version after the swap.
    pub version: u64,
    /// How many requests the swap aborted (handed back to their callers, who continue them).
    pub aborted_count: u32,
    /// Their ids.
    pub aborted_request_ids: Vec<String>,
}

/// Controls adapters on a loragate server, for trainers.
#[derive(Clone, Debug)]
pub struct TrainerClient {
    pub(crate) control: LoraControlClient<KeyedChannel>,
}

impl TrainerClient {
    /// Connects to a loragate gRPC endpoint (`http://host:port`).
    pub async fn connect(endpoint: impl Into<String>) -> Result<Self, ClientError> {
        Ok(Self::new(connect(endpoint).await?))
    }

    /// A client over an existing channel.
    pub fn new(channel: Channel) -> Self {
        Self::with_key(channel, BearerKey::none())
    }

    /// A client over an existing channel whose calls present `key` (the server's `--admin-key`, or a tenant key that
    /// may control its adapters).
    pub fn with_key(channel: Channel, key: BearerKey) -> Self {
        Self { control: LoraControlClient::with_interceptor(channel, key) }
    }

    /// Swaps `lora_name`'s weights for those at `path` (inside the server's adapter root): pauses the adapter and
    /// aborts its running requests (their callers get their partial output back and continue), loads the new
    /// weights, and reopens the adapter. The adapter is reopened on every path: when the abort or the load fails,
    /// and, from a background task, when this future is dropped before it finishes.
    pub async fn swap_adapter(&self, lora_name: &str, path: &str) -> Result<SwapReport, ClientError> {
        // Armed before the abort: an abort that fails half-way may already have closed the gate.
        let reopen = ReopenOnDrop { control: Some(self.control.clone()), lora_name: lora_name.to_owned() };
        let aborted = self
            .control
            .clone()
            .abort_lora_requests(AbortLoraRequestsRequest { lora_name: lora_name.to_owned(), ..Default::default() })
            .await
            .map_err(ClientError::Rejected)?
            .into_inner();
        let loaded = self
            .control
            .clone()
            .load_lora_adapter(LoadLoraAdapterRequest { lora_name: lora_name.to_owned(), path: path.to_owned() })
            .await;
        let reopened = reopen.reopen_now().await;
        let version = loaded.map_err(ClientError::Rejected)?.into_inner().version;
        reopened.map_err(ClientError::Rejected)?;
        Ok(SwapReport {
            version,
            aborted_count: aborted.aborted_count,
            aborted_request_ids: aborted.aborted_request_ids,
        })
    }
}

/// Reopens an adapter when dropped, unless [`ReopenOnDrop::reopen_now`] already did.
struct ReopenOnDrop {
    control: Option<LoraControlClient<KeyedChannel>>,
    lora_name: String,
}

impl ReopenOnDrop {
    /// Reopens the adapter now and reports how that went.
    async fn reopen_now(mut self) -> Result<(), tonic::Status> {
        let Some(mut control) = self.control.take() else { return Ok(()) };
        control
            .resume_lora_requests(ResumeLoraRequestsRequest { lora_name: self.lora_name.clone(), ..Default::default() })
            .await?;
        Ok(())
    }
}

impl Drop for ReopenOnDrop {
    fn drop(&mut self) {
        let Some(mut control) = self.control.take() else { return };
        let lora_name = std::mem::take(&mut self.lora_name);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::error!(adapter = %lora_name, "cannot reopen the adapter: no async runtime left");
            return;
        };
        runtime.spawn(async move {
            const ATTEMPTS: u32 = 5;
            for attempt in 1..=ATTEMPTS {
                let request = ResumeLoraRequestsRequest { lora_name: lora_name.clone(), ..Default::default() };
                match control.resume_lora_requests(request).await {
                    Ok(_) => return,
                    Err(status) if attempt < ATTEMPTS => {
                        tracing::warn!(adapter = %lora_name, %status, attempt, "reopening the adapter failed; retrying");
                        tokio::time::sleep(std::time::Duration::from_millis(100 << attempt)).await;
                    }
                    Err(status) => tracing::error!(adapter = %lora_name, %status, "could not reopen the adapter"),
                }
            }
        });
    }
}

#[cfg(test)]
mod tests;
