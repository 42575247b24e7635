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
//! The budget counts what a step costs, not only how many tokens it carries: a prompt token at position `p` attends
//! to `p + 1` keys, and far into a long prompt that attention costs as much as the token's weight products (on
//! SmolLM2-135M, at about 3,000 positions). So a chunk's tokens are charged their weight products plus their
//! attention, in units of one token's weight products ([`AttentionCost`]): late chunks of a long prompt get fewer
//! tokens, and a step carrying one costs what a step carrying an early chunk costs, so the streams decoding beside
//! it see no longer gap at the prompt's end than at its start.
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
    /// Prompt positions already in its cache: where its next chunk starts.
    pub(super) position: usize,
}

/// What attention adds to a prompt token's cost: a token seeing `keys` keys costs `1 + keys / positions_per_token`
/// tokens of weight products, where `positions_per_token` keys cost as much attention arithmetic as one token's
/// weight products (the model's [`ModelConfig::attention_positions_per_token`](crate::model::ModelConfig)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct AttentionCost {
    positions_per_token: usize,
}

impl AttentionCost {
    /// Attention counted at `positions_per_token` keys per token (at least 1).
    pub(super) fn new(positions_per_token: usize) -> Self {
        Self { positions_per_token: positions_per_token.max(1) }
    }

    /// Tokens counted alone, their attention free (the planner's tests of everything else).
    #[cfg(test)]
    pub(super) const FREE: Self = Self { positions_per_token: usize::MAX };

    /// The cost of the `tokens` prompt tokens after `position`: `tokens` plus their keys
    /// (`position + 1 ..= position + tokens`) in tokens of weight products, rounded down.
    pub(super) fn of(self, position: usize, tokens: usize) -> usize {
        let (position, count) = (position as u128, tokens as u128);
        let keys = count * position + count * (count + 1) / 2;
        tokens + (keys / self.positions_per_token as u128) as usize
    }

