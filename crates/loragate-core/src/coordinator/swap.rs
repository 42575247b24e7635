//! The atomic swap of an adapter's weights under a pause of its own, and what it did.

use tokio::time::Instant;

use super::Coordinator;
use crate::adapter::PauseRelease;
use crate::adapter_source::AdapterSource;
use crate::contract::{AdapterName, CoreError, KvPolicy, PauseMode, PauseOwner, PauseRequest, VersionInfo};

impl Coordinator {
    /// The atomic swap: pauses `name` in `mode` under a pause of its own, loads `source`, and releases that pause
    /// (the adapter reopens unless another pause holds it). Kept requests continue on the new weights. If the load
    /// fails, the old version keeps serving, the adapter is reopened just the same, kept requests continue on the
    /// old weights, and the error says so. A name not loaded yet is simply loaded. Kept requests keep their keys and
    /// values as the KV policy applied says ([`Coordinator::kv_policy_applied`] for `kv_policy`).
    pub async fn swap_adapter(
        &self,
        name: &AdapterName,
        source: AdapterSource,
        mode: PauseMode,
        kv_policy: KvPolicy,
        client_deadline: Option<Instant>,
    ) -> Result<SwapReport, CoreError> {
        let origin = source.origin();
        let swapped = self.swap(name, source, mode, kv_policy, client_deadline).await;
        if let Err(err) = &swapped {
            tracing::warn!(adapter = %name, source = %origin, reason = %err, "adapter swap failed");
        }
        swapped
    }

    /// [`Coordinator::swap_adapter`] without its warning on failure.
    async fn swap(
        &self,
        name: &AdapterName,
        source: AdapterSource,
        mode: PauseMode,
        kv_policy: KvPolicy,
        client_deadline: Option<Instant>,
    ) -> Result<SwapReport, CoreError> {
        let kv_policy = self.kv_policy_applied(mode, kv_policy);
        let adapter = match self.lora(name) {
            Ok(adapter) => adapter,
            Err(CoreError::UnknownAdapter(_)) => {
                let installed = self.install_logged(name, source).await?;
                return Ok(SwapReport { installed, aborted: 0, kept: 0, kv_policy });
            }
            Err(err) => return Err(err),
        };
        let request = PauseRequest { mode, owner: PauseOwner::new_swap(), lease: None, kv_policy };
        let pause = self.pause(name, request, client_deadline).await?;
        let reopen = PauseRelease::new(adapter.clone(), pause.pause_id.clone());
        let started = std::time::Instant::now();
        let loaded = self.install(name, source).await;
        reopen.release().await?;
        match loaded {
            Ok(installed) => {
                let report = SwapReport {
                    installed,
                    aborted: pause.aborted.len(),
                    kept: pause.kept.len(),
                    kv_policy: pause.kv_policy,
                };
                tracing::info!(
                    adapter = %name,
                    version = %report.installed.version,
                    source = %report.installed.origin,
                    sha256 = %report.installed.sha256.map(|sha| sha.to_hex()).unwrap_or_default(),
                    bytes = report.installed.bytes.unwrap_or_default(),
                    load_ms = started.elapsed().as_millis(),
                    mode = mode.as_str(),
                    kv_policy = report.kv_policy.as_str(),
                    aborted = report.aborted,
                    kept = report.kept,
                    "adapter swapped"
                );
                Ok(report)
            }
            Err(err) => Err(CoreError::SwapFailed {
                adapter: name.clone(),
                serving: adapter.gate().version,
                source: Box::new(err),
            }),
        }
    }
}

/// What a swap did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwapReport {
    /// The adapter's version after the swap, with its identity.
    pub installed: VersionInfo,
    /// Requests the swap's pause handed back aborted.
    pub aborted: usize,
    /// Requests the swap's pause kept (they continue on the new weights).
    pub kept: usize,
    /// The KV policy applied to the kept requests.
    pub kv_policy: KvPolicy,
}
