//! The loragate Tinker API front: the unmodified `tinker` Python SDK (0.38) samples loragate's base model and
//! adapters, and a weight swap is invisible to it (its futures simply take a little longer).
//!
//! The front is a thin translation over the core, mounted on the HTTP listener under `/api/v1/`:
//! - `asample` turns the SDK's JSON into the core's request (validated by the core; fields named by their Tinker
//!   path), records a **future** in the store (one actor, behind a typed handle; bounded: 429 past
//!   `max_pending`) and samples on a task of its own through `Coordinator::sample`, which holds the request at a
//!   paused adapter's gate. It answers at once with the future's `request_id` (also the core request id, so aborts
//!   list it).
//! - `retrieve_future` long-polls the future's `watch` channel and answers the finished `tinker_public.SampleResponse`
//!   as protobuf, the failure as `{"error", "category"}`, or `try_again` with `paused_capacity` while the adapter's
//!   gate is closed (read from the core).
//! - Naming: `base_model="<served name>"` is the base model, `model_path="tinker://loragate/<adapter>"` an adapter;
//!   sampling-session ids name their target, so no table is kept and a restarted server still understands them.
//! - Every future is recorded in the coordinator's state store (`--state-dir`, or etcd): after a restart its result
//!   is served again and a pending sample is continued under its request id, so the SDK's future resolves. Request ids
//!   carry a per-process epoch: an earlier process's id that was not recorded gets 410, and the SDK resubmits.
//! - Sessions are bookkeeping (heartbeats answer 200; 410 once finished); every other `/api/v1/` route is refused
//!   with a 404 naming the feature. Errors are `{"detail"}` in one place (`error.rs`).
//!
//! The routes are an axum router: `loragate serve` mounts them on the HTTP front's listener
//! (`HttpFront::with_routes`, which puts the listener's guard and connection limits in front of them); this front
//! depends on no other front.
//!
//! ```no_run
//! # async fn run(coordinator: loragate_core::Coordinator, codec: std::sync::Arc<dyn loragate_text::TextCodec>)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use loragate_tinker::{TinkerConfig, TinkerFront};
//!
//! let tinker = TinkerFront::start(coordinator, "loragate-demo", codec, TinkerConfig::default()).await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8000").await?;
//! axum::serve(listener, tinker.routes()).await?;
//! # Ok(())
//! # }
//! ```

mod auth;
mod error;
mod front;
mod ids;
mod json_body;
mod naming;
pub mod proto;
mod restore;
mod routes;
mod sample_request;
mod sample_task;
mod state;
mod store;
#[cfg(test)]
mod tests;

pub use front::{StartError, TinkerConfig, TinkerFront};
pub use naming::MODEL_PATH_PREFIX;
pub use store::RetentionLimits;
