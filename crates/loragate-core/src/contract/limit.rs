//! Which limit a request ran into: the word shared by the limits, their errors and their metrics.

/// Which limit a request ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Limit {
    /// [`crate::Limits::max_in_flight`].
    InFlight,
    /// [`crate::Limits::max_held`].
    Held,
    /// [`crate::Limits::max_in_flight_per_adapter`].
    InFlightPerAdapter,
    /// [`crate::Limits::max_held_per_adapter`].
    HeldPerAdapter,
}

impl Limit {
    /// The command-line flag that sets this limit.
    pub fn flag(self) -> &'static str {
        match self {
            Self::InFlight => "--max-in-flight",
            Self::Held => "--max-held",
            Self::InFlightPerAdapter => "--max-in-flight-per-adapter",
            Self::HeldPerAdapter => "--max-held-per-adapter",
        }
    }

    /// What the limit counts, in words.
    pub fn counts(self) -> &'static str {
        match self {
            Self::InFlight => "admitted requests in all",
            Self::Held => "requests held at paused gates in all",
            Self::InFlightPerAdapter => "admitted requests per adapter",
            Self::HeldPerAdapter => "requests held at one adapter's gate",
        }
    }

    /// A stable, low-cardinality label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::InFlight => "max_in_flight",
            Self::Held => "max_held",
            Self::InFlightPerAdapter => "max_in_flight_per_adapter",
            Self::HeldPerAdapter => "max_held_per_adapter",
        }
    }
}
