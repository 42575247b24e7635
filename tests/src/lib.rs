//! Fixtures of the cross-crate tests: a real loragate server with the demo model on `127.0.0.1:0`, clients to it,
//! and helpers that poll with a deadline instead of sleeping.
//!
//! The demo model is generated once into `target/loragate-test-cache` (or `$LORAGATE_CACHE_DIR`) and reused by
//! every test process. Each server's adapter root is a fresh temporary copy of the demo adapters, so a test can add
//! adapters (broken ones too) without touching the cache.

mod stall;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use loragate::{EngineLayer, RunningServer, ServeConfig};
use loragate_proto::v1::lora_control_client::LoraControlClient;
use loragate_proto::v1::sampler_client::SamplerClient;
use loragate_proto::v1::{self as pb, ListLoraAdaptersRequest, LoraAdapterStatus};
use tonic::transport::Channel;

pub use self::stall::{StallingEngine, Stalls};

/// The demo prompt of the contract's examples.
pub const PROMPT: &str = "Make a single short animal noise.";

/// A running demo server and clients to it. Shut down when dropped (its runtime ends with the test).
pub struct DemoServer {
    /// The server (its coordinator is reachable for observations the wire does not offer).
    pub server: RunningServer,
    /// A channel to its gRPC address.
    pub channel: Channel,
    /// The server's adapter root (a temporary copy of the demo adapters `meow` and `woof`, removed on drop).
    pub adapter_root: TempDir,
    /// Which requests the server's engine stalls mid-sample ([`DemoServer::stall_next`]).
    pub stalls: Arc<Stalls>,
}

impl DemoServer {
    /// Starts a demo server with default settings.
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Starts a demo server after `configure` adjusted its configuration. Its engine is wrapped in a
    /// [`StallingEngine`], which stalls nothing until asked to.
    pub async fn start_with(configure: impl FnOnce(&mut ServeConfig)) -> Self {
        let cache_dir = test_cache_dir();
        let adapter_root = copy_demo_adapters(&cache_dir).await;
        let mut config = ServeConfig::demo(cache_dir);
        config.grpc_addr = "127.0.0.1:0".parse().expect("address");
        config.http_addr = "127.0.0.1:0".parse().expect("address");
        config.adapters.root = Some(adapter_root.to_path_buf());
        let stalls = Stalls::new();
        let layer_stalls = stalls.clone();
        config.engine_layer =
            Some(EngineLayer::new(move |engine| Arc::new(StallingEngine::new(engine, layer_stalls.clone()))));
        configure(&mut config);
        let server = RunningServer::start(config).await.expect("the demo server starts");
        let channel = Channel::from_shared(format!("http://{}", server.grpc_addr()))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        Self { server, channel, adapter_root, stalls }
    }

    /// The next `requests` requests of `lora_name` (empty: the base model) deliver `after_tokens` tokens per
    /// sequence, then stall until cancelled: a pause is certain to find them running. Later requests run freely.
    pub fn stall_next(&self, lora_name: &str, requests: u32, after_tokens: u32) {
        let key = loragate_core::AdapterKey::parse(lora_name).expect("name");
        self.stalls.stall_next(key, requests, after_tokens);
    }

    /// Waits until `sequences` sequences are stalled in all (see [`DemoServer::stall_next`]).
    pub async fn wait_stalled(&self, sequences: usize) {
        self.stalls.wait_stalled(sequences).await;
    }

    /// A `LoraControl` client.
    pub fn control(&self) -> LoraControlClient<Channel> {
        LoraControlClient::new(self.channel.clone())
    }

    /// A `Sampler` client.
    pub fn sampler(&self) -> SamplerClient<Channel> {
        SamplerClient::new(self.channel.clone())
    }

    /// The URL of `path` (e.g. `/v1/completions`) on the server's HTTP front.
    pub fn http_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.http_addr())
    }

    /// `ListLoraAdapters`' entry for `lora_name`.
    pub async fn status(&self, lora_name: &str) -> LoraAdapterStatus {
        let listed = self.control().list_lora_adapters(ListLoraAdaptersRequest {}).await.expect("list").into_inner();
        listed.adapters.into_iter().find(|a| a.lora_name == lora_name).expect("the adapter is listed")
    }

    /// Tokens generated so far by `lora_name` at `version` (from the server's metrics).
    pub fn generated_tokens(&self, lora_name: &str, version: u64) -> u64 {
        let key = loragate_core::AdapterKey::parse(lora_name).expect("name");
        self.server.coordinator().metrics().generated_tokens(&key, loragate_core::AdapterVersion(version))
    }
}

/// Where the demo model is cached for tests.
pub fn test_cache_dir() -> PathBuf {
    std::env::var_os("LORAGATE_CACHE_DIR")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/loragate-test-cache"))
}

/// A directory that is removed with everything in it when dropped.
pub struct TempDir(tempfile::TempDir);

impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        self.0.path()
    }
}

async fn copy_demo_adapters(cache_dir: &Path) -> TempDir {
    let cache_dir = cache_dir.to_owned();
    tokio::task::spawn_blocking(move || {
        let files = loragate_engine_demo_files(&cache_dir);
        let root = tempfile::Builder::new().prefix("loragate-adapters-").tempdir().expect("a temporary directory");
        for (name, source) in [("meow", &files.meow_dir), ("woof", &files.woof_dir)] {
            copy_dir(source, &root.path().join(name));
        }
        TempDir(root)
    })
    .await
    .expect("copying the demo adapters")
}

fn loragate_engine_demo_files(cache_dir: &Path) -> loragate::DemoFiles {
    loragate::ensure_demo_files(cache_dir).expect("the demo model is generated")
}

/// Copies the files of `from` (one level) into a new directory `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the adapter copy");
    for entry in std::fs::read_dir(from).expect("read the adapter") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy an adapter file");
    }
}

/// The demo vocabulary: token ids 0–255 are the bytes of UTF-8 text.
pub fn tokens(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// The text of demo token ids (specials ≥ 256 are dropped; invalid UTF-8 is replaced).
pub fn text(token_ids: &[u32]) -> String {
    let bytes: Vec<u8> = token_ids.iter().filter_map(|&t| u8::try_from(t).ok()).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A request for `max_tokens` greedy tokens of `lora_name`'s continuation of the demo prompt.
pub fn sample_request(lora_name: &str, max_tokens: u32) -> pb::SampleRequest {
    pb::SampleRequest {
        lora_name: lora_name.into(),
        prompt_token_ids: tokens(PROMPT),
        sampling_params: Some(pb::SamplingParams { max_tokens: Some(max_tokens), ..Default::default() }),
        ..Default::default()
    }
}

/// The generous limit for waits on the demo model in CI.
pub const PATIENCE: Duration = Duration::from_secs(60);
