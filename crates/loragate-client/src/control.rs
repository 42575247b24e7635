//! The trainer's control calls beyond the client-side swap: pauses in every mode, resume, the unpause long-poll,
//! the server's atomic swap, the staleness bound and the adapter list.

use std::time::Duration;

use loragate_proto::v1::{
    AbortLoraRequestsRequest, AbortLoraRequestsResponse, KvPolicy, ListLoraAdaptersRequest, LoraAdapterStatus,
    LoraStaleness, PauseMode, ResumeLoraRequestsRequest, ResumeLoraRequestsResponse, SetLoraStalenessRequest,
    SwapLoraAdapterRequest, SwapLoraAdapterResponse, WaitLoraUnpausedRequest,
};

use crate::error::ClientError;
use crate::swap::TrainerClient;

/// How a pause acts on the adapter's admitted requests (`AbortLoraRequests`).
#[derive(Clone, Debug, PartialEq)]
pub struct PauseOptions {
    /// Abort them (the default), keep them inside the server to continue on the next weights, or wait for them.
    pub mode: PauseMode,
    /// Who pauses: the same owner pausing again renews its pause; empty is the anonymous owner.
    pub owner: String,
    /// The pause ends by itself after this long unless renewed; `None` holds it until resumed.
    pub lease: Option<Duration>,
    /// Keep mode: recompute the kept sequences' keys and values, or reuse them.
    pub kv_policy: KvPolicy,
}

impl Default for PauseOptions {
    fn default() -> Self {
        Self { mode: PauseMode::Abort, owner: String::new(), lease: None, kv_policy: KvPolicy::Recompute }
    }
}

/// How a swap or a push pauses the adapter while the new weights are installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwapOptions {
    /// Keep (the default: running requests continue on the new weights), abort or wait.
    pub mode: PauseMode,
    /// Keep mode: recompute the kept sequences' keys and values (the default), or reuse them.
    pub kv_policy: KvPolicy,
}

impl Default for SwapOptions {
    fn default() -> Self {
        Self { mode: PauseMode::Keep, kv_policy: KvPolicy::Recompute }
    }
}

impl TrainerClient {
    /// Pauses `lora_name` (`AbortLoraRequests`) as `options` say; answers once the mode's work is done (aborted
    /// requests handed back, kept ones stopped, or, in wait mode, none left running).
    pub async fn pause(
        &self,
        lora_name: &str,
        options: PauseOptions,
    ) -> Result<AbortLoraRequestsResponse, ClientError> {
        let request = AbortLoraRequestsRequest {
            lora_name: lora_name.to_owned(),
            mode: options.mode.into(),
            owner: options.owner,
            lease_s: options.lease.map_or(0.0, |lease| lease.as_secs_f64()),
            kv_policy: options.kv_policy.into(),
        };
        Ok(self.control.clone().abort_lora_requests(request).await.map_err(ClientError::Rejected)?.into_inner())
    }

    /// Releases the pause `pause_id`, or every pause of `lora_name` when `None`.
    pub async fn resume(
        &self,
        lora_name: &str,
        pause_id: Option<&str>,
    ) -> Result<ResumeLoraRequestsResponse, ClientError> {
        let request = ResumeLoraRequestsRequest {
            lora_name: lora_name.to_owned(),
            pause_id: pause_id.unwrap_or_default().to_owned(),
        };
        Ok(self.control.clone().resume_lora_requests(request).await.map_err(ClientError::Rejected)?.into_inner())
    }

    /// Long-polls until `lora_name` is open: `true` as soon as it is, `false` when `timeout` passed first.
    pub async fn wait_unpaused(&self, lora_name: &str, timeout: Duration) -> Result<bool, ClientError> {
        let request = WaitLoraUnpausedRequest { lora_name: lora_name.to_owned(), timeout_s: timeout.as_secs_f64() };
        let answer = self.control.clone().wait_lora_unpaused(request).await.map_err(ClientError::Rejected)?;
        Ok(!answer.into_inner().paused)
    }

    /// The server's atomic swap (`SwapLoraAdapter`): pauses `lora_name` as `options` say under a pause of its own,
    /// loads `path` (inside the server's adapter root), releases that pause. A name not loaded yet is loaded.
    pub async fn swap_adapter_atomic(
        &self,
        lora_name: &str,
        path: &str,
        options: SwapOptions,
    ) -> Result<SwapLoraAdapterResponse, ClientError> {
        let request = SwapLoraAdapterRequest {
            lora_name: lora_name.to_owned(),
            path: path.to_owned(),
            mode: options.mode.into(),
            kv_policy: options.kv_policy.into(),
        };
        Ok(self.control.clone().swap_lora_adapter(request).await.map_err(ClientError::Rejected)?.into_inner())
    }

    /// Bounds `lora_name`'s staleness at the gate (`SetLoraStaleness`): a trainer consuming `batch_size` sequences
    /// per version never receives one more than `max_staleness` versions old. `batch_size` 0 clears the bound.
    /// Returns the policy now in force (`None` when cleared).
    pub async fn set_staleness(
        &self,
        lora_name: &str,
        max_staleness: u32,
        batch_size: u32,
    ) -> Result<Option<LoraStaleness>, ClientError> {
        let request = SetLoraStalenessRequest { lora_name: lora_name.to_owned(), max_staleness, batch_size };
        Ok(self
            .control
            .clone()
            .set_lora_staleness(request)
            .await
            .map_err(ClientError::Rejected)?
            .into_inner()
            .staleness)
    }

    /// A snapshot of every loaded adapter, ordered by name.
    pub async fn list_adapters(&self) -> Result<Vec<LoraAdapterStatus>, ClientError> {
        let listed = self.control.clone().list_lora_adapters(ListLoraAdaptersRequest {}).await;
        Ok(listed.map_err(ClientError::Rejected)?.into_inner().adapters)
    }
}

#[cfg(test)]
mod tests;
