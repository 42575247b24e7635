//! `loragate agent`: the sidecar beside a vLLM or SGLang HTTP worker that receives pushed adapter versions for it and
//! writes them under its directory (`loragate_http::agent`), so a fleet coordinator can deliver versions to workers
//! that load adapters only from a local directory, with no shared filesystem.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use loragate_core::Key;
use loragate_http::agent::{AgentConfig, serve_agent};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::ServeError;
use crate::startup::{ShutdownSignals, bind, join_error};

/// Everything `loragate agent` needs.
#[derive(Clone, Debug)]
pub struct AgentSettings {
    /// The HTTP address (`--http-addr`; port 0 picks a free port).
    pub http_addr: SocketAddr,
    /// Where versions are written, as `DIR/NAME@V/` (`--adapter-dir`).
    pub adapter_dir: PathBuf,
    /// The key every call must present (`--api-key`: the fleet coordinator's `--worker-key`).
    pub api_key: Option<Key>,
    /// The largest `adapter_model.safetensors` accepted (`--max-adapter-bytes`).
    pub max_adapter_bytes: u64,
}

/// A running agent. It stops on SIGINT/SIGTERM.
pub struct RunningAgent {
    http_addr: SocketAddr,
    adapter_dir: PathBuf,
    shutdown: CancellationToken,
    served: JoinHandle<std::io::Result<()>>,
    signals: ShutdownSignals,
}

impl RunningAgent {
    /// Binds the address and serves.
    pub async fn start(settings: AgentSettings) -> Result<Self, ServeError> {
        let signals = ShutdownSignals::listen();
        let (listener, http_addr) = bind(settings.http_addr).await?;
        let shutdown = CancellationToken::new();
        let config = AgentConfig {
            adapter_dir: settings.adapter_dir.clone(),
            api_key: settings.api_key,
            max_adapter_bytes: settings.max_adapter_bytes,
        };
        let served = tokio::spawn(serve_agent(listener, config, shutdown.clone().cancelled_owned()));
        tracing::info!(%http_addr, adapter_dir = %settings.adapter_dir.display(), "agent receiving adapter pushes");
        Ok(Self { http_addr, adapter_dir: settings.adapter_dir, shutdown, served, signals })
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Where versions are written.
    pub fn adapter_dir(&self) -> &Path {
        &self.adapter_dir
    }

    /// Serves until SIGINT or SIGTERM (or the server fails), then stops.
    pub async fn run_until_signal(mut self) -> Result<(), ServeError> {
        tokio::select! {
            () = self.signals.received() => self.shutdown.cancel(),
            () = self.shutdown.cancelled() => {}
            finished = &mut self.served => {
                return finished.map_err(join_error)?.map_err(|err| ServeError::Agent(err.to_string()));
            }
        }
        self.served.await.map_err(join_error)?.map_err(|err| ServeError::Agent(err.to_string()))
    }
}
