//! Issue 32, item 8: a request held for a minimum version is admitted ≤ 1 ms after the version is installed (p99,
//! 1,000 held). Each round holds 1,000 requests for the adapter's next version, loads that version, and times each
//! request from the instant the version was published on the adapter's gate (the watch the held requests wait on;
//! [`loragate_core::AdapterHandle::installed_at`]) to the instant it was admitted. Two kinds of rounds:
//! - `admission`: the gate alone, as the coordinator benchmark's `admit_and_release` measures it: each request is
//!   held by [`loragate_core::AdapterHandle::admit_min_version`], timed when that returns (registered in flight);
//! - `sample`: `Coordinator::sample` with `min_lora_version`, timed when it answers (admitted and handed to the
//!   scripted engine, whose tasks then run beside the admissions still to come).
//!
//! Each request takes its clock reading where its caller sees its admission, then counts itself; the round collects
//! the readings once the last one counted (one wake-up), so that nothing polls the 1,000 tasks' handles while they
//! are still being admitted: `block_on`'s thread is a third thread on the runtime's two workers, and a server has no
//! such thread at work (`VERSION_HOLD_COLLECT=join_all` collects as each task finishes, as this benchmark did before).
//!
//! Prints each round's p50 / p99 / max and those of every round of its kind together. With
//! `VERSION_HOLD_BREAKDOWN=1` each `admission` round also says where its p99 went: from the install to the start of
//! the pass that admits the parked requests, the pass itself, and from the pass's end to the p99 admission, and on
//! how many threads the requests saw their admission (see `docs/benchmarks.md`).
//!
//! `cargo bench -p loragate-benches --bench version_hold` (`VERSION_HOLD_ROUNDS`, default 10; `VERSION_HOLD_COLLECT`;
//! `VERSION_HOLD_BREAKDOWN`)

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use futures::future::join_all;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use loragate_core::testing::{ScriptedEngine, coordinator_with_adapters};
use loragate_core::{AdapterName, AdapterSource, AdapterVersion, Coordinator, CoordinatorConfig, Ending, RequestId};

const HELD: u32 = 1000;

/// Counts the requests of a round that saw their admission; wakes the round's collector once all of them did.
#[derive(Default)]
struct Admitted {
    count: AtomicU32,
    all: Notify,
}

impl Admitted {
    /// One more request saw its admission.
    fn count_one(&self) {
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == HELD {
            self.all.notify_one();
        }
    }

    /// The outputs of `tasks`, taken once every request saw its admission (or, with `VERSION_HOLD_COLLECT=join_all`,
    /// as each task finishes).
    async fn collect<T>(&self, tasks: Vec<JoinHandle<T>>) -> Vec<T> {
        if std::env::var("VERSION_HOLD_COLLECT").as_deref() != Ok("join_all") {
            while self.count.load(Ordering::Acquire) < HELD {
                self.all.notified().await;
            }
        }
        join_all(tasks).await.into_iter().map(|task| task.expect("request task")).collect()
    }
}

/// The next version's install, then the delays from it to each instant in `admitted` (each request's admission).
async fn install_and_time(
    coordinator: &Coordinator,
    name: &AdapterName,
    next: u64,
    admitted: impl std::future::Future<Output = Vec<Instant>>,
) -> Vec<Duration> {
    let adapter = coordinator.lora(name).expect("loaded");
    while adapter.status().await.expect("status").held < HELD {
        tokio::task::yield_now().await;
    }
    let version = coordinator.load_adapter(name, AdapterSource::trusted("/a/bench")).await.expect("loads").version;
    assert_eq!(version.0, next, "the version the requests wait for");
    let admitted = admitted.await;
    let installed = adapter.installed_at(version).expect("the install's instant");
    let delay = |at: Instant| at.checked_duration_since(installed).expect("no request is admitted before its version");
    admitted.into_iter().map(delay).collect()
}

/// Whether `VERSION_HOLD_BREAKDOWN` asks for each `admission` round's breakdown.
fn breakdown() -> bool {
    static BREAKDOWN: OnceLock<bool> = OnceLock::new();
    *BREAKDOWN.get_or_init(|| std::env::var("VERSION_HOLD_BREAKDOWN").is_ok_and(|value| value == "1"))
}

