//! The `loragate` crate's integration tests, linked as one test binary (`autotests = false` and one `[[test]]` in
//! `Cargo.toml`): each file beside this one is a module here, so the binary and its dependencies are linked once
//! instead of once per file. Run one file's tests with its module path as the filter, e.g.
//! `cargo test -p loragate --test integration restart::`.
//!
//! A new test file in this directory must be declared below; the last test checks that none is missing.

mod binary;
mod documentation;
mod fleet;
mod fleet_push;
mod held_memory;
mod push_restart;
mod real_model;
mod replica_push;
mod replicas;
mod restart;
mod vllm_interop;

/// Starting the `loragate` binary, shared by the files above (`use crate::spawned`).
#[path = "support/spawned.rs"]
mod spawned;

/// Starting and stopping a real vLLM, shared with `bench_real_model` (`use crate::vllm_server`).
#[path = "support/vllm_server.rs"]
mod vllm_server;

/// Every `.rs` file beside this one is declared above as a module, so that it runs (with `autotests = false`, a file
/// not declared here would never be compiled).
#[test]
fn every_test_file_of_the_directory_is_a_module_of_this_binary() {
    let root = include_str!("integration.rs");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    for entry in std::fs::read_dir(&dir).expect("the tests directory") {
        let path = entry.expect("a directory entry").path();
        let Some(module) = path.file_stem().and_then(|stem| stem.to_str()) else { continue };
        if path.extension().is_some_and(|extension| extension == "rs") && module != "integration" {
            assert!(
                root.contains(&format!("\nmod {module};\n")),
                "tests/{module}.rs is not declared in integration.rs"
            );
        }
    }
}
