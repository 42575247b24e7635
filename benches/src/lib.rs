//! Shared helpers of the benchmarks: worker servers (gRPC, and HTTP in vLLM's and SGLang's dialects) on their own
//! threads. (Benchmarks over the scripted engine of `loragate-core`'s `testing` feature build it themselves: that
//! feature is a dev-dependency only.)

use std::time::{Duration, Instant};

use loragate_core::{
    AdapterHandle, AdapterName, Coordinator, CoordinatorConfig, Ending, RawSampleRequest, RequestId, SampleRequest,
};

/// A `loragate worker` server on its own thread and runtime, as a separate process would be: killing it drops every
/// connection it had at once (its runtime goes, and with it every connection task).
pub struct ThreadWorker {
    /// `grpc://127.0.0.1:PORT` (its canonical address in a fleet).
    pub url: String,
    /// The port (to restart on the same address).
    pub port: u16,
    kill: tokio_util::sync::CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ThreadWorker {
    /// Serves `engine` on 127.0.0.1:`port` (0 for any) with `adapter_root`.
    pub fn start(engine: std::sync::Arc<dyn loragate_core::Engine>, adapter_root: &std::path::Path, port: u16) -> Self {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("address").port();
        let kill = tokio_util::sync::CancellationToken::new();
        let coordinator_config = CoordinatorConfig {
            adapter_root: Some(loragate_core::AdapterRoot::new(adapter_root).expect("adapter root")),
            reserved_names: vec!["bench".into()],
            ..CoordinatorConfig::default()
        };
        let config = loragate_worker::WorkerConfig::new("bench");
        let killed = kill.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let coordinator = Coordinator::start(engine, coordinator_config).await.expect("the coordinator starts");
                tokio::select! {
                    served = loragate_worker::serve_worker(listener, coordinator, config) => served.expect("serves"),
                    () = killed.cancelled() => {}
                }
            });
            drop(runtime);
        });
        Self { url: format!("grpc://127.0.0.1:{port}"), port, kill, thread: Some(thread) }
    }

    /// Kills the worker: every connection it had closes at once.
    pub fn kill(&mut self) {
        self.kill.cancel();
        if let Some(thread) = self.thread.take() {
            thread.join().expect("worker thread");
        }
    }
}

impl Drop for ThreadWorker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `loragate serve`'s HTTP front (vLLM's and SGLang's dialects both) over `engine`, on its own thread and runtime,
/// as a separate process would be: an HTTP worker of a fleet (`vllm+http://` or `sglang+http://`).
pub struct ThreadHttpWorker {
    /// The port.
    pub port: u16,
    kill: tokio_util::sync::CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ThreadHttpWorker {
    /// Serves `engine` on 127.0.0.1:`port` (0 for any), loading adapters from `adapter_root`, with a byte codec
    /// (the fleet sends token ids: text never crosses).
    pub fn start(engine: std::sync::Arc<dyn loragate_core::Engine>, adapter_root: &std::path::Path, port: u16) -> Self {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("address").port();
        let kill = tokio_util::sync::CancellationToken::new();
        let config = CoordinatorConfig {
            adapter_root: Some(loragate_core::AdapterRoot::new(adapter_root).expect("adapter root")),
            ..CoordinatorConfig::default()
        };
        let killed = kill.clone();
        let thread = std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let coordinator = Coordinator::start(engine, config).await.expect("coordinator");
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let front = loragate_http::HttpFront::new(coordinator, "bench", std::sync::Arc::new(ByteCodec));
                let stop = killed.clone().cancelled_owned();
                loragate_http::serve_http(listener, front, std::future::pending(), stop).await.expect("serves");
            });
            drop(runtime);
        });
        Self { port, kill, thread: Some(thread) }
    }

    /// Its base URL (`http://127.0.0.1:PORT`).
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Kills the worker.
    pub fn kill(&mut self) {
        self.kill.cancel();
        if let Some(thread) = self.thread.take() {
            thread.join().expect("worker thread");
        }
    }
}

impl Drop for ThreadHttpWorker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Bytes as token ids (what the benchmarks' prompts are).
pub struct ByteCodec;

impl loragate_text::TextCodec for ByteCodec {
    fn encode(&self, text: &str, _add_special_tokens: bool) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(u32::from).collect())
    }

    fn decode(&self, token_ids: &[u32]) -> String {
        String::from_utf8_lossy(&token_ids.iter().filter_map(|&t| u8::try_from(t).ok()).collect::<Vec<u8>>())
            .into_owned()
    }

    fn token_str(&self, token_id: u32) -> Option<String> {
        u8::try_from(token_id).ok().map(|byte| char::from(byte).to_string())
    }
}

/// The timed loop of every `admit_and_release_open_gate` benchmark: `iterations` times, one request admitted on
/// `adapter`'s open gate and handed back (which deregisters it), from a task on `runtime`'s workers as a request
/// handler would (criterion's own `block_on` thread would add a cross-thread wake-up per iteration that no request
/// pays).
pub fn time_admit_and_release(runtime: &tokio::runtime::Runtime, adapter: &AdapterHandle, iterations: u64) -> Duration {
    let adapter = adapter.clone();
    let request_id = RequestId::parse_or_generate("bench").expect("id");
    runtime
        .block_on(runtime.spawn(async move {
            let start = Instant::now();
            for _ in 0..iterations {
                let admission = adapter.admit(request_id.clone(), tokio::time::Instant::now()).await.expect("admitted");
                admission.hand_back(Ending::Completed);
            }
            start.elapsed()
        }))
        .expect("the benchmark task")
}

/// A one-token request for `name` that wants version `min_lora_version` or newer: what the minimum-version
/// benchmarks hold at the gate.
pub fn min_version_request(coordinator: &Coordinator, name: &AdapterName, min_lora_version: u64) -> SampleRequest {
    let raw = RawSampleRequest {
        lora_name: name.to_string(),
        prompt_token_ids: vec![1],
        max_tokens: Some(1),
        min_lora_version,
        ..RawSampleRequest::default()
    };
    coordinator.parse_sample(raw).expect("valid")
}
