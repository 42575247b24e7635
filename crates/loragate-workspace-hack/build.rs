//! Empty: Cargo resolves a package's `[build-dependencies]` (the features set for the host's proc macros and build
//! scripts, see Cargo.toml) only when it has a build script.

fn main() {}
