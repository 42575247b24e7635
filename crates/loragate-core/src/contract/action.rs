//! What a caller wants to do: the word the keyring decides on and the errors name.

use std::fmt;

/// What a caller wants to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Action {
    /// Sample, long-poll an adapter's pause state, list adapters.
    Sample,
    /// Pause (abort), resume, load or unload an adapter.
    Control,
    /// Anything not about one adapter: fleet changes and server-wide operations.
    Admin,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Sample => "sample",
            Self::Control => "control (pause, resume, load, unload)",
            Self::Admin => "administer the server",
        })
    }
}
