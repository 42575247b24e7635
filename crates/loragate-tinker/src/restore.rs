//! Futures recorded before a restart (see `store/record.rs`), put back when the front starts: results are served
//! again until their retention ends (counted from when they settled, in wall-clock time), and pending samples are
//! continued under their request ids, so that the SDK's futures resolve. A pending sample is validated again from its
//! recorded `asample` body, as a new one would be, and continued from what its record says it had produced: each
//! sequence not finished is sampled as `prompt + its recorded tokens` with the rest of its budget (see
//! `SamplePlan::resumed`); the tokens it produced after its last record are produced again. Records that cannot be
//! read, and results past their retention, are removed.

use std::sync::Arc;
use std::time::SystemTime;

use loragate_core::AdapterKey;
use loragate_core::state::{FrontRecord, StateChange};
use tokio::time::Instant;

use crate::error::TinkerError;
use crate::ids::FutureId;
use crate::sample_request::AsampleBody;
use crate::sample_task::run_sample;
use crate::state::TinkerState;
use crate::store::record::{Creator, CreatorKind, RecordedState, SampleRecord, TABLE};
use crate::store::{Failure, FutureSubject, Restored, RetentionLimits, Settled};

/// What the records hold, sorted out.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    /// Every future to put back, pending ones first, results oldest first.
    pub(crate) futures: Vec<Restored>,
    /// The pending samples to continue.
    pub(crate) to_continue: Vec<ToContinue>,
    /// Records to remove: unreadable, or results past their retention.
    pub(crate) forgotten: Vec<StateChange>,
}

/// A pending sample recorded before a restart, to continue.
#[derive(Debug)]
pub(crate) struct ToContinue {
    /// Its request id.
    pub(crate) id: FutureId,
    /// What it samples.
    pub(crate) target: AdapterKey,
    /// Its pending record: the `asample` body, and what it had produced.
    pub(crate) record: SampleRecord,
}

/// Sorts out the front's records among `records` (other fronts' are left alone), as of `now` (wall clock) and
/// `now_instant`.
pub(crate) fn recover(
    records: Vec<FrontRecord>,
    limits: &RetentionLimits,
    now: SystemTime,
    now_instant: Instant,
) -> Recovered {
    let mut recovered = Recovered::default();
    let mut results = Vec::new();
    for FrontRecord { table, key, value } in records.into_iter().filter(|record| record.table == TABLE) {
        let read = FutureId::parse(&key).ok_or_else(|| "not a request id".to_owned()).and_then(|id| {
            let record = SampleRecord::parse(&value)?;
            let target = AdapterKey::parse(&record.target).map_err(|err| err.to_string())?;
            Ok((id, record, target))
        });
        let (id, record, target) = match read {
            Ok(read) => read,
            Err(err) => {
                tracing::warn!(request_id = %key, %err, "dropped an unreadable record of a Tinker future");
                recovered.forgotten.push(StateChange::FrontRecordRemoved { table, key });
                continue;
            }
        };
        let subject = FutureSubject { target: target.clone(), creator: Creator::Restored(record.creator) };
        let dedup = record.dedup.clone();
        if let RecordedState::Pending { .. } = record.state {
            recovered.futures.push(Restored { id, subject, dedup, settled: None });
            recovered.to_continue.push(ToContinue { id, target, record });
            continue;
        }
        let Some((state, settled_at)) = record.settled_state() else {
            tracing::warn!(request_id = %key, "dropped a Tinker result whose record is damaged");
            recovered.forgotten.push(StateChange::FrontRecordRemoved { table, key });
            continue;
        };
        let age = now.duration_since(settled_at).unwrap_or_default();
        if age >= limits.result_lifetime {
            recovered.forgotten.push(StateChange::FrontRecordRemoved { table, key });
            continue;
        }
        let settled_at = now_instant.checked_sub(age).unwrap_or(now_instant);
        results.push(Restored { id, subject, dedup, settled: Some((state, settled_at)) });
    }
    results.sort_by_key(|restored| restored.settled.as_ref().map(|(_, at)| *at));
    recovered.futures.extend(results);
    recovered
}

