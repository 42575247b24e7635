//! The bounded loopback soak (issue 13), in its own test binary so that its memory figures are this process's
//! alone. The short form runs in CI; the long form is `LORAGATE_SOAK_SECS=600 cargo test -p loragate-tests --test soak
//! -- --ignored --nocapture` (figures in docs/benchmarks.md).

use std::time::Duration;

#[path = "soak/scenario.rs"]
mod scenario;

use scenario::{SoakConfig, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_soak_loses_nothing_and_leaves_nothing_behind() {
    let report = run(SoakConfig::short()).await;
    println!("soak (short): {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the long form: LORAGATE_SOAK_SECS=600 cargo test -p loragate-tests --test soak -- --ignored --nocapture"]
async fn a_long_soak_loses_nothing_and_leaves_nothing_behind() {
    let seconds = std::env::var("LORAGATE_SOAK_SECS").ok().and_then(|raw| raw.parse().ok()).unwrap_or(600);
    let report = run(SoakConfig::long(Duration::from_secs(seconds))).await;
    println!("soak (long, {seconds} s): {report:?}");
}
