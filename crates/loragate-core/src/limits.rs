//! Resource limits on sampling requests: how many may be admitted (in flight: queued or running in the engine) and
//! how many may be held at paused adapters' gates, in all and per adapter.
//!
//! Every admitted or held request occupies a [`Slot`], an RAII guard that counts it in its adapter's and the
//! server's counters and uncounts it when dropped, whatever ends the request (completion, abort, hand-back, error,
//! the client going away). Taking a slot is one atomic compare-and-swap per counter; when a counter is at its cap
//! the request is refused at once with [`CoreError::Overloaded`] naming the limit (RESOURCE_EXHAUSTED / 429), so
//! overload never turns into unbounded queues or memory.
//!
//! The per-adapter caps keep one busy tenant from taking the whole server's budget; by default only the server-wide
//! caps apply.

use crate::contract::{AdapterKey, CoreError, Limit};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// The default of [`Limits::max_in_flight`] (`--max-in-flight`).
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 1024;
/// The default of [`Limits::max_held`] (`--max-held`).
pub const DEFAULT_MAX_HELD: u32 = 4096;

/// The caps on sampling requests. A per-adapter cap of `None` leaves only the server-wide cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Admitted requests (queued or running), over all adapters and the base model.
    pub max_in_flight: u32,
    /// Requests held at paused adapters' gates, over all adapters.
    pub max_held: u32,
    /// Admitted requests of any one adapter (or of the base model).
    pub max_in_flight_per_adapter: Option<u32>,
    /// Requests held at any one adapter's gate.
    pub max_held_per_adapter: Option<u32>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_held: DEFAULT_MAX_HELD,
            max_in_flight_per_adapter: None,
            max_held_per_adapter: None,
        }
    }
}

/// What a [`Slot`] counts a request as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Occupancy {
    /// Admitted: registered and handed to the engine.
    InFlight,
    /// Held at a closed gate.
    Held,
}

/// A counter with a cap (`u32::MAX`: no cap).
#[derive(Debug)]
struct CappedCount {
    count: AtomicU32,
    cap: u32,
    limit: Limit,
}

impl CappedCount {
    fn new(cap: Option<u32>, limit: Limit) -> Self {
        Self { count: AtomicU32::new(0), cap: cap.unwrap_or(u32::MAX), limit }
    }

    /// Counts one more unless the cap is reached.
    fn try_increment(&self) -> bool {
        self.count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| (count < self.cap).then_some(count + 1))
            .is_ok()
    }

    fn decrement(&self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }

    fn get(&self) -> u32 {
        self.count.load(Ordering::Acquire)
    }
}

/// The server-wide counters and the configured caps. One per coordinator.
#[derive(Debug)]
pub(crate) struct ServerLoad {
    limits: Limits,
    in_flight: CappedCount,
    held: CappedCount,
}

/// The server's counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadSnapshot {
    /// Admitted requests (queued or running), all adapters and the base model together.
    pub in_flight: u32,
    /// Requests held at paused gates, all adapters together.
    pub held: u32,
}

impl ServerLoad {
    pub(crate) fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            in_flight: CappedCount::new(Some(limits.max_in_flight), Limit::InFlight),
            held: CappedCount::new(Some(limits.max_held), Limit::Held),
        })
    }

    pub(crate) fn snapshot(&self) -> LoadSnapshot {
        LoadSnapshot { in_flight: self.in_flight.get(), held: self.held.get() }
    }

    fn counter(&self, occupancy: Occupancy) -> &CappedCount {
        match occupancy {
            Occupancy::InFlight => &self.in_flight,
            Occupancy::Held => &self.held,
        }
    }
}

/// One adapter's counters (part of its durable cell), together with the server's.
#[derive(Debug)]
pub(crate) struct AdapterLoad {
    server: Arc<ServerLoad>,
    in_flight: CappedCount,
    held: CappedCount,
}

impl AdapterLoad {
    /// Counters for a new adapter, capped by the server's per-adapter limits.
    pub(crate) fn new(server: &Arc<ServerLoad>) -> Arc<Self> {
        let limits = server.limits;
        Arc::new(Self {
            server: server.clone(),
            in_flight: CappedCount::new(limits.max_in_flight_per_adapter, Limit::InFlightPerAdapter),
            held: CappedCount::new(limits.max_held_per_adapter, Limit::HeldPerAdapter),
        })
    }

    /// Requests of this adapter held at its gate now.
    pub(crate) fn held(&self) -> u32 {
        self.held.get()
    }

    fn counter(&self, occupancy: Occupancy) -> &CappedCount {
        match occupancy {
            Occupancy::InFlight => &self.in_flight,
            Occupancy::Held => &self.held,
        }
    }

    /// Counts one request of `adapter` as `occupancy`, or refuses it naming the limit that is reached (the
    /// adapter's own first, then the server's; a refusal counts nothing).
    pub(crate) fn occupy(self: &Arc<Self>, occupancy: Occupancy, adapter: &AdapterKey) -> Result<Slot, CoreError> {
        self.try_take(occupancy, adapter)?;
        Ok(Slot { load: self.clone(), occupancy })
    }

    /// Takes one `occupancy` on the adapter's counter and on the server's, or neither, naming the limit reached.
    fn try_take(&self, occupancy: Occupancy, adapter: &AdapterKey) -> Result<(), CoreError> {
        let own = self.counter(occupancy);
        if !own.try_increment() {
            return Err(overloaded(own, adapter));
        }
        let server = self.server.counter(occupancy);
        if !server.try_increment() {
            own.decrement();
            return Err(overloaded(server, adapter));
        }
        Ok(())
    }

    /// Counts one request as `occupancy` whatever the caps (it was accepted before; see
    /// `AdapterCell::occupy_uncapped`).
    pub(crate) fn count(self: &Arc<Self>, occupancy: Occupancy) -> Slot {
        self.counter(occupancy).count.fetch_add(1, Ordering::AcqRel);
        self.server.counter(occupancy).count.fetch_add(1, Ordering::AcqRel);
        Slot { load: self.clone(), occupancy }
    }
}

fn overloaded(counter: &CappedCount, adapter: &AdapterKey) -> CoreError {
    CoreError::Overloaded { limit: counter.limit, cap: counter.cap, adapter: adapter.clone() }
}

/// One request counted as in flight or held; uncounted when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    load: Arc<AdapterLoad>,
    occupancy: Occupancy,
}

impl Slot {
    /// Counts the same request as `occupancy` instead (a held request admitted: held → in flight), or refuses it
    /// naming the limit that is reached (then it is counted as nothing). Touches only the counters: the slot's hold
    /// on them is reused, so that a pass admitting many held requests shares no reference count with their waiters.
    pub(crate) fn recount(mut self, occupancy: Occupancy, adapter: &AdapterKey) -> Result<Slot, CoreError> {
        // Refused: `self` drops, uncounting the old occupancy.
        self.load.try_take(occupancy, adapter)?;
        self.load.counter(self.occupancy).decrement();
        self.load.server.counter(self.occupancy).decrement();
        self.occupancy = occupancy;
        Ok(self)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.load.counter(self.occupancy).decrement();
        self.load.server.counter(self.occupancy).decrement();
    }
}

#[cfg(test)]
mod tests;
