//! The requests not decoding yet, per tenant, in the rotation [`super::fair`] deals each step's prefill budget over.
//!
//! A tenant is what a request runs on: an adapter (by name, whatever version it pinned, so the continuations kept
//! across a weight swap are ordinary requests of their adapter) or the base model. Its queue holds its prefills in
//! progress, then the ones not started — preempted sequences first, then its waiting requests in arrival order; a
//! tenant leaves the rotation when its queue empties and joins at the back with its next request (at the front with
//! a preempted sequence).

use std::collections::VecDeque;

use loragate_core::{AdapterKey, EngineError};

use super::fair::{self, Limits, Plan, Queued};
use super::prefill::Prefill;
use super::sequence::{Sequence, Submission};
use crate::model::{BlockPool, KvCache, Llama};

/// A tenant's queue: prefills started (their sequences hold their places in the batch, and they hold blocks), then
/// those not started.
struct Tenant {
    key: AdapterKey,
    queue: VecDeque<Prefill>,
}

/// Every request that is not decoding yet.
#[derive(Default)]
pub(super) struct Pending {
    /// In rotation order; none of them empty between steps.
    tenants: Vec<Tenant>,
    next_id: u64,
}

/// A request's prompt tokens to run in this step.
pub(super) struct Scheduled {
    /// Its tenant's index in the rotation the plan was made for, and its place among the step's grants.
    pub(super) tenant: usize,
    pub(super) order: usize,
    pub(super) prefill: Prefill,
    pub(super) tokens: usize,
}

/// What [`Pending::take`] took out of the queues for one step.
#[derive(Default)]
pub(super) struct Taken {
    /// The chunks to run.
    pub(super) scheduled: Vec<Scheduled>,
    /// Prefills granted tokens that run none in this step (waiting for another's blocks, or for free blocks), with
    /// their tenant and order, to go back where they were.
    pub(super) idle: Vec<(usize, usize, Prefill)>,
    /// Preempted sequences whose keys and values were all still cached: they decode on at once.
    pub(super) resumed: Vec<Sequence>,
}

impl Pending {
    /// Queues a new request at the back of its tenant's queue.
    pub(super) fn push(&mut self, submission: Submission, model: &Llama) {
        let id = self.next_id();
        let key = submission.request.adapter().clone();
        let entry = Prefill::new(id, submission, model);
        match self.tenants.iter_mut().find(|tenant| tenant.key == key) {
            Some(tenant) => tenant.queue.push_back(entry),
            None => self.tenants.push(Tenant { key, queue: VecDeque::from([entry]) }),
        }
    }

    /// Queues a preempted sequence's prefill ahead of its tenant's requests that have not started (after the
    /// prefills in progress), its tenant at the front of the rotation if it had nothing queued.
    pub(super) fn push_preempted(&mut self, prefill: Prefill) {
        let key = prefill.context.adapter_key.clone();
        match self.tenants.iter_mut().find(|tenant| tenant.key == key) {
            Some(tenant) => {
                let started = tenant.queue.iter().take_while(|queued| queued.is_started()).count();
                tenant.queue.insert(started, prefill);
            }
            None => self.tenants.insert(0, Tenant { key, queue: VecDeque::from([prefill]) }),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }

    /// A new request number (requests that skip the queue, resuming from parked keys and values, get one too).
    pub(super) fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// The requests not started yet.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.entries().filter(|prefill| !prefill.is_started()).count()
    }

    /// The prefills in progress, with their tenants: (request id, tenant, positions prefilled, positions in all).
    #[cfg(test)]
    pub(super) fn prefilling(&self) -> Vec<(u64, AdapterKey, usize, usize)> {
        let mut prefilling = Vec::new();
        for tenant in &self.tenants {
            for prefill in &tenant.queue {
                if prefill.is_started() {
                    let (done, left) = (prefill.prefilled(), prefill.remaining());
                    prefilling.push((prefill.context.id, tenant.key.clone(), done, done + left));
                }
            }
        }
        prefilling
    }

    /// The batch places the started prefills hold.
    pub(super) fn places_taken(&self) -> usize {
        self.entries().filter(|prefill| prefill.is_started()).map(Prefill::samples).sum()
    }

    /// The batch places every queued request's sequences will take, started or not.
    pub(super) fn queued_places(&self) -> usize {
        self.entries().map(Prefill::samples).sum()
    }

    /// The stamp of the newest started prefill.
    pub(super) fn newest_started(&self) -> Option<u64> {
        self.entries().filter(|prefill| prefill.is_started()).map(|prefill| prefill.stamp).max()
    }

