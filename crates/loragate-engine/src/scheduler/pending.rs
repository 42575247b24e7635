//! The requests not decoding yet, per tenant, in the rotation [`super::fair`] deals each step's prefill budget over.
//!
//! A tenant is what a request runs on: an adapter (by name, whatever version it pinned, so the continuations kept
//! across a weight swap are ordinary requests of their adapter) or the base model. Its queue holds its prefills in
//! progress, then its waiting requests, in arrival order; a tenant leaves the rotation when its queue empties and
//! joins at the back with its next request.

use std::collections::VecDeque;

use loragate_core::{AdapterKey, EngineError};

use super::fair::{self, Limits, Plan, Queued};
use super::prefill::Prefill;
use super::sequence::Submission;
use crate::model::Llama;

/// One queued request.
enum Entry {
    /// Not started: it takes no place in the batch yet.
    Waiting { id: u64, submission: Submission },
    /// Started: its prompt is partly prefilled and its sequences hold their places in the batch.
    Prefilling(Prefill),
}

struct Tenant {
    key: AdapterKey,
    queue: VecDeque<Entry>,
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
    /// Its tenant's index in the rotation the plan was made for.
    pub(super) tenant: usize,
    pub(super) prefill: Prefill,
    pub(super) tokens: usize,
}

impl Pending {
    /// Queues a new request at the back of its tenant's queue.
    pub(super) fn push(&mut self, submission: Submission) {
        let id = self.next_id();
        let key = submission.request.adapter().clone();
        let entry = Entry::Waiting { id, submission };
        match self.tenants.iter_mut().find(|tenant| tenant.key == key) {
            Some(tenant) => tenant.queue.push_back(entry),
            None => self.tenants.push(Tenant { key, queue: VecDeque::from([entry]) }),
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
        self.entries().filter(|entry| matches!(entry, Entry::Waiting { .. })).count()
    }

    /// The prefills in progress, with their tenants: (request id, tenant, positions prefilled, positions in all).
    #[cfg(test)]
    pub(super) fn prefilling(&self) -> Vec<(u64, AdapterKey, usize, usize)> {
        let mut prefilling = Vec::new();
        for tenant in &self.tenants {
            for entry in &tenant.queue {
                if let Entry::Prefilling(prefill) = entry {
                    let (done, left) = (prefill.prefilled(), prefill.remaining());
                    prefilling.push((prefill.context.id, tenant.key.clone(), done, done + left));
                }
            }
        }
        prefilling
    }

    /// The batch places the started prefills hold.
    pub(super) fn places_taken(&self) -> usize {
        self.entries()
            .map(|entry| match entry {
                Entry::Prefilling(prefill) => prefill.samples(),
                Entry::Waiting { .. } => 0,
            })
            .sum()
    }

    /// Ends cancelled requests with `Abort` (no tokens) and drops those whose caller went away.
    pub(super) fn drop_abandoned(&mut self) {
        for tenant in &mut self.tenants {
            tenant.queue.retain(|entry| match entry {
                Entry::Waiting { submission, .. } if submission.is_abandoned() => {
                    submission.abort();
                    false
                }
                Entry::Prefilling(prefill) if prefill.context.is_abandoned() => {
                    prefill.abort();
                    false
                }
                _ => true,
            });
        }
        self.tenants.retain(|tenant| !tenant.queue.is_empty());
    }

    /// Deals this step's prefill budget (see [`fair::plan`]).
    pub(super) fn plan(&self, limits: Limits) -> Plan {
        let queues: Vec<Vec<Queued>> = self
            .tenants
            .iter()
            .map(|tenant| {
                tenant
                    .queue
                    .iter()
                    .map(|entry| match entry {
                        Entry::Waiting { submission, .. } => Queued {
                            remaining: submission.request.prompt().len(),
                            samples: submission.request.num_samples() as usize,
                            started: false,
                        },
                        Entry::Prefilling(prefill) => {
                            Queued { remaining: prefill.remaining(), samples: prefill.samples(), started: true }
                        }
                    })
                    .collect()
            })
            .collect();
        fair::plan(&queues, limits)
    }

    /// Takes the requests `plan` grants tokens out of their queues, starting those that were waiting. A request
    /// that cannot start was answered with its error and is left out.
    pub(super) fn take(&mut self, plan: &Plan, model: &Llama) -> Vec<Scheduled> {
        let mut scheduled = Vec::with_capacity(plan.grants.len());
        for grant in &plan.grants {
            // Grants are a prefix of each queue, in queue order: each is the tenant's front entry by now.
            let Some(entry) = self.tenants[grant.tenant].queue.pop_front() else { continue };
            let prefill = match entry {
                Entry::Prefilling(prefill) => prefill,
                Entry::Waiting { id, submission } => match Prefill::start(id, submission, model) {
                    Some(prefill) => prefill,
                    None => continue,
                },
            };
            scheduled.push(Scheduled { tenant: grant.tenant, prefill, tokens: grant.tokens });
        }
        scheduled
    }

    /// Puts back the prefills that go on (taken by [`Pending::take`] for `plan`) at the front of their queues, in
    /// their order, and turns the rotation as `plan` says.
    pub(super) fn put_back(&mut self, continuing: Vec<(usize, Prefill)>, plan: &Plan) {
        for (tenant, prefill) in continuing.into_iter().rev() {
            self.tenants[tenant].queue.push_front(Entry::Prefilling(prefill));
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
        for entry in self.tenants.drain(..).flat_map(|tenant| tenant.queue) {
            match entry {
                Entry::Waiting { submission, .. } => submission.events.send(Err(EngineError::Stopped)),
                Entry::Prefilling(prefill) => prefill.context.events.send(Err(EngineError::Stopped)),
            };
        }
    }

    fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.tenants.iter().flat_map(|tenant| &tenant.queue)
    }
}
