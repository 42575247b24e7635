//! The setting groups of `serve` and `worker`, each one type used by both where both have it, and each filled by
//! one flag group of the command line (`cli/shared.rs`): the gate's deadlines ([`GateDeadlines`]), who may do what
//! ([`Authentication`]) and, for `serve` only, the fleet of workers ([`FleetSettings`]). The other groups are the
//! types of the crates that use them: the admission limits are the core's [`Limits`], the connection limits
//! `loragate-net`'s `ConnectionLimits`, how the engine runs `loragate-engine`'s `EngineConfig`.

use std::path::PathBuf;
use std::time::Duration;

use loragate_core::{AdapterRoot, CoordinatorConfig, Key, KeyConfigError, Keyring, Limits, TenantKeys};

use crate::model::InitialAdapter;
use loragate_fleet::{FleetConfig, WorkerAddress};

/// How long a sampling request may be held at a paused gate, and how long a pause waits for running requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateDeadlines {
    /// The longest hold at a paused adapter's gate, or a paused worker's (`--gate-max-wait`).
    pub gate_max_wait: Duration,
    /// How long an abort waits for hand-backs (`serve --abort-ack-timeout`).
    pub abort_ack_timeout: Duration,
    /// The longest drain of a wait-mode pause without a caller deadline (`serve --max-pause-drain`).
    pub max_pause_drain: Duration,
}

impl Default for GateDeadlines {
    /// The coordinator's defaults: 120 s, 10 s, 600 s.
    fn default() -> Self {
        let defaults = CoordinatorConfig::default();
        Self {
            gate_max_wait: defaults.max_gate_hold,
            abort_ack_timeout: defaults.abort_ack_timeout,
            max_pause_drain: defaults.max_pause_drain,
        }
    }
}

/// The adapters `serve` starts with and how it keeps their versions: `--adapter` / `--lora-modules`,
/// `--adapter-root`, `--retain-versions`, `--max-loras`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSettings {
    /// Adapters to load at start.
    pub initial: Vec<InitialAdapter>,
    /// The only directory `LoadLoraAdapter` may read from (default for the demo: its adapters directory).
    pub root: Option<PathBuf>,
    /// How many versions of each adapter stay loaded and servable to exact pins (`NAME@V`), the current one
    /// included (`--retain-versions`; at least 1).
    pub retain_versions: usize,
    /// The most LoRA adapters loaded at once (`--max-loras`; `None`: no cap): loads under new names past it are
    /// refused until one is unloaded.
    pub max_loras: Option<usize>,
}

impl Default for AdapterSettings {
    /// No initial adapter, no root, only the current version retained.
    fn default() -> Self {
        Self {
            initial: Vec::new(),
            root: None,
            retain_versions: CoordinatorConfig::default().retain_versions,
            max_loras: None,
        }
    }
}

/// The keys of `--api-key`, `--admin-key` and `--tenant-keys` (`serve` only); any one turns authentication on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Authentication {
    /// May sample (on a worker: may call `vllm.Inference`).
    pub api_key: Option<Key>,
    /// May do everything (on a worker: what the fleet coordinator presents with its `--worker-key`).
    pub admin_key: Option<Key>,
    /// A JSON file of tenant keys (see `docs/security.md`).
    pub tenant_keys: Option<PathBuf>,
}

impl Authentication {
    /// The keyring these keys make (reading the tenant file).
    pub fn keyring(&self) -> Result<Keyring, KeyConfigError> {
        let tenants = match &self.tenant_keys {
            Some(path) => TenantKeys::read(path)?,
            None => TenantKeys::default(),
        };
        Keyring::new(self.api_key.clone(), self.admin_key.clone(), tenants)
    }
}

/// The workers `serve` fronts instead of running the engine in-process (`--worker` and the `--worker-…` flags).
#[derive(Clone, Debug)]
pub struct FleetSettings {
    /// The workers (`--worker`); empty for the in-process engine.
    pub workers: Vec<WorkerAddress>,
    /// How often the workers' health is checked (`--worker-health-interval`).
    pub health_interval: Duration,
    /// Failures in a row after which a worker's probes back off and it must pass that many checks to serve again
    /// (`--worker-failure-threshold`).
    pub failure_threshold: u32,
    /// How long the coordinator waits at start for a first worker to be ready (`--worker-wait`).
    pub join_timeout: Duration,
    /// How long a worker may take to its first streamed event (`--worker-first-byte-timeout`).
    pub first_byte_timeout: Duration,
    /// How long a worker may stay silent between two streamed events (`--worker-inter-chunk-timeout`).
    pub inter_chunk_timeout: Duration,
    /// The most workers the fleet holds (`--max-workers`).
    pub max_workers: usize,
    /// Where the workers mount the adapter root (`--worker-adapter-root`; default: where the coordinator names it).
    pub worker_adapter_root: Option<PathBuf>,
    /// The key presented to the workers (`--worker-key`).
    pub worker_key: Option<Key>,
}

impl FleetSettings {
    /// Whether there is a fleet: some worker was given.
    pub fn is_enabled(&self) -> bool {
        !self.workers.is_empty()
    }

    /// The fleet engine's configuration, with the coordinator's adapter root (as the coordinator names it).
    pub(crate) fn fleet_config(&self, adapter_root: Option<&AdapterRoot>) -> FleetConfig {
        FleetConfig {
            health_interval: self.health_interval,
            failure_threshold: self.failure_threshold,
            max_workers: self.max_workers,
            join_timeout: self.join_timeout,
            first_byte_timeout: self.first_byte_timeout,
            inter_chunk_timeout: self.inter_chunk_timeout,
            adapter_root: adapter_root.map(|root| root.path().to_owned()),
            worker_adapter_root: self.worker_adapter_root.clone(),
            worker_key: self.worker_key.clone(),
            ..FleetConfig::default()
        }
    }
}

impl Default for FleetSettings {
    /// No worker, with the fleet engine's defaults (checks every 2 s, a threshold of 3, 60 s to wait for a first
    /// worker, 60 s to a stream's first event and 30 s between two, at most 256 workers).
    fn default() -> Self {
        let defaults = FleetConfig::default();
        Self {
            workers: Vec::new(),
            health_interval: defaults.health_interval,
            failure_threshold: defaults.failure_threshold,
            join_timeout: defaults.join_timeout,
            first_byte_timeout: defaults.first_byte_timeout,
            inter_chunk_timeout: defaults.inter_chunk_timeout,
            max_workers: defaults.max_workers,
            worker_adapter_root: defaults.worker_adapter_root,
            worker_key: defaults.worker_key,
        }
    }
}

/// The coordinator's configuration, as `serve` and `worker` both make it: these deadlines, limits, keys and adapter
/// root, with the base model's served name reserved (no adapter may be loaded under it), and its state in memory
/// (`serve` replaces it with the store it opened).
pub(crate) fn coordinator_config(
    deadlines: GateDeadlines,
    limits: Limits,
    auth: Keyring,
    adapter_root: Option<AdapterRoot>,
    served_model_name: &str,
) -> CoordinatorConfig {
    CoordinatorConfig {
        max_gate_hold: deadlines.gate_max_wait,
        abort_ack_timeout: deadlines.abort_ack_timeout,
        max_pause_drain: deadlines.max_pause_drain,
        adapter_root,
        limits,
        auth,
        reserved_names: vec![served_model_name.to_owned()],
        ..CoordinatorConfig::default()
    }
}
