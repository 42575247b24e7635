//! The loragate HTTP front over a [`loragate_core::Coordinator`]: OpenAI-compatible completions and chat, vLLM's
//! token-in/token-out generate and tokenizer endpoints, SGLang's native generate and abort, SkyRL-compatible
//! per-adapter pause control and vLLM-compatible adapter loading, with health and Prometheus metrics — so the RL
//! frameworks' clients (SkyRL, prime-rl, AReaL, verl, slime, the openai SDK) talk to loragate as to vLLM or SGLang.
//!
//! Data flow of a sampling request: every request passes the **guard** (one router-wide middleware: cross-origin
//! browser requests, non-JSON POST bodies and callers without a valid key are refused) → the JSON body → this API's
//! own fields and the sampling fields every API of its family shares (`sampling`: vLLM's names, or SGLang's), text
//! prompts encoded by the [`TextCodec`](loragate_text::TextCodec) (chat messages first rendered with the model's [`ChatTemplate`]) → one
//! validated core request per prompt → `Coordinator::sample`, which holds it, parsed, at its adapter's **submission
//! gate** while the adapter is paused (the gate every front shares: the request's body is gone by then) → the core's
//! events become choice deltas in one shared translation (`output`: text decoded incrementally, stop strings watched
//! off the async runtime, logprobs and their alternatives, finish reasons, version segments) → each API family
//! renders them in its JSON shape, as one response or server-sent events. Control endpoints (per adapter, and the
//! engine-wide pause of vLLM, SGLang and AReaL) route to the coordinator. Every error becomes an OpenAI-style error
//! response in one place (`error.rs`), with `param` naming the field in this API's terms. There is no second copy
//! of any semantics: one gate, one registry, one keyring, in the core.
//!
//! ```no_run
//! # async fn run(coordinator: loragate_core::Coordinator, codec: std::sync::Arc<dyn loragate_text::TextCodec>)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use loragate_http::{HttpFront, serve_http};
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8000").await?;
//! let front = HttpFront::new(coordinator, "loragate-demo", codec);
//! serve_http(listener, front, std::future::pending(), std::future::pending()).await?;
//! # Ok(())
//! # }
//! ```

mod adapters;
pub mod agent;
mod chat;
mod chat_template;
mod completions;
mod control;
mod error;
mod front;
mod generate;
mod global_pause;
mod guard;
mod json_body;
mod models;
mod observability;
mod output;
mod push_body;
mod sampling;
mod server;
mod sglang;
mod starting;
mod state;
mod tokenize;
mod versions;

pub use chat_template::{ChatTemplate, ChatTemplateError};
pub use front::HttpFront;
pub use server::{HttpServeError, serve_http};
pub use starting::StartingResponder;
