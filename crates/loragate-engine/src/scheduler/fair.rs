//! How one step's prefill budget is shared: round-robin over tenants, first come first served within a tenant.
//!
//! A pure function of what is queued, so that its invariants can be checked over many random queues without a model.
//! Each tenant (an adapter, or the base model) has a queue: the prompts it is prefilling come first, then its waiting
//! requests, in arrival order. The budget left after the decode rows is dealt in rounds: every tenant with work gets
//! an equal share (at least `min_share` tokens, so that many tenants do not shred the step into tiny chunks; the
//! tenants first in the rotation get it first) and spends it on its queue from the front: it continues its prefill,
//! then starts its next waiting request, whose sequences then hold their places in the batch. Shares a tenant cannot
//! use go round again to the others, until the budget is spent or nobody has work. So one adapter's 32 waiting
//! continuations take half of each step's prefill budget, not all of it, the moment another tenant has a request.
//!
//! A request is started only if the batch has room for its `num_samples` sequences (a request larger than the whole
//! batch starts when nothing else runs). If a tenant's next request does not fit, no other tenant starts one either
//! in that step, and that tenant keeps its place at the front of the rotation: requests that free no room cannot
//! overtake it forever.

/// What the planner sees of one queued request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Queued {
    /// Prompt tokens still to prefill (at least 1).
    pub(super) remaining: usize,
    /// The batch places its sequences take.
    pub(super) samples: usize,
    /// Whether its prefill has started (its places are taken).
    pub(super) started: bool,
    /// Whether it may start now (a started one always is).
    pub(super) ready: bool,
}

/// The limits of one step.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// Prompt tokens this step may prefill.
    pub(super) budget: usize,
    /// Batch places taken: decode rows, and the sequences of started prefills.
    pub(super) places_taken: usize,
    /// The batch's places (`max_batch_size`).
    pub(super) places: usize,
    /// The smallest share dealt to a tenant while the budget allows it.
    pub(super) min_share: usize,
}

/// Tokens of one queued request to prefill in this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Grant {
    /// The tenant's index in the rotation.
    pub(super) tenant: usize,
    /// The request's index in its tenant's queue.
    pub(super) entry: usize,
    pub(super) tokens: usize,
}

/// One step's prefill.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    /// Per tenant, its granted requests in queue order: always a prefix of its queue, all but the last of them
    /// granted every token they have left.
    pub(super) grants: Vec<Grant>,
    /// The tenant whose next request did not fit in the batch, if any: it stays at the front of the rotation.
    pub(super) blocked: Option<usize>,
}

impl Plan {
    /// The rotation for the next step, as indices into this one's: tenants that got no tokens (and the blocked
    /// one) keep their order at the front; those served move to the back, in the order they were served.
    pub(super) fn next_rotation(&self, tenants: usize) -> Vec<usize> {
        let mut served = vec![false; tenants];
        for grant in &self.grants {
            served[grant.tenant] = Some(grant.tenant) != self.blocked;
        }
        let waiting = (0..tenants).filter(|&tenant| !served[tenant]);
        waiting.chain((0..tenants).filter(|&tenant| served[tenant])).collect()
    }
}

