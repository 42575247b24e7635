//! Several coordinators sharing state through a real etcd on loopback (each test starts its own, on free ports, and
//! stops it): pauses hold on every live replica before they answer, versions never repeat across replicas, a dead
//! replica stops counting once its lease runs out, and a replica that lost etcd refuses state changes, keeps serving
//! samples, and catches up when etcd returns. Every wait polls with a deadline; nothing sleeps to synchronise.

mod support {
    pub(crate) mod etcd;
    pub(crate) mod proxy;
}

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use loragate_core::state::{FrontRecord, StateChange, StateStore};
use loragate_core::testing::{ScriptedEngine, eventually, eventually_within};
use loragate_core::{
    AdapterName, AdapterSource, AdapterVersion, Coordinator, CoordinatorConfig, CoreError, FinishReason, PauseMode,
    PauseRequest, RawSampleRequest, SampleOutput, StateError,
};
use loragate_etcd::{EtcdConfig, EtcdStore, EtcdUrl};
use tokio::task::JoinHandle;

use self::support::etcd::{EtcdServer, etcd_or_skip};
use self::support::proxy::Proxy;

/// Tokens a scripted request emits before it waits to be aborted.
const HOLD_AFTER: u32 = 3;
/// A budget the scripted engine finishes at once.
const SHORT: u32 = 2;
/// A budget that keeps a scripted request in flight until it is aborted.
const LONG: u32 = 1000;
/// The replicas' registration lease in these tests: how long a dead one still counts.
const REPLICA_TTL: Duration = Duration::from_secs(2);
/// How long a start, or a wait on etcd, may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(30);

fn name(raw: &str) -> AdapterName {
    AdapterName::parse(raw).expect("a valid name")
}

