//! Staging an adapter version on the fleet: loading `NAME@V` on every READY worker in parallel, whatever its
//! protocol, each bounded by a timeout. All succeeded: the version may be installed. Any failed: the copies that did load are unloaded again
//! (rollback) and the load fails with a report naming every worker's outcome, so the previous version keeps
//! serving everywhere.

use std::time::Duration;

use futures::future::join_all;
use loragate_core::EngineError;

use crate::delivery::Delivery;
use crate::membership::{Membership, StageTarget};
use crate::worker::WorkerError;

/// Stages `engine_name` as `delivery` says on every READY worker; on any failure rolls back and fails with the
/// per-worker report.
pub(crate) async fn stage(
    membership: &Membership,
    engine_name: &str,
    delivery: &Delivery,
    timeout: Duration,
) -> Result<(), EngineError> {
    let targets = membership.stage_targets().await.map_err(|err| EngineError::Unavailable(err.to_string()))?;
    if targets.is_empty() {
        return Err(EngineError::Unavailable(format!("no READY worker to load {engine_name} on")));
    }
    let loads = targets.iter().map(|target| async move {
        let started = std::time::Instant::now();
        let outcome = target.link.replace_adapter(engine_name, delivery, timeout).await;
        tracing::debug!(
            worker = %target.link.address(),
            adapter = %engine_name,
            staged = outcome.is_ok(),
            stage_ms = started.elapsed().as_secs_f64() * 1e3,
            "adapter staging on a worker timing"
        );
        if outcome.is_ok() {
            membership.adapter_changed(target, engine_name, true);
        }
        outcome
    });
    let outcomes: Vec<(StageTarget, Result<(), WorkerError>)> =
        targets.iter().cloned().zip(join_all(loads).await).collect();
    if outcomes.iter().all(|(_, outcome)| outcome.is_ok()) {
        return Ok(());
    }

    let staged: Vec<&StageTarget> =
        outcomes.iter().filter(|(_, outcome)| outcome.is_ok()).map(|(target, _)| target).collect();
    let rollbacks = staged.iter().map(|target| async move {
        match target.link.unload_adapter(engine_name, timeout).await {
            Ok(()) => membership.adapter_changed(target, engine_name, false),
            // A copy left behind is unloaded when the worker next catches up (it is not in the fleet's set).
            Err(err) => tracing::warn!(worker = %target.link.address(), %engine_name, %err, "rollback failed"),
        }
    });
    join_all(rollbacks).await;
    Err(report(engine_name, &outcomes))
}

/// The failure of a staging, as the most specific engine error any worker gave, with every worker's outcome.
fn report(engine_name: &str, outcomes: &[(StageTarget, Result<(), WorkerError>)]) -> EngineError {
    let failed = outcomes.iter().filter(|(_, outcome)| outcome.is_err()).count();
    let lines: Vec<String> = outcomes
        .iter()
        .map(|(target, outcome)| match outcome {
            Ok(()) => format!("{}: loaded, rolled back", target.link.address()),
            Err(err) => format!("{}: {err}", target.link.address()),
        })
        .collect();
    let text = format!(
        "loading {engine_name} failed on {failed} of {} workers; the previous version keeps serving [{}]",
        outcomes.len(),
        lines.join("; ")
    );
    let errors: Vec<&WorkerError> = outcomes.iter().filter_map(|(_, outcome)| outcome.as_ref().err()).collect();
    if errors.iter().any(|err| matches!(err, WorkerError::InvalidArgument(_))) {
        EngineError::AdapterFiles(text)
    } else if errors.iter().any(|err| matches!(err, WorkerError::FailedPrecondition(_))) {
        EngineError::AdapterIncompatible(text)
    } else {
        EngineError::Unavailable(text)
    }
}