    /// The most of `wanted` more tokens of a chunk that starts at `start` and already holds `already` tokens, whose
    /// added cost is at most `budget`, and that cost. Costs are taken of the whole chunk, so that a chunk granted in
    /// several rounds costs what it would in one. A chunk's first token is granted even where it alone costs more
    /// than `budget` (charged `budget`), so that a prompt always advances; `(0, 0)` where nothing more fits.
    pub(super) fn fit(self, start: usize, already: usize, wanted: usize, budget: usize) -> (usize, usize) {
        if budget == 0 || wanted == 0 {
            return (0, 0);
        }
        let held = self.of(start, already);
        let added = |tokens: usize| self.of(start, already + tokens) - held;
        if added(1) > budget {
            return if already == 0 { (1, budget) } else { (0, 0) };
        }
        // The cost grows with the tokens: the largest that fits, by bisection over 1..=min(wanted, budget).
        let (mut fits, mut too_many) = (1, wanted.min(budget) + 1);
        while too_many - fits > 1 {
            let middle = (fits + too_many) / 2;
            if added(middle) <= budget { fits = middle } else { too_many = middle }
        }
        (fits, added(fits))
    }
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
    /// How a prompt token's attention counts against the budget.
    pub(super) attention: AttentionCost,
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

/// Deals `limits.budget` over `tenants` (each a queue, in rotation order), each chunk charged its cost
/// ([`AttentionCost`]).
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
                    let fits = places_taken == 0 || places_taken + queued.samples <= limits.places;
                    if blocked.is_some() || !fits {
                        blocked = blocked.or(Some(tenant));
                        state.done = true;
                        break;
                    }
                    places_taken += queued.samples;
                }
                let wanted = queued.remaining - state.granted;
                let (tokens, cost) = limits.attention.fit(queued.position, state.granted, wanted, left);
                if tokens == 0 {
                    break;
                }
                grants.push(Grant { tenant, entry: state.next, tokens });
                state.granted += tokens;
                left -= cost;
                budget -= cost;
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
        Queued { remaining, samples: 1, started: false, position: 0 }
    }

    fn limits(budget: usize) -> Limits {
        Limits { budget, places_taken: 0, places: 64, min_share: 16, attention: AttentionCost::FREE }
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
        let big = Queued { remaining: 4, samples: 3, started: false, position: 0 };
        let started = Queued { remaining: 50, samples: 1, started: true, position: 10 };
        let tenants = vec![vec![waiting(5)], vec![big, waiting(1)], vec![started, waiting(2)], vec![waiting(7)]];
        let limits = Limits { budget: 200, places_taken: 60, places: 62, min_share: 1, attention: AttentionCost::FREE };
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
    fn a_request_larger_than_the_batch_starts_when_nothing_runs() {
        let tenants = vec![vec![Queued { remaining: 4, samples: 100, started: false, position: 0 }]];
        let idle = plan(
            &tenants,
            Limits { budget: 10, places_taken: 0, places: 8, min_share: 1, attention: AttentionCost::FREE },
        );
        assert_eq!(idle.grants, vec![Grant { tenant: 0, entry: 0, tokens: 4 }]);
        let busy = plan(
            &tenants,
            Limits { budget: 10, places_taken: 1, places: 8, min_share: 1, attention: AttentionCost::FREE },
        );
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

    #[test]
    fn a_chunk_is_charged_its_attention_and_a_prompt_always_advances() {
        let attention = AttentionCost::new(3000);
        assert_eq!(attention.of(0, 80), 80 + 1, "80 tokens see 1 + 2 + … + 80 = 3,240 keys");
        assert_eq!(attention.of(3000, 32), 32 + 32, "32 tokens at 3,000 see 96,528 keys");
        assert_eq!(attention.fit(0, 0, 1000, 64), (64, 64));
        assert_eq!(attention.fit(3000, 0, 1000, 64), (32, 64), "late in a long prompt, half the tokens");
        assert_eq!(attention.fit(3000, 0, 10, 64), (10, 20));
        assert_eq!(attention.fit(1_000_000, 0, 10, 64), (1, 64), "one token even where it costs more than the budget");
        assert_eq!(attention.fit(1_000_000, 1, 10, 64), (0, 0), "but not a second");
        assert_eq!(attention.fit(3000, 32, 10, 1), (0, 0), "the 33rd token at 3,000 costs 2");
        assert_eq!(attention.fit(0, 32, 10, 8), (8, 8), "a chunk continued costs what it would in one go");
        assert_eq!(attention.fit(5, 0, 0, 64), (0, 0));
        assert_eq!(AttentionCost::FREE.fit(1_000_000, 0, 100, 64), (64, 64));
    }

    #[test]
    fn a_long_prompts_late_chunks_get_fewer_tokens_than_its_first() {
        let attention = AttentionCost::new(3000);
        let limits = Limits { budget: 64, places_taken: 16, places: 64, min_share: 16, attention };
        let first = plan(&[vec![waiting(3000)]], limits);
        let late = Queued { remaining: 100, samples: 1, started: true, position: 2900 };
        let last = plan(&[vec![late]], limits);
        assert_eq!(first.grants, vec![Grant { tenant: 0, entry: 0, tokens: 64 }]);
        assert_eq!(last.grants, vec![Grant { tenant: 0, entry: 0, tokens: 32 }], "32 cost 63, a 33rd would cost 2");
    }

    fn queued() -> impl Strategy<Value = Queued> {
        (1usize..300, 1usize..4, any::<bool>(), 0usize..5000).prop_map(|(remaining, samples, started, position)| {
            Queued { remaining, samples, started, position: if started { position } else { 0 } }
        })
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
            attention_positions in prop::option::of(1usize..5000),
        ) {
            let attention = attention_positions.map_or(AttentionCost::FREE, AttentionCost::new);
            let limits = Limits { budget, places_taken: taken, places, min_share, attention };
            let plan = plan(&tenants, limits);
            let total: usize = plan.grants.iter().map(|grant| grant.tokens).sum();
            prop_assert!(total <= budget, "budget exceeded: {total} > {budget}");
            // The chunks' costs hold the budget too, but for a first token that alone costs more than what was left.
            let cost_of = |grant: &Grant| attention.of(tenants[grant.tenant][grant.entry].position, grant.tokens);
            let cost: usize = plan.grants.iter().map(cost_of).sum();
            let lone_tokens: usize = plan.grants.iter().filter(|grant| grant.tokens == 1).map(cost_of).sum();
            prop_assert!(cost <= budget + lone_tokens, "costs exceeded: {cost} > {budget} + {lone_tokens}");
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
            // Work conservation: budget is left over only if nobody could use it (tokens counted alone).
            if attention == AttentionCost::FREE && total < budget && plan.blocked.is_none() {
                for (index, queue) in tenants.iter().enumerate() {
                    let granted: usize = plan.grants.iter().filter(|g| g.tenant == index).map(|g| g.tokens).sum();
                    let wanted: usize = queue.iter().map(|queued| queued.remaining).sum();
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
            let limits = Limits { budget: with_work * 16 + extra, places_taken: 0, places: 1000, min_share: 16, attention: AttentionCost::FREE };
            let plan = plan(&tenants, limits);
            for (index, queue) in tenants.iter().enumerate() {
                if !queue.is_empty() {
                    prop_assert!(plan.grants.iter().any(|grant| grant.tenant == index), "tenant {} starved", index);
                }
            }
        }
    }
}
