//! Versions another replica pushed, fetched from it before they are served (`coordinator/fetch.rs`): the test plays
//! the shared store (`remote::SharedByTest`) and the other replica's files (a scripted [`VersionFetcher`] the test
//! opens, fills or empties). New requests are held at the gate while the files are fetched and then run at the new
//! version; a holder that is unreachable or sends bytes whose SHA-256 is not the recorded one leaves the adapter
//! with `weights_error` (samples refused, 503) once the gate's wait ran out, and a later good fetch serves it.

use futures::StreamExt;
use sha2::Digest;
use tokio::sync::watch;

use super::remote::{HOLDER, installed, replica_joining, replica_with};
use super::*;
use crate::contract::{ErrorClass, Sha256};
use crate::state::{RecordedSource, RemoteChange, StateChange, StateStore};
use crate::testing::eventually_within;
use crate::version_fetch::{FetchError, FileChunks, VersionFetcher};
use crate::{AdapterStore, CONFIG_FILE, ReplicaRecord};

const CONFIG: &[u8] = br#"{"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}"#;

/// A safetensors file of one LoRA pair whose values start at `seed` (another seed: other bytes, same layout).
fn weights(seed: u8) -> Vec<u8> {
    let tensors = [
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", [2usize, 8]),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", [8, 2]),
    ];
    let (mut header, mut offset) = (String::from("{"), 0usize);
    for (index, (name, shape)) in tensors.iter().enumerate() {
        let len = shape.iter().product::<usize>() * 4;
        let comma = if index > 0 { "," } else { "" };
        header.push_str(&format!(
            r#"{comma}"{name}":{{"dtype":"F32","shape":{shape:?},"data_offsets":[{offset},{}]}}"#,
            offset + len
        ));
        offset += len;
    }
    header.push('}');
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend((0..offset).map(|byte| (byte as u8).wrapping_add(seed) % 120));
    file
}

fn sha(bytes: &[u8]) -> Sha256 {
    Sha256(sha2::Sha256::digest(bytes).into())
}

/// The other replica's files, as this replica's fetcher sees them: nothing is answered until the test opens it; then
/// `files` (config, weights), or a refused connection for `None`.
#[derive(Debug)]
struct FilesByTest {
    open: watch::Sender<bool>,
    files: Mutex<Option<(Vec<u8>, Vec<u8>)>>,
    fetched: Mutex<Vec<(String, AdapterVersion, String)>>,
}

impl FilesByTest {
    fn new(open: bool, files: Option<(Vec<u8>, Vec<u8>)>) -> Arc<Self> {
        Arc::new(Self { open: watch::Sender::new(open), files: Mutex::new(files), fetched: Mutex::default() })
    }
}

#[async_trait::async_trait]
impl VersionFetcher for FilesByTest {
    async fn fetch(
        &self,
        holder: &ReplicaRecord,
        name: &AdapterName,
        version: AdapterVersion,
        file: &'static str,
    ) -> Result<FileChunks, FetchError> {
        assert_eq!((holder.id.as_str(), holder.http_addr.as_str()), (HOLDER, "127.0.0.1:1"), "asks the holder");
        let _ = self.open.subscribe().wait_for(|open| *open).await;
        self.fetched.lock().push((name.to_string(), version, file.to_owned()));
        let Some((config, weights)) = self.files.lock().clone() else {
            return Err(FetchError("connection refused".into()));
        };
        let bytes = if file == CONFIG_FILE { config } else { weights };
        let chunks: Vec<Result<Vec<u8>, FetchError>> = bytes.chunks(13).map(|chunk| Ok(chunk.to_vec())).collect();
        Ok(futures::stream::iter(chunks).boxed())
    }
}

/// A replica with an adapter store, fetching through `files`, holding requests at most `gate_max_wait`.
async fn fetching_replica(
    files: Arc<FilesByTest>,
    gate_max_wait: Duration,
) -> (Coordinator, Arc<ScriptedEngine>, Feed) {
    let config = CoordinatorConfig {
        adapter_store: Some(AdapterStore::temporary(1 << 20).expect("a store")),
        version_fetcher: Some(files),
        max_gate_hold: gate_max_wait,
        ..CoordinatorConfig::default()
    };
    let (coordinator, store, engine, feed) = replica_with(config).await;
    (coordinator, engine, Feed { store, feed })
}

/// Feeds another replica's changes, recording its installs in the shared record first (as the other replica did).
struct Feed {
    store: Arc<super::remote::SharedByTest>,
    feed: tokio::sync::mpsc::UnboundedSender<RemoteChange>,
}

impl Feed {
    async fn send(&self, change: RemoteChange) {
        if let RemoteChange::Installed { name, version, source } = &change {
            let installed = StateChange::Installed {
                name: name.clone(),
                version: *version,
                source: source.clone(),
                retained: Vec::new(),
            };
            self.store.records.record(vec![installed]).await.expect("recorded");
        }
        self.feed.send(change).expect("fed");
    }
}

