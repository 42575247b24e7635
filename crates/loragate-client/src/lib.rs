//! Clients of loragate for rollouts and trainers.
//!
//! - [`SamplingClient`] samples through the `Sampler` service and turns aborted samples into finished ones: the
//!   partial output of an aborted sequence is kept, the client waits until the adapter reopens, and resubmits
//!   `prompt + accumulated tokens` with the remaining `max_tokens`, token-exact, with each token's adapter version
//!   kept in the merged segments. It handles `num_samples > 1` (each sequence continues on its own) and the base
//!   model, and is bounded: an overall deadline, backoff with jitter on transport errors (keeping what was
//!   accumulated), and a cap on attempts that made no progress. Logprobs are never invented.
//! - [`TrainerClient`] controls adapters: [`TrainerClient::swap_adapter`] aborts, loads and resumes as one
//!   operation that always reopens the adapter; [`TrainerClient::swap_adapter_atomic`] is the server's own swap
//!   (`SwapLoraAdapter`, keep mode by default); [`TrainerClient::push_adapter`] sends a new version's weights over
//!   the connection (`PushLoraAdapter`: a PEFT directory read as it is sent, or tensors serialized to safetensors
//!   here, with the SHA-256 the server checks); [`TrainerClient::pause`], [`TrainerClient::resume`],
//!   [`TrainerClient::wait_unpaused`], [`TrainerClient::set_staleness`] and [`TrainerClient::list_adapters`] are the
//!   other control calls.
//! - A key (`--api-key`, `--admin-key`, a tenant key) is presented on every call with [`BearerKey`]
//!   ([`SamplingClient::with_key`], [`TrainerClient::with_key`]); [`SamplingClient::with_min_lora_version`] asks
//!   for a version or a later one on every attempt.
//!
//! ```no_run
//! # async fn rollout() -> Result<(), loragate_client::ClientError> {
//! use loragate_client::{SamplingClient, TrainerClient};
//! use loragate_proto::v1::SamplingParams;
//!
//! let sampler = SamplingClient::connect("http://127.0.0.1:50051", "meow").await?;
//! let params = SamplingParams { max_tokens: Some(64), temperature: 0.7, seed: Some(1), ..Default::default() };
//! let response = sampler.sample(b"Make a single short animal noise.".iter().map(|&b| u32::from(b)).collect(), params, 4).await?;
//! assert!(response.sequences.iter().all(|s| s.finish_reason() != loragate_proto::v1::FinishReason::Abort));
//!
//! let trainer = TrainerClient::connect("http://127.0.0.1:50051").await?;
//! let swap = trainer.swap_adapter("meow", "meow-step-2").await?;
//! println!("now at version {} after aborting {} requests", swap.version, swap.aborted_count);
//! # Ok(())
//! # }
//! ```

mod accumulate;
mod channel;
mod control;
mod error;
mod policy;
mod push;
mod sampling_client;
#[cfg(test)]
mod scripted_server;
mod swap;

pub use channel::{BearerKey, connect};
pub use control::{PauseOptions, SwapOptions};
pub use error::ClientError;
pub use policy::RetryPolicy;
pub use push::{AdapterPayload, PUSH_CHUNK_BYTES, Tensor, TensorDtype};
pub use sampling_client::SamplingClient;
pub use swap::{SwapReport, TrainerClient};