/// Continues the pending samples put back at start, each on its own task, as `asample` starts a new one.
pub(crate) fn continue_samples(state: &TinkerState, pending: Vec<ToContinue>) {
    if !pending.is_empty() {
        tracing::info!(samples = pending.len(), "continuing the Tinker samples that were pending before the restart");
    }
    for ToContinue { id, target, record } in pending {
        let RecordedState::Pending { request, produced } = record.state.clone() else { continue };
        // A tenant's key is not recorded: its continued sample's cached prefixes are its own alone.
        let scope = (record.creator == CreatorKind::Tenant).then(|| Arc::<str>::from(format!("restored-{id}")));
        let future = state.store().pending_future(id, Arc::new(record));
        let plan = serde_json::from_value::<AsampleBody>(request)
            .map_err(|err| TinkerError::invalid("request", err.to_string()))
            .and_then(|body| body.into_plan(id, &target, state.coordinator(), produced))
            .map(|plan| plan.scope_cache_to(scope));
        match plan {
            Ok(plan) => {
                tokio::spawn(run_sample(state.clone(), plan, future));
            }
            Err(err) => {
                let message = format!("this sample could not be continued after the server restarted: {err}");
                tracing::warn!(request_id = %id, error = %message, "Tinker sample failed");
                future.settle(Settled::Failed(Failure::server(message)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use loragate_core::Principal;
    use serde_json::Value;

    use super::*;
    use crate::ids::{Epoch, IdMaker};
    use crate::store::FutureState;

    #[test]
    fn results_come_back_oldest_first_until_their_retention_ends_and_damaged_records_go() {
        let limits = RetentionLimits::default();
        let now = SystemTime::now();
        let ids = IdMaker::new(Epoch::random());
        let creator = Creator::Caller(Principal::Anyone);
        let result = |age_s: u64| {
            let id = ids.future_id();
            let answer = FutureState::Finished(Bytes::from_static(b"r"));
            let at = now - Duration::from_secs(age_s);
            let record = SampleRecord::settled(&AdapterKey::Base, &creator, None, &answer, at).expect("settled");
            let StateChange::FrontRecordPut(record) = record.put(id) else { unreachable!("a put") };
            (id, record)
        };
        let (recent, recent_record) = result(10);
        let (older, older_record) = result(600);
        let (_, expired_record) = result(limits.result_lifetime.as_secs());
        let pending = ids.future_id();
        let body = serde_json::json!({"num_samples": 1});
        let StateChange::FrontRecordPut(pending_record) =
            SampleRecord::pending(&AdapterKey::Base, &creator, None, body.clone()).put(pending)
        else {
            unreachable!("a put")
        };
        let damaged = FrontRecord { table: TABLE.into(), key: ids.future_id().to_wire(), value: "{".into() };
        let other_front = FrontRecord { table: "other".into(), key: "k".into(), value: "{".into() };
        let records =
            vec![recent_record, expired_record.clone(), older_record, pending_record, damaged.clone(), other_front];
        let now_instant = Instant::now();
        let recovered = recover(records, &limits, now, now_instant);
        let order: Vec<FutureId> = recovered.futures.iter().map(|restored| restored.id).collect();
        assert_eq!(order, [pending, older, recent], "pending first, then results oldest first; the expired one gone");
        let recent_at = recovered.futures[2].settled.as_ref().map(|(_, at)| *at).expect("settled");
        let age = now_instant - recent_at;
        assert!(age >= Duration::from_secs(10) && age < Duration::from_secs(11), "its age is kept: {age:?}");
        let continued: Vec<(FutureId, &AdapterKey, Option<&Value>)> = recovered
            .to_continue
            .iter()
            .map(|to| match &to.record.state {
                RecordedState::Pending { request, .. } => (to.id, &to.target, Some(request)),
                _ => (to.id, &to.target, None),
            })
            .collect();
        assert_eq!(continued, vec![(pending, &AdapterKey::Base, Some(&body))]);
        let gone =
            |record: &FrontRecord| StateChange::FrontRecordRemoved { table: TABLE.into(), key: record.key.clone() };
        assert_eq!(recovered.forgotten, vec![gone(&expired_record), gone(&damaged)], "another front's record stays");
    }
}