/// The other replica's push of `file` (with `CONFIG`) as `version` of `lora`, recorded under its own store's path.
fn pushed(lora: &str, version: u64, file: &[u8]) -> RemoteChange {
    let sha256 = sha(file);
    let source = RecordedSource {
        path: format!("/elsewhere/adapters/blobs/{sha256}-0123456789abcdef").into(),
        confined: false,
        sha256: Some(sha256),
        bytes: Some(file.len() as u64),
        pushed: true,
        holder: Some(HOLDER.into()),
    };
    RemoteChange::Installed { name: name(lora), version: AdapterVersion(version), source }
}

fn current_sha(status: &AdapterStatus) -> Option<Sha256> {
    status.versions.last().and_then(|info| info.sha256)
}

#[tokio::test]
async fn new_requests_wait_at_the_gate_while_the_files_are_fetched_then_run_at_the_new_version() {
    let files = FilesByTest::new(false, Some((CONFIG.to_vec(), weights(1))));
    let (coordinator, engine, feed) = fetching_replica(files.clone(), Duration::from_secs(600)).await;
    feed.send(installed("meow", 1)).await;
    eventually("meow serves version 1", || async {
        coordinator.lora(&name("meow")).is_ok_and(|adapter| adapter.gate().version == AdapterVersion(1))
    })
    .await;
    let running = spawn_sample(&coordinator, "meow", LONG, "admitted-before");
    eventually("a request in flight", || async { status(&coordinator, "meow").await.in_flight == 1 }).await;

    feed.send(pushed("meow", 2, &weights(1))).await;
    eventually("meow is held for the fetch", || async { status(&coordinator, "meow").await.paused }).await;
    let held = spawn_sample(&coordinator, "meow", SHORT, "held");
    eventually("the new request is held", || async { status(&coordinator, "meow").await.held == 1 }).await;
    let waiting = status(&coordinator, "meow").await;
    assert_eq!((waiting.version, waiting.in_flight), (AdapterVersion(1), 1), "version 1 until the files are in");
    assert_eq!(engine.installed(&name("meow")), Some(AdapterVersion(1)));

    files.open.send_replace(true);
    let output = joined(held).await.expect("ran once the files were in");
    assert!(
        output.sequences[0].segments.iter().all(|segment| segment.version == AdapterVersion(2)),
        "only the new version: {:?}",
        output.sequences[0].segments
    );
    let served = status(&coordinator, "meow").await;
    assert_eq!((served.version, current_sha(&served)), (AdapterVersion(2), Some(sha(&weights(1)))));
    assert!(!served.paused && served.weights_error.is_none(), "{served:?}");
    assert_eq!(engine.installed(&name("meow")), Some(AdapterVersion(2)));
    let fetched: Vec<String> = files.fetched.lock().iter().map(|(_, _, file)| file.clone()).collect();
    assert_eq!(fetched, [CONFIG_FILE, crate::WEIGHTS_FILE]);
    // The request admitted before the push kept running at its version, never stopped by the fetch.
    assert!(!running.is_finished(), "still running");
    coordinator.abort(&name("meow")).await.expect("abort");
    let output = joined(running).await.expect("handed back");
    assert!(output.sequences[0].segments.iter().all(|segment| segment.version == AdapterVersion(1)));
}

#[tokio::test]
async fn a_holder_out_of_reach_or_sending_other_bytes_leaves_weights_error_and_refused_samples_until_a_good_fetch() {
    let files = FilesByTest::new(true, None);
    let (coordinator, engine, feed) = fetching_replica(files.clone(), Duration::from_millis(300)).await;
    let good = weights(1);

    // A new adapter whose holder cannot be reached: published with the reason once the gate's wait ran out.
    feed.send(pushed("purr", 1, &good)).await;
    eventually("purr is listed with its weights error", || async {
        coordinator.lora(&name("purr")).is_ok() && status(&coordinator, "purr").await.weights_error.is_some()
    })
    .await;
    let reason = status(&coordinator, "purr").await.weights_error.expect("an error");
    assert!(reason.contains("version v1") && reason.contains(HOLDER), "{reason}");
    let refused = joined(spawn_sample(&coordinator, "purr", SHORT, "refused")).await.expect_err("refused");
    assert!(matches!(refused, CoreError::WeightsMissing { .. }), "{refused:?}");
    assert_eq!(refused.class(), ErrorClass::NotServing, "503 on HTTP, as a failed load at start");

    // The holder answers with bytes whose SHA-256 is not the recorded one: still refused, the mismatch named.
    *files.files.lock() = Some((CONFIG.to_vec(), weights(2)));
    eventually_within("a retry read the other bytes", Duration::from_secs(60), || async {
        files.fetched.lock().iter().any(|(_, _, file)| file == crate::WEIGHTS_FILE)
    })
    .await;
    assert_eq!(engine.installed(&name("purr")), None, "nothing of the other bytes was loaded");
    assert!(status(&coordinator, "purr").await.weights_error.is_some());

    // The right bytes: served, the error gone.
    *files.files.lock() = Some((CONFIG.to_vec(), good.clone()));
    eventually_within("purr is served once the right bytes arrive", Duration::from_secs(60), || async {
        status(&coordinator, "purr").await.weights_error.is_none()
    })
    .await;
    let served = status(&coordinator, "purr").await;
    assert_eq!((served.version, current_sha(&served)), (AdapterVersion(1), Some(sha(&good))));
    let output = joined(spawn_sample(&coordinator, "purr", SHORT, "served")).await.expect("served");
    assert_eq!(output.sequences[0].segments[0].version, AdapterVersion(1));
}

