//! Tinker front benchmarks (issue 14), over a scripted engine so only the front is measured: one sample's
//! `asample` + `retrieve_future` round trip over HTTP, and resuming a paused adapter with 1,000 pending futures whose
//! long-polls are waiting, until every one has its `SampleResponse`.
//!
//! `cargo bench -p loragate-benches --bench tinker`

// criterion_group! and criterion_main! generate undocumented items.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use loragate_benches::ByteCodec;
use loragate_core::testing::{ScriptedEngine, coordinator_with_adapters};
use loragate_core::{AdapterName, Coordinator, CoordinatorConfig};
use loragate_tinker::{RetentionLimits, TinkerConfig, TinkerFront};
use serde_json::{Value, json};
use tokio::runtime::Runtime;

/// Tokens per sample (the scripted engine emits them at once and ends with `length`).
const TOKENS: u32 = 16;

struct Served {
    base: String,
    client: reqwest::Client,
    coordinator: Coordinator,
    session: String,
}

async fn serve() -> Served {
    let coordinator =
        coordinator_with_adapters(ScriptedEngine::new(TOKENS), CoordinatorConfig::default(), &["bench"]).await;
    let config = TinkerConfig {
        retention: RetentionLimits { max_pending: 10_000, ..RetentionLimits::default() },
        ..TinkerConfig::default()
    };
    let front = TinkerFront::start(coordinator.clone(), "demo", Arc::new(ByteCodec), config).await.expect("start");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let routes = front.routes();
    tokio::spawn(async move { axum::serve(listener, routes).await });
    let client = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(2000).build().expect("client");
    let session: Value = client
        .post(format!("{base}/api/v1/create_sampling_session"))
        .json(&json!({"session_id": "s", "sampling_session_seq_id": 0, "model_path": "tinker://loragate/bench"}))
        .send()
        .await
        .expect("create_sampling_session")
        .json()
        .await
        .expect("json");
    let session = session["sampling_session_id"].as_str().expect("id").to_owned();
    Served { base, client, coordinator, session }
}

impl Served {
    async fn asample(&self, seq_id: u64) -> String {
        let body = json!({
            "sampling_session_id": self.session, "seq_id": seq_id, "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [72, 105]}]},
            "sampling_params": {"max_tokens": TOKENS, "temperature": 1.0, "top_k": -1, "top_p": 1.0},
            "prompt_logprobs": false, "type": "sample"
        });
        let answer: Value = self
            .client
            .post(format!("{}/api/v1/asample", self.base))
            .json(&body)
            .send()
            .await
            .expect("asample")
            .json()
            .await
            .expect("json");
        answer["request_id"].as_str().expect("request_id").to_owned()
    }

    /// Polls until the finished `SampleResponse` arrives; answers its size.
    async fn retrieve(&self, request_id: &str) -> usize {
        loop {
            let response = self
                .client
                .post(format!("{}/api/v1/retrieve_future", self.base))
                .json(&json!({"request_id": request_id, "allow_metadata_only": false}))
                .send()
                .await
                .expect("retrieve_future");
            let protobuf = response.headers()["content-type"] == "application/x-protobuf";
            let bytes = response.bytes().await.expect("body");
            if protobuf {
                return bytes.len();
            }
        }
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime")
}

/// One sample, submitted and retrieved, as the SDK does it for an open adapter.
fn round_trip(c: &mut Criterion) {
    let runtime = runtime();
    let served = runtime.block_on(serve());
    let mut seq_id = 0;
    c.bench_function("tinker_asample_and_retrieve_16_tokens", |b| {
        b.iter(|| {
            seq_id += 1;
            runtime.block_on(async {
                let request_id = served.asample(seq_id).await;
                served.retrieve(&request_id).await
            })
        });
    });
}

/// 1,000 samples of a paused adapter, each with its long-poll waiting; measured from resume until every poll has its
/// finished sample.
fn release_1000_paused_futures(c: &mut Criterion) {
    const PENDING: u64 = 1000;
    let runtime = runtime();
    let served = Arc::new(runtime.block_on(serve()));
    let name = AdapterName::parse("bench").expect("name");
    let mut group = c.benchmark_group("tinker_resume");
    group.sample_size(10);
    let mut seq_id = 0;
    group.bench_function("release_1000_paused_futures_until_retrieved", |b| {
        b.iter_custom(|iterations| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    served.coordinator.abort(&name).await.expect("pause");
                    let mut polls = Vec::with_capacity(PENDING as usize);
                    for _ in 0..PENDING {
                        seq_id += 1;
                        let request_id = served.asample(seq_id).await;
                        let served = served.clone();
                        polls.push(tokio::spawn(async move { served.retrieve(&request_id).await }));
                    }
                    let adapter = served.coordinator.lora(&name).expect("loaded");
                    while adapter.status().await.expect("status").held < PENDING as u32 {
                        tokio::task::yield_now().await;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await; // let the long-polls reach the server
                    let start = Instant::now();
                    served.coordinator.resume(&name, None).await.expect("resume");
                    for poll in polls {
                        poll.await.expect("poll task");
                    }
                    total += start.elapsed();
                }
                total
            })
        });
    });
    group.finish();
}

criterion_group!(benches, round_trip, release_1000_paused_futures);
criterion_main!(benches);