    /// Preempts the newest started prefill (its blocks and places given back; it starts again later). False if
    /// none is started.
    pub(super) fn preempt_newest(&mut self) -> bool {
        let Some(newest) = self.newest_started() else { return false };
        for tenant in &mut self.tenants {
            for prefill in &mut tenant.queue {
                if prefill.is_started() && prefill.stamp == newest {
                    prefill.preempt();
                    return true;
                }
            }
        }
        false
    }

    /// Ends cancelled requests with `Abort` (no more tokens) and drops those whose caller went away.
    pub(super) fn drop_abandoned(&mut self) {
        for tenant in &mut self.tenants {
            tenant.queue.retain_mut(|prefill| {
                let abandoned = prefill.context.is_abandoned();
                if abandoned {
                    prefill.abort();
                }
                !abandoned
            });
        }
        self.tenants.retain(|tenant| !tenant.queue.is_empty());
    }

    /// Deals this step's prefill budget (see [`fair::plan`]); what the prefix cache holds of a request not started
    /// is left out of its tokens.
    pub(super) fn plan(&self, limits: Limits, pool: &BlockPool) -> Plan {
        let queues: Vec<Vec<Queued>> =
            self.tenants.iter().map(|tenant| reachable(&tenant.queue, limits, pool)).collect();
        fair::plan(&queues, limits)
    }

    /// Takes the requests `plan` grants tokens out of their queues, starts those not started (as stamped by
    /// `stamp`), and makes room in `cache` for the tokens each runs: a request waiting for another prefill's blocks,
    /// or for which no block is free, runs nothing in this step.
    pub(super) fn take(&mut self, plan: &Plan, cache: &KvCache, stamp: &mut u64) -> Taken {
        let mut taken = Taken::default();
        for (order, grant) in plan.grants.iter().enumerate() {
            // Grants are a prefix of each queue, in queue order: each is the tenant's front entry by now.
            let Some(mut prefill) = self.tenants[grant.tenant].queue.pop_front() else { continue };
            let begun = !prefill.is_started();
            if begun {
                *stamp += 1;
                if prefill.begin(cache.pool(), *stamp).is_err() {
                    taken.idle.push((grant.tenant, order, prefill));
                    continue;
                }
                prefill = match prefill.complete_without_chunk() {
                    Ok(sequences) => {
                        taken.resumed.extend(sequences);
                        continue;
                    }
                    Err(prefill) => *prefill,
                };
            }
            let tokens = prefill.reserve(cache, grant.tokens);
            if tokens == 0 {
                if begun {
                    // No block for it: it holds neither blocks nor places while it waits.
                    prefill.preempt();
                }
                taken.idle.push((grant.tenant, order, prefill));
                continue;
            }
            taken.scheduled.push(Scheduled { tenant: grant.tenant, order, prefill, tokens });
        }
        taken
    }

    /// Puts back the prefills taken by [`Pending::take`] for `plan` that go on, with their tenant and order, at the
    /// front of their queues in their order, and turns the rotation as `plan` says.
    pub(super) fn put_back(&mut self, mut back: Vec<(usize, usize, Prefill)>, plan: &Plan) {
        back.sort_by_key(|(_, order, _)| *order);
        for (tenant, _, prefill) in back.into_iter().rev() {
            self.tenants[tenant].queue.push_front(prefill);
        }
        let mut tenants: Vec<Option<Tenant>> = std::mem::take(&mut self.tenants).into_iter().map(Some).collect();
        self.tenants = plan
            .next_rotation(tenants.len())
            .into_iter()
            .filter_map(|index| tenants[index].take())
            .filter(|tenant| !tenant.queue.is_empty())
            .collect();
    }

    /// Tells every queued request the engine stopped.
    pub(super) fn stop_all(&mut self) {
        for prefill in self.tenants.drain(..).flat_map(|tenant| tenant.queue) {
            prefill.fail(EngineError::Stopped);
        }
    }

    fn entries(&self) -> impl Iterator<Item = &Prefill> {
        self.tenants.iter().flat_map(|tenant| &tenant.queue)
    }
}

/// What the planner sees of the front of `queue`: the entries this step could reach (a plan grants a prefix of each
/// queue, within the budget and the batch's places), so that a long queue costs no lookups in the prefix cache
/// beyond them.
fn reachable(queue: &VecDeque<Prefill>, limits: Limits, pool: &BlockPool) -> Vec<Queued> {
    let mut seen = Vec::new();
    let (mut tokens, mut starts) = (0, 0);
    for prefill in queue {
        if tokens >= limits.budget || starts > limits.places {
            break;
        }
        let queued = prefill.queued(pool);
        tokens += queued.remaining;
        starts += usize::from(!queued.started);
        seen.push(queued);
    }
    seen
}
