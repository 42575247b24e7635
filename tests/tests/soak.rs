//! The bounded loopback soak (issue 13). It measures its process's memory, so each soak runs in a process of its own:
//! its test starts this test binary again with only itself selected ([`in_own_process`]) and checks that child's
//! exit, while the other tests of the binary go on beside it. The short form runs in CI; the long form is
//! `LORAGATE_SOAK_SECS=600 cargo test -p loragate-tests --test integration soak:: -- --ignored --nocapture` (figures
//! in docs/benchmarks.md).

use std::process::Command;
use std::time::Duration;

mod scenario;

use scenario::{SoakConfig, run};

#[test]
fn a_short_soak_loses_nothing_and_leaves_nothing_behind() {
    in_own_process("a_short_soak_loses_nothing_and_leaves_nothing_behind", || async {
        let report = run(SoakConfig::short()).await;
        println!("soak (short): {report:?}");
    });
}

#[test]
#[ignore = "the long form: LORAGATE_SOAK_SECS=600 cargo test -p loragate-tests --test integration soak:: -- --ignored \
            --nocapture"]
fn a_long_soak_loses_nothing_and_leaves_nothing_behind() {
    in_own_process("a_long_soak_loses_nothing_and_leaves_nothing_behind", || async {
        let seconds = std::env::var("LORAGATE_SOAK_SECS").ok().and_then(|raw| raw.parse().ok()).unwrap_or(600);
        let report = run(SoakConfig::long(Duration::from_secs(seconds))).await;
        println!("soak (long, {seconds} s): {report:?}");
    });
}

/// Set by [`in_own_process`] for its child: the name of the one test that child runs.
const OWN_PROCESS_TEST: &str = "LORAGATE_SOAK_OWN_PROCESS";

/// Runs `soak` (on a two-worker runtime) in a process of its own, so that the process's memory is the soak's alone.
/// In the test binary's own run this starts the binary again with only the test `name` (this module's) selected and
/// `OWN_PROCESS_TEST` naming it, and fails with the child's output if the child failed; in that child it runs `soak`.
fn in_own_process<F: Future<Output = ()>>(name: &str, soak: impl FnOnce() -> F) {
    let test = format!("soak::{name}");
    if std::env::var(OWN_PROCESS_TEST).is_ok_and(|running| running == test) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("the soak's runtime");
        runtime.block_on(soak());
        return;
    }
    let binary = std::env::current_exe().expect("this test binary's path");
    let child = Command::new(binary)
        .args([test.as_str(), "--exact", "--include-ignored", "--nocapture", "--test-threads=1"])
        .env(OWN_PROCESS_TEST, &test)
        .output()
        .expect("the test binary starts again");
    let (stdout, stderr) = (String::from_utf8_lossy(&child.stdout), String::from_utf8_lossy(&child.stderr));
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(child.status.success(), "{test} failed in its own process ({}):\n{stdout}\n{stderr}", child.status);
    // The child ran exactly this test (a renamed test would match nothing and pass vacuously).
    assert!(stdout.contains("1 passed"), "{test} did not run in its own process:\n{stdout}");
}
