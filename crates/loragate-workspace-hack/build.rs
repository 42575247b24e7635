//! Empty. A build script, as cargo-hakari's workspace-hack crates have one, so that the `[build-dependencies]` of
//! Cargo.toml (the features the host's proc macros see, `syn` 3's) take part in the build.

fn main() {}
