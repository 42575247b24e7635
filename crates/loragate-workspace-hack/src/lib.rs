//! No code: this crate's manifest turns on, in the dependencies loragate-py shares with the workspace's test build,
//! the features that build turns on, so that scripts/test.sh's maturin build of loragate-py reuses its artifacts
//! (see its Cargo.toml).