/// One `admission` round: 1,000 requests held by `admit_min_version`.
async fn admission_round(coordinator: &Coordinator, name: &AdapterName) -> Vec<Duration> {
    let adapter = coordinator.lora(name).expect("loaded");
    let next = adapter.status().await.expect("status").version.0 + 1;
    let counted = Arc::new(Admitted::default());
    let held: Vec<_> = (0..HELD)
        .map(|index| {
            let (adapter, counted) = (adapter.clone(), counted.clone());
            let hold_until = coordinator.gate_deadline(None).hold_until();
            tokio::spawn(async move {
                let id = RequestId::parse_or_generate(&format!("held-{index}")).expect("id");
                let admission = adapter.admit_min_version(id, AdapterVersion(next), hold_until).await;
                let at = Instant::now();
                // Read after the clock: the reading stays where the caller saw its admission.
                let thread = breakdown().then(|| std::thread::current().id());
                counted.count_one();
                (at, thread, admission.expect("admitted once the version is installed"))
            })
        })
        .collect();
    let threads = RefCell::new(Vec::new());
    let admitted = async {
        let mut admitted = Vec::with_capacity(HELD as usize);
        for (at, thread, admission) in counted.collect(held).await {
            admitted.push(at);
            threads.borrow_mut().extend(thread);
            admission.hand_back(Ending::Completed);
        }
        admitted
    };
    let delays = install_and_time(coordinator, name, next, admitted).await;
    if breakdown() {
        println!("  {}", where_the_time_went(&adapter, AdapterVersion(next), &delays, &threads.into_inner()));
    }
    delays
}

/// Where one `admission` round's p99 went (`VERSION_HOLD_BREAKDOWN=1`): install → pass start, the pass, pass end →
/// the p99 admission; and how many requests saw their admission on each thread.
fn where_the_time_went(
    adapter: &loragate_core::AdapterHandle,
    version: AdapterVersion,
    delays: &[Duration],
    threads: &[ThreadId],
) -> String {
    let installed = adapter.installed_at(version).expect("the install's instant");
    let Some((pass_started, pass_ended)) = adapter.last_pass() else { return "no pass".into() };
    let mut sorted = delays.to_vec();
    sorted.sort_unstable();
    let p99 = installed + quantile(&sorted, 0.99);
    let us = |later: Instant, earlier: Instant| later.saturating_duration_since(earlier).as_secs_f64() * 1e6;
    let mut per_thread: HashMap<ThreadId, u32> = HashMap::new();
    for thread in threads {
        *per_thread.entry(*thread).or_default() += 1;
    }
    let mut counts: Vec<u32> = per_thread.into_values().collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    format!(
        "install -> pass {:.0} us, pass {:.0} us, pass end -> p99 admission {:.0} us; admissions per thread {counts:?}",
        us(pass_started, installed),
        us(pass_ended, pass_started),
        us(p99, pass_ended),
    )
}

/// One `sample` round: 1,000 `sample` calls with `min_lora_version`.
async fn sample_round(coordinator: &Coordinator, name: &AdapterName) -> Vec<Duration> {
    let adapter = coordinator.lora(name).expect("loaded");
    let next = adapter.status().await.expect("status").version.0 + 1;
    let counted = Arc::new(Admitted::default());
    let held: Vec<_> = (0..HELD)
        .map(|_| {
            let request = loragate_benches::min_version_request(coordinator, name, next);
            let (coordinator, counted) = (coordinator.clone(), counted.clone());
            tokio::spawn(async move {
                let stream = coordinator.sample(request, coordinator.gate_deadline(None)).await;
                let at = Instant::now();
                counted.count_one();
                (at, stream.expect("admitted once the version is installed"))
            })
        })
        .collect();
    let admitted = async {
        let mut admitted = Vec::with_capacity(HELD as usize);
        for (at, stream) in counted.collect(held).await {
            admitted.push(at);
            stream.collect_output().await.expect("finished");
        }
        admitted
    };
    install_and_time(coordinator, name, next, admitted).await
}

/// The `q`-quantile of sorted `delays` (nearest rank).
fn quantile(delays: &[Duration], q: f64) -> Duration {
    let rank = ((q * delays.len() as f64).ceil() as usize).clamp(1, delays.len());
    delays[rank - 1]
}

fn summary(delays: &mut [Duration]) -> String {
    delays.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms",
        ms(quantile(delays, 0.5)),
        ms(quantile(delays, 0.99)),
        ms(quantile(delays, 1.0))
    )
}

fn main() {
    let rounds: usize = std::env::var("VERSION_HOLD_ROUNDS").ok().and_then(|raw| raw.parse().ok()).unwrap_or(10);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(async {
        let coordinator =
            coordinator_with_adapters(ScriptedEngine::new(1), CoordinatorConfig::default(), &["bench"]).await;
        let name = AdapterName::parse("bench").expect("valid name");
        println!("{HELD} requests held for the next version, admitted after its install:");
        let (mut admissions, mut samples) = (Vec::new(), Vec::new());
        for index in 0..rounds {
            let mut delays = admission_round(&coordinator, &name).await;
            println!("admission round {:>2}: {}", index + 1, summary(&mut delays));
            admissions.extend(delays);
            let mut delays = sample_round(&coordinator, &name).await;
            println!("sample round {:>2}:    {}", index + 1, summary(&mut delays));
            samples.extend(delays);
        }
        println!("admission, all {rounds} rounds: {}", summary(&mut admissions));
        println!("sample, all {rounds} rounds:    {}", summary(&mut samples));
    });
}