/// Deals `limits.budget` prefill tokens over `tenants` (each a queue, in rotation order).
pub(super) fn plan(tenants: &[Vec<Queued>], limits: Limits) -> Plan {
    struct Progress {
        /// The queue entry being granted tokens.
        next: usize,
        /// Tokens granted to the entry `next` so far.
        granted: usize,
        /// Nothing more for this tenant in this step.
        done: bool,
    }
    let mut progress: Vec<Progress> =
        tenants.iter().map(|queue| Progress { next: 0, granted: 0, done: queue.is_empty() }).collect();
    let mut grants: Vec<Grant> = Vec::new();
    let mut budget = limits.budget;
    let mut places_taken = limits.places_taken;
    let mut blocked = None;
    loop {
        let active: Vec<usize> = (0..tenants.len()).filter(|&tenant| !progress[tenant].done).collect();
        if budget == 0 || active.is_empty() {
            break;
        }
        let share = budget.div_ceil(active.len()).max(limits.min_share);
        let mut dealt = false;
        for tenant in active {
            let mut left = share.min(budget);
            let state = &mut progress[tenant];
            while left > 0 {
                let Some(queued) = tenants[tenant].get(state.next) else {
                    state.done = true;
                    break;
                };
                if !queued.started && state.granted == 0 {
                    if !queued.ready {
                        state.done = true;
                        break;
                    }
                    let fits = places_taken == 0 || places_taken + queued.samples <= limits.places;
                    if blocked.is_some() || !fits {
                        blocked = blocked.or(Some(tenant));
                        state.done = true;
                        break;
                    }
                    places_taken += queued.samples;
                }
                let tokens = (queued.remaining - state.granted).min(left);
                grants.push(Grant { tenant, entry: state.next, tokens });
                state.granted += tokens;
                left -= tokens;
                budget -= tokens;
                dealt = true;
                if state.granted == queued.remaining {
                    state.next += 1;
                    state.granted = 0;
                }
            }
            if budget == 0 {
                break;
            }
        }
        if !dealt {
            break;
        }
    }
    grants.sort_by_key(|grant| (grant.tenant, grant.entry));
    // Merge the grants a request received over several rounds.
    let mut merged: Vec<Grant> = Vec::with_capacity(grants.len());
    for grant in grants {
        match merged.last_mut() {
            Some(last) if last.tenant == grant.tenant && last.entry == grant.entry => last.tokens += grant.tokens,
            _ => merged.push(grant),
        }
    }
    Plan { grants: merged, blocked }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn waiting(remaining: usize) -> Queued {
        Queued { remaining, samples: 1, started: false, ready: true }
    }

    fn limits(budget: usize) -> Limits {
        Limits { budget, places_taken: 0, places: 64, min_share: 16 }
    }

    fn tokens_of(plan: &Plan, tenant: usize) -> usize {
        plan.grants.iter().filter(|grant| grant.tenant == tenant).map(|grant| grant.tokens).sum()
    }

    #[test]
    fn a_new_tenant_gets_half_the_budget_beside_thirty_two_waiting_continuations() {
        let tenants = vec![vec![waiting(130); 32], vec![waiting(100)]];
        let plan = plan(&tenants, limits(127));
        assert_eq!(tokens_of(&plan, 0) + tokens_of(&plan, 1), 127);
        assert_eq!(tokens_of(&plan, 1), 63, "{plan:?}");
        assert_eq!(plan.grants[0], Grant { tenant: 0, entry: 0, tokens: 64 }, "first come first served within A");
    }

    #[test]
    fn what_one_tenant_cannot_use_goes_to_the_others() {
        let tenants = vec![vec![waiting(3)], vec![waiting(500)], vec![]];
        let plan = plan(&tenants, limits(100));
        assert_eq!((tokens_of(&plan, 0), tokens_of(&plan, 1)), (3, 97));
    }

    #[test]
    fn a_request_that_does_not_fit_blocks_every_later_start_and_keeps_its_place() {
        let big = Queued { remaining: 4, samples: 3, started: false, ready: true };
        let started = Queued { remaining: 50, samples: 1, started: true, ready: true };
        let tenants = vec![vec![waiting(5)], vec![big, waiting(1)], vec![started, waiting(2)], vec![waiting(7)]];
        let limits = Limits { budget: 200, places_taken: 60, places: 62, min_share: 1 };
        let plan = plan(&tenants, limits);
        assert_eq!(plan.blocked, Some(1));
        assert_eq!(
            plan.grants,
            vec![Grant { tenant: 0, entry: 0, tokens: 5 }, Grant { tenant: 2, entry: 0, tokens: 50 }],
            "tenant 0 started before the block; tenant 2 continues its prefill but starts nothing after it"
        );
        assert_eq!(plan.next_rotation(4), vec![1, 3, 0, 2]);
    }

    #[test]
    fn a_request_waiting_for_another_prefills_blocks_starts_nothing_after_it_and_blocks_no_other_tenant() {
        let not_ready = Queued { remaining: 20, samples: 1, started: false, ready: false };
        let started = Queued { remaining: 10, samples: 1, started: true, ready: true };
        let tenants = vec![vec![started, not_ready, waiting(5)], vec![waiting(7)]];
        let plan = plan(&tenants, limits(100));
        assert_eq!(plan.blocked, None);
        assert_eq!(
            plan.grants,
            vec![Grant { tenant: 0, entry: 0, tokens: 10 }, Grant { tenant: 1, entry: 0, tokens: 7 }],
            "tenant 0 continues its prefill and waits; tenant 1 starts"
        );
    }

    #[test]
    fn a_request_larger_than_the_batch_starts_when_nothing_runs() {
        let tenants = vec![vec![Queued { remaining: 4, samples: 100, started: false, ready: true }]];
        let idle = plan(&tenants, Limits { budget: 10, places_taken: 0, places: 8, min_share: 1 });
        assert_eq!(idle.grants, vec![Grant { tenant: 0, entry: 0, tokens: 4 }]);
        let busy = plan(&tenants, Limits { budget: 10, places_taken: 1, places: 8, min_share: 1 });
        assert_eq!((busy.grants.len(), busy.blocked), (0, Some(0)));
    }

    #[test]
    fn many_tenants_get_at_least_the_minimum_share_and_take_turns() {
        let tenants = vec![vec![waiting(1000)]; 10];
        let plan = plan(&tenants, limits(64));
        assert_eq!(plan.grants.len(), 4, "{plan:?}");
        assert!(plan.grants.iter().all(|grant| grant.tokens == 16));
        assert_eq!(plan.next_rotation(10), vec![4, 5, 6, 7, 8, 9, 0, 1, 2, 3]);
    }

    fn queued() -> impl Strategy<Value = Queued> {
        (1usize..300, 1usize..4, any::<bool>(), prop::bool::weighted(0.85)).prop_map(
            |(remaining, samples, started, ready)| Queued { remaining, samples, started, ready: ready || started },
        )
    }

    /// Queues whose started requests come first, as the scheduler keeps them.
    fn tenants() -> impl Strategy<Value = Vec<Vec<Queued>>> {
        prop::collection::vec(prop::collection::vec(queued(), 0..6), 0..8).prop_map(|mut tenants| {
            for queue in &mut tenants {
                queue.sort_by_key(|queued| !queued.started);
            }
            tenants
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn plans_keep_the_budget_the_batch_and_the_order_of_each_queue(
            tenants in tenants(),
            budget in 0usize..400,
            places in 1usize..16,
            taken in 0usize..16,
            min_share in 1usize..32,
        ) {
            let limits = Limits { budget, places_taken: taken, places, min_share };
            let plan = plan(&tenants, limits);
            let total: usize = plan.grants.iter().map(|grant| grant.tokens).sum();
            prop_assert!(total <= budget, "budget exceeded: {total} > {budget}");
            let mut new_places = 0;
            for (index, queue) in tenants.iter().enumerate() {
                let grants: Vec<&Grant> = plan.grants.iter().filter(|grant| grant.tenant == index).collect();
                for (position, grant) in grants.iter().enumerate() {
                    prop_assert_eq!(grant.entry, position, "grants are a prefix of the queue");
                    prop_assert!(grant.tokens > 0 && grant.tokens <= queue[grant.entry].remaining);
                    if position + 1 < grants.len() {
                        prop_assert_eq!(grant.tokens, queue[grant.entry].remaining, "only the last is partial");
                    }
                    if !queue[grant.entry].started {
                        new_places += queue[grant.entry].samples;
                    }
                }
            }
            if new_places > 0 && taken > 0 {
                prop_assert!(taken + new_places <= places, "the batch overflows");
            }
            // Work conservation: budget is left over only if nobody could use it.
            if total < budget && plan.blocked.is_none() {
                for (index, queue) in tenants.iter().enumerate() {
                    let granted: usize = plan.grants.iter().filter(|g| g.tenant == index).map(|g| g.tokens).sum();
                    let startable = queue.iter().take_while(|queued| queued.started || queued.ready);
                    let wanted: usize = startable.map(|queued| queued.remaining).sum();
                    prop_assert_eq!(granted, wanted, "tenant {} could have used the leftover budget", index);
                }
            }
            let rotation = plan.next_rotation(tenants.len());
            let mut sorted = rotation.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..tenants.len()).collect::<Vec<_>>());
        }

        #[test]
        fn every_tenant_with_work_gets_tokens_when_the_budget_allows_its_share(
            tenants in tenants(),
            extra in 0usize..100,
        ) {
            let with_work = tenants.iter().filter(|queue| !queue.is_empty()).count();
            let limits = Limits { budget: with_work * 16 + extra, places_taken: 0, places: 1000, min_share: 16 };
            let plan = plan(&tenants, limits);
            for (index, queue) in tenants.iter().enumerate() {
                if queue.first().is_some_and(|queued| queued.started || queued.ready) {
                    prop_assert!(plan.grants.iter().any(|grant| grant.tenant == index), "tenant {} starved", index);
                }
            }
        }
    }
}