#[tokio::test]
async fn a_served_adapter_whose_new_version_has_the_wrong_bytes_refuses_samples_then_recovers() {
    let files = FilesByTest::new(true, Some((CONFIG.to_vec(), weights(3))));
    let (coordinator, engine, feed) = fetching_replica(files.clone(), Duration::from_millis(300)).await;
    feed.send(installed("meow", 1)).await;
    eventually("meow serves version 1", || async {
        coordinator.lora(&name("meow")).is_ok_and(|adapter| adapter.gate().version == AdapterVersion(1))
    })
    .await;
    let good = weights(1);
    feed.send(pushed("meow", 2, &good)).await;
    eventually("meow reports its weights error", || async {
        status(&coordinator, "meow").await.weights_error.is_some()
    })
    .await;
    let reason = status(&coordinator, "meow").await.weights_error.expect("an error");
    assert!(reason.contains("SHA-256") || reason.contains("still fetching"), "{reason}");
    let refused = joined(spawn_sample(&coordinator, "meow", SHORT, "refused")).await.expect_err("refused");
    assert!(matches!(refused, CoreError::WeightsMissing { .. }), "never version 1 under version 2: {refused:?}");
    assert_eq!(engine.installed(&name("meow")), Some(AdapterVersion(1)), "the other bytes were not loaded");
    assert!(!status(&coordinator, "meow").await.paused, "the hold was released with the error");

    *files.files.lock() = Some((CONFIG.to_vec(), good.clone()));
    eventually_within("meow serves version 2 once the right bytes arrive", Duration::from_secs(60), || async {
        let status = status(&coordinator, "meow").await;
        status.weights_error.is_none() && status.version == AdapterVersion(2)
    })
    .await;
    assert_eq!(current_sha(&status(&coordinator, "meow").await), Some(sha(&good)));
    let output = joined(spawn_sample(&coordinator, "meow", SHORT, "served")).await.expect("served");
    assert_eq!(output.sequences[0].segments[0].version, AdapterVersion(2));
}

#[tokio::test]
async fn a_replica_starting_after_a_push_elsewhere_fetches_it_at_start_or_retries_after() {
    let good = weights(1);
    let RemoteChange::Installed { name: lora, version, source } = pushed("meow", 4, &good) else { unreachable!() };
    let record =
        || vec![StateChange::Installed { name: lora.clone(), version, source: source.clone(), retained: Vec::new() }];
    let config = |files: &Arc<FilesByTest>| CoordinatorConfig {
        adapter_store: Some(AdapterStore::temporary(1 << 20).expect("a store")),
        version_fetcher: Some(files.clone()),
        ..CoordinatorConfig::default()
    };

    // The holder answers: served at the recorded version from the start.
    let files = FilesByTest::new(true, Some((CONFIG.to_vec(), good.clone())));
    let (coordinator, _store, engine, _feed) = replica_joining(config(&files), record()).await;
    let served = status(&coordinator, "meow").await;
    assert_eq!((served.version, current_sha(&served)), (AdapterVersion(4), Some(sha(&good))));
    assert!(served.weights_error.is_none(), "{served:?}");
    assert_eq!(engine.installed(&name("meow")), Some(AdapterVersion(4)));

    // The holder is out of reach at start: listed with the error, served once the files come.
    let files = FilesByTest::new(true, None);
    let (coordinator, _store, _engine, _feed) = replica_joining(config(&files), record()).await;
    assert!(status(&coordinator, "meow").await.weights_error.is_some_and(|reason| reason.contains(HOLDER)));
    *files.files.lock() = Some((CONFIG.to_vec(), good.clone()));
    eventually_within("meow is served once the holder answers", Duration::from_secs(60), || async {
        status(&coordinator, "meow").await.weights_error.is_none()
    })
    .await;
    let output = joined(spawn_sample(&coordinator, "meow", SHORT, "served")).await.expect("served");
    assert_eq!(output.sequences[0].segments[0].version, AdapterVersion(4));
}
