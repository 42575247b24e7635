//! How long a sampling request may wait at a closed gate: never past its client's own deadline, and never longer
//! than the server's maximum hold for any one wait. A request waits at arrival (held by the submission gate) and,
//! if a keep-mode pause stops it later, again while kept; each wait gets the server's maximum from when it starts.

use std::time::Duration;

use tokio::time::Instant;

/// The waiting limits of one sampling request. Made by [`Coordinator::gate_deadline`](crate::Coordinator::gate_deadline)
/// when the request arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateDeadline {
    arrived: Instant,
    client: Option<Instant>,
    max_hold: Duration,
}

impl GateDeadline {
    /// A request arriving now whose client gives up at `client` (if it said), on a server holding at most
    /// `max_hold` per wait.
    pub fn new(client: Option<Instant>, max_hold: Duration) -> Self {
        Self { arrived: Instant::now(), client, max_hold }
    }

    /// Waits that must end at `instant` whatever the server allows (tests, and callers with their own bound).
    pub fn at(instant: Instant) -> Self {
        Self { arrived: Instant::now(), client: Some(instant), max_hold: Duration::MAX }
    }

    /// The client's own deadline, if it gave one.
    pub fn client(&self) -> Option<Instant> {
        self.client
    }

    /// Until when the wait at arrival may last.
    pub fn hold_until(&self) -> Instant {
        self.capped(self.arrived)
    }

    /// Until when a wait starting now may last (a kept request waiting for its adapter to reopen).
    pub fn hold_from_now(&self) -> Instant {
        self.capped(Instant::now())
    }

    fn capped(&self, start: Instant) -> Instant {
        let server = start.checked_add(self.max_hold).unwrap_or_else(|| start + Duration::from_secs(86_400 * 365));
        self.client.map_or(server, |client| client.min(server))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn each_wait_gets_the_server_maximum_within_the_client_deadline() {
        let deadline = GateDeadline::new(None, Duration::from_secs(10));
        let arrival = Instant::now();
        assert_eq!(deadline.hold_until(), arrival + Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(deadline.hold_until(), arrival + Duration::from_secs(10), "the arrival wait keeps its bound");
        assert_eq!(deadline.hold_from_now(), Instant::now() + Duration::from_secs(10), "a later wait gets its own");

        let client = Instant::now() + Duration::from_secs(3);
        let bounded = GateDeadline::new(Some(client), Duration::from_secs(10));
        assert_eq!(bounded.hold_until(), client);
        assert_eq!(bounded.hold_from_now(), client);
        assert_eq!(GateDeadline::at(client).hold_from_now(), client);
    }
}
