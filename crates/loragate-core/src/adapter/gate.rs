//! The pause gate: an adapter's durable state on a `watch` channel. Only the adapter's actor writes it; anyone
//! waits on it outside the actor, with their own deadline, so a long-poll never occupies the actor's mailbox.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::contract::{GateState, Retirement};
use tokio::sync::watch;
use tokio::time::Instant;

/// How a wait at the gate ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GateWait {
    /// The gate is open.
    Open,
    /// The deadline passed with the gate still closed.
    TimedOut,
    /// The adapter stopped serving.
    Retired(Retirement),
    /// An abort-mode pause came after the one the waiter was told to give up at.
    AbortPaused,
}

/// Waits until the gate is open, the adapter is retired, or `deadline` passes (`None`: no deadline); with
/// `abort_pauses_seen`, also until an abort-mode pause beyond that count has come (even if the gate reopened since).
pub(crate) async fn wait_until_open(
    mut gate: watch::Receiver<GateState>,
    deadline: Option<Instant>,
    abort_pauses_seen: Option<u64>,
) -> GateWait {
    let aborted = move |state: &GateState| abort_pauses_seen.is_some_and(|seen| state.abort_pauses > seen);
    let settled = gate.wait_for(|state| state.retired.is_some() || !state.paused || aborted(state));
    let outcome = match deadline {
        Some(deadline) => match tokio::time::timeout_at(deadline, settled).await {
            Ok(outcome) => outcome.map(|state| *state),
            Err(_elapsed) => return GateWait::TimedOut,
        },
        None => settled.await.map(|state| *state),
    };
    match outcome {
        Ok(GateState { retired: Some(why), .. }) => GateWait::Retired(why),
        Ok(state) if aborted(&state) => GateWait::AbortPaused,
        Ok(_) => GateWait::Open,
        // The sender lives in the adapter's cell, which the waiter's handle keeps alive; a closed channel means the
        // adapter is gone.
        Err(_closed) => GateWait::Retired(Retirement::Unloaded),
    }
}

/// Waits until `ready` holds for the gate's state or the adapter is retired, or `deadline` passes: `Open` means
/// `ready` held. For waits on something other than the pause (a version to arrive, capacity to free).
pub(crate) async fn wait_until_ready(
    mut gate: watch::Receiver<GateState>,
    deadline: Instant,
    mut ready: impl FnMut(&GateState) -> bool,
) -> GateWait {
    let settled = gate.wait_for(|state| state.retired.is_some() || ready(state));
    match tokio::time::timeout_at(deadline, settled).await {
        Err(_elapsed) => GateWait::TimedOut,
        Ok(Ok(state)) => match state.retired {
            Some(why) => GateWait::Retired(why),
            None => GateWait::Open,
        },
        Ok(Err(_closed)) => GateWait::Retired(Retirement::Unloaded),
    }
}

/// Counts something while it exists (a held submission, a waiter) and uncounts it when dropped, whatever ends it:
/// release, timeout, or the caller going away.
#[derive(Debug)]
pub(crate) struct Counted<'a> {
    counter: &'a AtomicU32,
}

impl<'a> Counted<'a> {
    /// Counts one more.
    pub(crate) fn new(counter: &'a AtomicU32) -> Self {
        counter.fetch_add(1, Ordering::AcqRel);
        Self { counter }
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::contract::AdapterVersion;

    fn gate(paused: bool) -> (watch::Sender<GateState>, watch::Receiver<GateState>) {
        watch::channel(GateState {
            paused,
            version: AdapterVersion(1),
            retired: None,
            abort_pauses: 0,
            admission_epoch: 0,
        })
    }

    #[tokio::test]
    async fn an_open_gate_answers_at_once() {
        let (_tx, rx) = gate(false);
        assert_eq!(wait_until_open(rx, Some(Instant::now()), None).await, GateWait::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_gate_times_out_at_the_deadline() {
        let (_tx, rx) = gate(true);
        let deadline = Instant::now() + Duration::from_secs(3);
        assert_eq!(wait_until_open(rx, Some(deadline), None).await, GateWait::TimedOut);
        assert!(Instant::now() >= deadline);
    }

    #[tokio::test]
    async fn reopening_and_retirement_release_waiters() {
        let (tx, rx) = gate(true);
        let waiter = tokio::spawn(wait_until_open(rx.clone(), None, None));
        tx.send_modify(|state| state.paused = false);
        assert_eq!(waiter.await.ok(), Some(GateWait::Open));

        tx.send_modify(|state| state.paused = true);
        let waiter = tokio::spawn(wait_until_open(rx, None, None));
        tx.send_modify(|state| state.retired = Some(Retirement::Unloaded));
        assert_eq!(waiter.await.ok(), Some(GateWait::Retired(Retirement::Unloaded)));
    }

    #[tokio::test]
    async fn a_version_wait_ends_when_the_version_arrives_or_the_deadline_passes() {
        let (tx, rx) = gate(false);
        let deadline = Instant::now() + Duration::from_secs(3600);
        let waiter = tokio::spawn(wait_until_ready(rx.clone(), deadline, |state| state.version >= AdapterVersion(3)));
        tx.send_modify(|state| state.version = AdapterVersion(2));
        tx.send_modify(|state| state.version = AdapterVersion(3));
        assert_eq!(waiter.await.ok(), Some(GateWait::Open));
        let never = |state: &GateState| state.version >= AdapterVersion(9);
        assert_eq!(wait_until_ready(rx, Instant::now(), never).await, GateWait::TimedOut);
    }

    #[test]
    fn counted_uncounts_on_drop() {
        let counter = AtomicU32::new(0);
        let first = Counted::new(&counter);
        let second = Counted::new(&counter);
        assert_eq!(counter.load(Ordering::Acquire), 2);
        drop(first);
        drop(second);
        assert_eq!(counter.load(Ordering::Acquire), 0);
    }
}
