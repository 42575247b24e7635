//! The loragate HTTP front: OpenAI-compatible completions, SkyRL-compatible per-adapter pause control and
//! vLLM-compatible adapter loading over a [`loragate_core::Coordinator`], with health and Prometheus metrics.
//!
//! Data flow: a `POST /v1/completions` passes the **submission gate** (a middleware on that route only), which holds
//! it while its adapter is paused → the handler parses the JSON into this crate's request types, encodes a text
//! prompt with the [`TextCodec`], and hands the core a raw request, which the core validates → the coordinator
//! admits and samples → the core's token events become OpenAI choices (text decoded incrementally, stop strings
//! watched, logprobs) → one JSON response or server-sent events. Control endpoints (per adapter, and the engine-wide
//! pause of vLLM, SGLang and AReaL) route to the coordinator. Every
//! error becomes an OpenAI-style error response in one place (`error.rs`), with `param` naming the field in this
//! API's terms. There is no second copy of any semantics: one gate, one registry, in the core.
//!
//! ```no_run
//! # async fn run(coordinator: loragate_core::Coordinator, codec: std::sync::Arc<dyn loragate_http::TextCodec>)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use loragate_http::{HttpFront, serve_http};
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8000").await?;
//! let front = HttpFront::new(coordinator, "loragate-demo", codec);
//! serve_http(listener, front, std::future::pending(), std::future::pending()).await?;
//! # Ok(())
//! # }
//! ```

mod codec;
mod completions;
mod control;
mod error;
mod global_pause;
mod json_body;
mod models;
mod observability;
mod server;
mod stop_strings;
mod submission_gate;
#[cfg(test)]
mod test_codec;

pub use codec::TextCodec;
pub use server::{DEFAULT_BODY_LIMIT, HttpFront, HttpServeError, serve_http};
pub use stop_strings::TokenStopWatcher;
