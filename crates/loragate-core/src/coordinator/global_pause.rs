//! The global pause (vLLM's `/pause` and `/resume`, `PauseAll`/`ResumeAll`): every adapter and the base model paused
//! under the global owner, recorded in the state before it acts.

use futures::future::join_all;
use tokio::time::Instant;

use super::Coordinator;
use crate::adapter::{AdapterHandle, ReleaseTarget};
use crate::contract::{AbortReport, CoreError, KvPolicy, PauseMode, PauseOwner, PauseRequest};
use crate::state::Recording;

impl Coordinator {
    /// The global pause of vLLM's `/pause` and SGLang's `/pause_generation`: pauses every adapter and the base
    /// model in `mode` under the global owner (adapters loaded meanwhile start paused), with the KV policy
    /// [`Coordinator::kv_policy_applied`] says for `kv_policy`. Other pauses are untouched. A wait-mode global pause
    /// whose drain times out is withdrawn everywhere.
    pub async fn pause_all(
        &self,
        mode: PauseMode,
        kv_policy: KvPolicy,
        client_deadline: Option<Instant>,
    ) -> Result<AbortReport, CoreError> {
        let kv_policy = self.kv_policy_applied(mode, kv_policy);
        let request = PauseRequest { mode, owner: PauseOwner::Global, lease: None, kv_policy };
        let (adapters, recorded) = self.set_global_pause(Some(request.clone())).await?;
        if let Err(err) = recorded.await {
            // Not durable: withdrawn rather than left holding without a record.
            self.resume_all().await?;
            return Err(err.into());
        }
        let (ack_timeout, drain_until) = (self.inner.config.abort_ack_timeout, self.drain_until(client_deadline));
        let reports = join_all(adapters.iter().map(|adapter| adapter.pause(request.clone(), ack_timeout, drain_until)));
        let mut total = AbortReport::default();
        let mut failure = None;
        for report in reports.await {
            match report {
                Ok(report) => {
                    total.aborted.extend(report.aborted);
                    total.kept.extend(report.kept);
                    total.unacknowledged.extend(report.unacknowledged);
                }
                // An adapter unloaded meanwhile needs no pause.
                Err(CoreError::UnknownAdapter(_)) => {}
                Err(err) => failure = failure.or(Some(err)),
            }
        }
        if let Some(err) = failure {
            if mode == PauseMode::Wait {
                self.resume_all().await?;
            }
            return Err(err);
        }
        tracing::info!(
            mode = mode.as_str(),
            kv_policy = kv_policy.as_str(),
            adapters = adapters.len(),
            aborted = total.aborted.len(),
            kept = total.kept.len(),
            unacknowledged = total.unacknowledged.len(),
            "every adapter paused (global pause)"
        );
        Ok(total)
    }

    /// Releases the global pause everywhere; returns whether it was set. Adapters other pauses hold stay paused.
    pub async fn resume_all(&self) -> Result<bool, CoreError> {
        let was_paused = self.is_paused_globally().await?;
        let (adapters, recorded) = self.set_global_pause(None).await?;
        join_all(adapters.iter().map(|adapter| adapter.release(ReleaseTarget::Owner(PauseOwner::Global)))).await;
        recorded.await?;
        if was_paused {
            tracing::info!(adapters = adapters.len(), "global pause released");
        }
        Ok(was_paused)
    }

    /// Whether the global pause is set.
    pub async fn is_paused_globally(&self) -> Result<bool, CoreError> {
        self.inner.manager.is_globally_paused().await
    }

    async fn set_global_pause(
        &self,
        pause: Option<PauseRequest>,
    ) -> Result<(Vec<AdapterHandle>, Recording), CoreError> {
        self.inner.manager.set_global_pause(pause).await
    }
}