/// A store on `endpoint` (etcd itself, or a proxy in front of it) under `prefix`; retries while etcd starts.
async fn connect(endpoint: &str, prefix: &str) -> EtcdStore {
    let url = EtcdUrl::parse(&format!("etcd://{endpoint}/{prefix}")).expect("a valid URL");
    let config = EtcdConfig { replica_ttl: REPLICA_TTL, ack_timeout: Duration::from_secs(15), ..EtcdConfig::new(url) };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match EtcdStore::connect(config.clone()).await {
            Ok(store) => return store,
            Err(err) => {
                assert!(tokio::time::Instant::now() < deadline, "etcd did not answer: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One coordinator on the shared state, with its scripted engine.
struct Replica {
    coordinator: Coordinator,
    engine: Arc<ScriptedEngine>,
    id: String,
}

impl Replica {
    /// A replica on `endpoint` (etcd itself, or a proxy in front of it) under `prefix`. Connecting retries while etcd
    /// starts.
    async fn join(endpoint: &str, prefix: &str) -> Self {
        let store = connect(endpoint, prefix).await;
        let id = store.replica_id().to_owned();
        let engine = Arc::new(ScriptedEngine::new(HOLD_AFTER));
        let config = CoordinatorConfig {
            state: Arc::new(store),
            abort_ack_timeout: Duration::from_secs(10),
            ..CoordinatorConfig::default()
        };
        let coordinator = Coordinator::start(engine.clone(), config).await.expect("the replica starts");
        let (grpc, http) = ("127.0.0.1:1".parse().expect("addr"), "127.0.0.1:2".parse().expect("addr"));
        coordinator.announce(grpc, http).await.expect("announced");
        Self { coordinator, engine, id }
    }

    /// Samples `budget` tokens of `lora` to the end, in a task.
    fn sample(&self, lora: &str, budget: u32, id: &str) -> JoinHandle<Result<SampleOutput, CoreError>> {
        let raw = RawSampleRequest {
            request_id: id.into(),
            lora_name: lora.into(),
            prompt_token_ids: vec![1, 2, 3],
            max_tokens: Some(budget),
            ..Default::default()
        };
        let request = self.coordinator.parse_sample(raw).expect("a valid request");
        let coordinator = self.coordinator.clone();
        tokio::spawn(async move {
            let deadline = coordinator.gate_deadline(None);
            coordinator.sample(request, deadline).await?.collect_output().await
        })
    }

    fn serves(&self, lora: &str) -> bool {
        self.coordinator.lora(&name(lora)).is_ok()
    }

    fn paused(&self, lora: &str) -> bool {
        self.coordinator.lora(&name(lora)).is_ok_and(|adapter| adapter.gate().paused)
    }

    fn version(&self, lora: &str) -> u64 {
        self.coordinator.lora(&name(lora)).map_or(0, |adapter| adapter.gate().version.0)
    }

    async fn in_flight(&self, lora: &str) -> u32 {
        let adapter = self.coordinator.lora(&name(lora)).expect("served");
        adapter.status().await.map_or(0, |status| status.in_flight)
    }

    async fn held(&self, lora: &str) -> u32 {
        let adapter = self.coordinator.lora(&name(lora)).expect("served");
        adapter.status().await.map_or(0, |status| status.held)
    }

    async fn load(&self, lora: &str) -> Result<u64, CoreError> {
        let source = AdapterSource::trusted(format!("/adapters/{lora}"));
        self.coordinator.load_adapter(&name(lora), source).await.map(|installed| installed.version.0)
    }
}

async fn finished<T>(task: JoinHandle<T>) -> T {
    tokio::time::timeout(PATIENCE, task).await.expect("finished in time").expect("the task did not panic")
}

fn finish_reason(output: &SampleOutput) -> FinishReason {
    output.sequences[0].finish_reason
}

fn trainer_pause(mode: PauseMode) -> PauseRequest {
    PauseRequest::parse(mode, "trainer", 0.0).expect("a valid pause")
}

fn is_etcd_unavailable(err: &CoreError) -> bool {
    matches!(err, CoreError::State(StateError::Unavailable(reason)) if reason.contains("etcd"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_on_one_replica_holds_every_replica_and_a_resume_on_another_reopens_all() {
    let Some(binary) = etcd_or_skip("a_pause_on_one_replica_holds_every_replica") else { return };
    let etcd = EtcdServer::start(binary);
    let a = Replica::join(&etcd.endpoint(), "three").await;
    let b = Replica::join(&etcd.endpoint(), "three").await;
    let c = Replica::join(&etcd.endpoint(), "three").await;

    let listed = a.coordinator.replicas().await.expect("listed");
    let ids: BTreeSet<&str> = listed.iter().map(|replica| replica.id.as_str()).collect();
    assert_eq!(ids, BTreeSet::from([a.id.as_str(), b.id.as_str(), c.id.as_str()]), "{listed:?}");
    assert_eq!(
        listed.iter().filter(|replica| replica.this_replica).map(|r| r.id.as_str()).collect::<Vec<_>>(),
        [a.id.as_str()]
    );

    assert_eq!(a.load("meow").await.expect("loaded on A"), 1);
    eventually("B and C serve A's meow", || async { b.serves("meow") && c.serves("meow") }).await;
    assert_eq!(
        (b.engine.installed(&name("meow")), c.engine.installed(&name("meow"))),
        (Some(AdapterVersion(1)), Some(AdapterVersion(1)))
    );

    let running = [b.sample("meow", LONG, "b-1"), b.sample("meow", LONG, "b-2"), c.sample("meow", LONG, "c-1")];
    eventually("B and C have their requests in flight", || async {
        b.in_flight("meow").await == 2 && c.in_flight("meow").await == 1
    })
    .await;

    let report = a.coordinator.pause(&name("meow"), trainer_pause(PauseMode::Abort), None).await.expect("paused");
    // Before the pause answered, every replica closed its gate and handed back its requests.
    assert!(a.paused("meow") && b.paused("meow") && c.paused("meow"));
    let mut aborted: Vec<String> = report.aborted.iter().map(ToString::to_string).collect();
    aborted.sort();
    assert_eq!(aborted, ["b-1", "b-2", "c-1"], "the answer sums the replicas' hand-backs");
    for task in running {
        assert_eq!(finish_reason(&finished(task).await.expect("handed back")), FinishReason::Abort);
    }

    let held = [b.sample("meow", SHORT, "b-held"), c.sample("meow", SHORT, "c-held")];
    eventually("the new samples are held on B and C", || async {
        b.held("meow").await == 1 && c.held("meow").await == 1
    })
    .await;

    let resumed = c.coordinator.resume(&name("meow"), Some(report.pause_id.clone())).await.expect("resumed on C");
    assert!(resumed.was_paused && !resumed.still_paused);
    eventually("every replica reopened", || async { !a.paused("meow") && !b.paused("meow") && !c.paused("meow") })
        .await;
    for task in held {
        assert_eq!(finish_reason(&finished(task).await.expect("ran after the resume")), FinishReason::Length);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_loads_on_two_replicas_issue_distinct_versions_and_both_serve_the_last() {
    let Some(binary) = etcd_or_skip("concurrent_loads_on_two_replicas") else { return };
    let etcd = EtcdServer::start(binary);
    let a = Arc::new(Replica::join(&etcd.endpoint(), "loads").await);
    let b = Arc::new(Replica::join(&etcd.endpoint(), "loads").await);
    const EACH: usize = 6;
    let loads: Vec<JoinHandle<Result<u64, CoreError>>> = (0..EACH)
        .flat_map(|_| [a.clone(), b.clone()])
        .map(|replica| tokio::spawn(async move { replica.load("woof").await }))
        .collect();
    let mut versions = BTreeSet::new();
    for load in loads {
        assert!(versions.insert(finished(load).await.expect("loaded")), "a version was issued twice: {versions:?}");
    }
    let expected: BTreeSet<u64> = (1..=2 * EACH as u64).collect();
    assert_eq!(versions, expected, "no gaps, no repeats");
    let last = 2 * EACH as u64;
    eventually("both replicas serve the last version", || async {
        a.version("woof") == last && b.version("woof") == last
    })
    .await;
    let recorded = a.coordinator.list_adapters().await;
    assert_eq!(recorded.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replica_stops_counting_once_its_lease_runs_out_and_catches_up_when_it_returns() {
    let Some(binary) = etcd_or_skip("a_dead_replica_stops_counting") else { return };
    let etcd = EtcdServer::start(binary);
    let proxy = Proxy::start(etcd.endpoint()).await;
    let a = Replica::join(&etcd.endpoint(), "dead").await;
    let b = Replica::join(&proxy.endpoint(), "dead").await;
    a.load("meow").await.expect("loaded");
    eventually("B serves meow", || async { b.serves("meow") }).await;
    let on_b = b.sample("meow", LONG, "b-1");
    eventually("B has a request in flight", || async { b.in_flight("meow").await == 1 }).await;

    // B is cut off from etcd, as a crashed or partitioned replica is: its lease is no longer renewed.
    proxy.cut();
    let started = tokio::time::Instant::now();
    let report = a.coordinator.pause(&name("meow"), trainer_pause(PauseMode::Abort), None).await.expect("paused");
    assert!(report.aborted.is_empty(), "B never applied it: {report:?}");
    assert!(started.elapsed() >= REPLICA_TTL / 2, "the pause waited for B until its lease ran out");
    let listed = a.coordinator.replicas().await.expect("listed");
    assert_eq!(listed.iter().map(|replica| replica.id.as_str()).collect::<Vec<_>>(), [a.id.as_str()]);

    // Cut off, B refuses state changes (naming etcd) and keeps serving with the gate it had.
    eventually("B knows etcd is unreachable", || async {
        b.coordinator.resume(&name("meow"), None).await.is_err_and(|err| is_etcd_unavailable(&err))
    })
    .await;
    let err = b.load("meow").await.expect_err("refused");
    assert!(is_etcd_unavailable(&err), "{err}");
    assert!(!b.paused("meow"));
    let sampled = finished(b.sample("meow", SHORT, "b-2")).await.expect("B still samples");
    assert_eq!(finish_reason(&sampled), FinishReason::Length);

    // Back in touch, B catches up: the pause made meanwhile closes its gate and hands back its request.
    proxy.mend();
    eventually_within("B applied the pause it missed", PATIENCE, || async { b.paused("meow") }).await;
    assert_eq!(finish_reason(&finished(on_b).await.expect("handed back")), FinishReason::Abort);
    eventually_within("B registered again", PATIENCE, || async {
        a.coordinator.replicas().await.is_ok_and(|listed| listed.len() == 2)
    })
    .await;
    a.coordinator.resume(&name("meow"), None).await.expect("resumed");
    eventually("B reopened", || async { !b.paused("meow") }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_stopped_state_changes_are_refused_samples_run_and_a_restart_brings_pauses_back() {
    let Some(binary) = etcd_or_skip("with_etcd_stopped") else { return };
    let mut etcd = EtcdServer::start(binary);
    let a = Replica::join(&etcd.endpoint(), "outage").await;
    let b = Replica::join(&etcd.endpoint(), "outage").await;
    a.load("meow").await.expect("loaded");
    eventually("B serves meow", || async { b.serves("meow") }).await;

    etcd.stop();
    eventually("A refuses a pause, naming etcd", || async {
        let paused = a.coordinator.pause(&name("meow"), trainer_pause(PauseMode::Abort), None).await;
        paused.is_err_and(|err| is_etcd_unavailable(&err))
    })
    .await;
    assert!(!a.paused("meow") && !b.paused("meow"), "a refused pause is not left holding anywhere");
    assert!(is_etcd_unavailable(&a.load("woof").await.expect_err("refused")));
    for (replica, id) in [(&a, "a-1"), (&b, "b-1")] {
        let output = finished(replica.sample("meow", SHORT, id)).await.expect("samples run without etcd");
        assert_eq!(finish_reason(&output), FinishReason::Length);
    }

    etcd.restart();
    let on_b = b.sample("meow", LONG, "b-2");
    eventually("B has a request in flight", || async { b.in_flight("meow").await == 1 }).await;
    eventually_within("A pauses again once etcd is back", PATIENCE, || async {
        a.coordinator.pause(&name("meow"), trainer_pause(PauseMode::Abort), None).await.is_ok()
    })
    .await;
    assert!(b.paused("meow"), "B applied it before the pause answered");
    assert_eq!(finish_reason(&finished(on_b).await.expect("handed back")), FinishReason::Abort);
    b.coordinator.resume(&name("meow"), None).await.expect("resumed on B");
    eventually("A reopened", || async { !a.paused("meow") }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_lease_is_an_etcd_lease_that_ends_the_pause_everywhere_and_a_late_replica_adopts_it() {
    let Some(binary) = etcd_or_skip("a_pause_lease_is_an_etcd_lease") else { return };
    let etcd = EtcdServer::start(binary);
    let a = Replica::join(&etcd.endpoint(), "lease").await;
    a.load("meow").await.expect("loaded");
    let pause = PauseRequest::parse(PauseMode::Keep, "trainer", 4.0).expect("a pause with a lease");
    a.coordinator.pause(&name("meow"), pause, None).await.expect("paused");
    // A replica that starts while the pause holds loads the adapter paused.
    let b = Replica::join(&etcd.endpoint(), "lease").await;
    let restored = b.coordinator.lora(&name("meow")).expect("restored").status().await.expect("status");
    assert!(restored.paused, "restored paused: {restored:?}");
    eventually_within("the lease ended the pause on both", PATIENCE, || async {
        !a.paused("meow") && !b.paused("meow")
    })
    .await;
    let recorded = a.coordinator.list_adapters().await;
    assert!(recorded[0].pauses.is_empty(), "{recorded:?}");
}

/// The front records `store` hands its replica (the first call answers what was read when it connected).
async fn front_records(store: &EtcdStore) -> Vec<FrontRecord> {
    store.recorded().await.expect("read").front_records
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn front_records_belong_to_their_replica_and_a_replica_that_starts_takes_over_those_of_a_gone_one() {
    let Some(binary) = etcd_or_skip("front_records_belong_to_their_replica") else { return };
    let etcd = EtcdServer::start(binary);
    let record = FrontRecord { table: "tinker/samples".into(), key: "tk-1".into(), value: "{\"state\":1}".into() };
    let a = connect(&etcd.endpoint(), "records").await;
    assert_eq!(front_records(&a).await, [], "nothing recorded yet");
    a.record(vec![StateChange::FrontRecordPut(record.clone())]).await.expect("recorded");
    let b = connect(&etcd.endpoint(), "records").await;
    assert_eq!(front_records(&b).await, [], "a lives: its records stay its own");
    assert_eq!(front_records(&a).await, std::slice::from_ref(&record), "a reads back its own");

    a.leave().await.expect("a leaves");
    drop(a);
    let c = connect(&etcd.endpoint(), "records").await;
    assert_eq!(
        front_records(&c).await,
        std::slice::from_ref(&record),
        "a is gone: the next replica to start takes its records"
    );
    assert_eq!(front_records(&b).await, [], "b started while a lived: it took nothing");
    let d = connect(&etcd.endpoint(), "records").await;
    assert_eq!(front_records(&d).await, [], "c lives: its records stay its own");
    c.record(vec![StateChange::FrontRecordRemoved { table: record.table, key: record.key }]).await.expect("removed");
    assert_eq!(front_records(&c).await, []);
}
