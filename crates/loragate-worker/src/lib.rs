//! `loragate worker`: a loragate coordinator behind vLLM's own gRPC protocol, so that a fleet of workers is fronted
//! exactly like a fleet of vLLM servers (`vllm-rs serve MODEL --grpc-port PORT`).
//!
//! The worker is a thin front: it serves `vllm.Inference` (`Generate`, `GenerateStream`), `vllm.Control` and
//! `grpc.health.v1` from the pinned `vllm-proto` crate as calls on a [`loragate_core::Coordinator`] its owner built
//! (over the candle engine in the binary, `loragate worker`; over a scripted engine in tests), with the
//! coordinator's keys, adapter root, gate deadline and admission limits, and with vLLM's semantics where the proto
//! is silent:
//!
//! - `StoppingCriteria.max_new_tokens = 0` means 20 tokens; `temperature` unset is greedy; `output_token_ids` and
//!   `output_logprobs` default to false; an empty `lora_name` is the base model;
//! - `Generate` is [`Coordinator::sample`](loragate_core::Coordinator::sample): held while generation is paused (at
//!   most `--gate-max-wait`, then `UNAVAILABLE`), `RESOURCE_EXHAUSTED` past `--max-in-flight` or `--max-held`;
//! - `LoadLora` of a loaded name is `ALREADY_EXISTS` (a name is never reloaded in place), past `--max-loras`
//!   `RESOURCE_EXHAUSTED`; an unknown `lora_name` is `NOT_FOUND`; adapter paths are confined to the adapter root;
//! - `Abort{request_ids}` ends those requests with `ABORTED` after the tokens they produced; `PauseGeneration`
//!   (`ABORT`, `WAIT`, `KEEP`) is the coordinator's global pause in that mode, until `ResumeGeneration` (a kept
//!   request continues in its stream);
//! - with keys, `vllm.Inference` needs the API key or the admin key, `vllm.Control` the admin key; health is open.
//!   `Shutdown` is refused unless the worker was started with `--enable-shutdown-rpc`;
//! - connections are capped and closed when they send no request head in time or stay idle (`loragate-net`);
//! - with an HTTP listener ([`WorkerListeners::http`], `--http-addr`), `GET /metrics` there serves the
//!   coordinator's metrics as `loragate serve` does (vLLM's `vllm:` request metrics and the core's `loragate_`
//!   series);
//! - `loragate.v1.LoraControl/PushLoraAdapter` on the same port and admin key: a fleet coordinator streams a pushed
//!   adapter version's files to the worker, which receives them into its own adapter store (checked against its
//!   model) and loads them as the header's `NAME@V`, answering the SHA-256 it computed (no shared filesystem);
//! - weight transfer, sleep and KV-event RPCs, text prompts and sampling features the engine
//!   lacks (stop strings, candidates by id, `num_sequences > 1`) are refused naming the field or RPC.
//!
//! ```no_run
//! # async fn run(engine: std::sync::Arc<dyn loragate_core::Engine>) -> Result<(), Box<dyn std::error::Error>> {
//! use loragate_core::{AdapterRoot, Coordinator, CoordinatorConfig};
//! use loragate_worker::{WorkerConfig, serve_worker};
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9001").await?;
//! let coordinator = Coordinator::start(engine, CoordinatorConfig {
//!     adapter_root: Some(AdapterRoot::new("/adapters")?),
//!     reserved_names: vec!["loragate-demo".into()],
//!     ..CoordinatorConfig::default()
//! })
//! .await?;
//! let config = WorkerConfig { max_loras: Some(64), ..WorkerConfig::new("loragate-demo") };
//! serve_worker(listener, coordinator, config).await?;
//! # Ok(())
//! # }
//! ```

mod auth;
mod control;
mod error;
mod inference;
mod loras;
mod metrics;
mod push;
mod server;

pub use error::WorkerError;
pub use inference::DEFAULT_MAX_NEW_TOKENS;
pub use server::{WorkerConfig, WorkerListeners, WorkerServeError, serve_worker};
