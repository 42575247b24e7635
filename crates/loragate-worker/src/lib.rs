//! `loragate worker`: a loragate engine behind vLLM's own gRPC protocol, so that a fleet of workers is fronted
//! exactly like a fleet of vLLM servers (`vllm-rs serve MODEL --grpc-port PORT`).
//!
//! The worker serves `vllm.Inference` (`Generate`, `GenerateStream`), `vllm.Control` and `grpc.health.v1` from the
//! pinned `vllm-proto` crate over any [`loragate_core::Engine`] (the candle engine in the binary; a scripted engine
//! in tests), with vLLM's semantics where the proto is silent:
//!
//! - `StoppingCriteria.max_new_tokens = 0` means 20 tokens; `temperature` unset is greedy; `output_token_ids` and
//!   `output_logprobs` default to false; an empty `lora_name` is the base model;
//! - `LoadLora` of a loaded name is `ALREADY_EXISTS` (a name is never reloaded in place), an unknown `lora_name` is
//!   `NOT_FOUND`; adapter paths are confined to the worker's adapter root;
//! - `Abort{request_ids}` ends those requests with `ABORTED` after the tokens they produced; `PauseGeneration`
//!   (`ABORT`, `WAIT`) holds new requests until `ResumeGeneration`;
//! - weight transfer, sleep and KV-event RPCs, `PAUSE_MODE_KEEP`, text prompts and sampling features the engine
//!   lacks (penalties, stop strings, candidates, `num_sequences > 1`) are refused naming the field or RPC.
//!
//! Every running request is registered under its `request_id` by an RAII guard held by its response stream, so it
//! leaves the registry when the stream ends or its client goes away.
//!
//! ```no_run
//! # async fn run(engine: std::sync::Arc<dyn loragate_core::Engine>) -> Result<(), Box<dyn std::error::Error>> {
//! use loragate_worker::{WorkerConfig, serve_worker};
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9001").await?;
//! let config = WorkerConfig {
//!     served_model_name: "loragate-demo".into(),
//!     adapter_root: Some(loragate_core::AdapterRoot::new("/adapters")?),
//!     max_running_requests: 64,
//!     shutdown: tokio_util::sync::CancellationToken::new(),
//! };
//! serve_worker(listener, engine, config).await?;
//! # Ok(())
//! # }
//! ```

mod control;
mod error;
mod inference;
mod server;
mod state;

pub use error::WorkerError;
pub use inference::DEFAULT_MAX_NEW_TOKENS;
pub use server::{WorkerConfig, WorkerServeError, serve_worker};
