//! What runs the model under `serve`'s coordinator: the in-process engine, or a fleet of workers.

use std::sync::Arc;

use loragate_core::{AdapterRoot, Engine, MetricsSource};
use loragate_engine::{EngineConfig, EngineFacts, EngineLoadError, Tokenizer, read_model_info};
use loragate_fleet::FleetEngine;

use crate::error::ServeError;
use crate::model::ResolvedModel;
use crate::settings::FleetSettings;
use crate::startup::{blocking, load_engine};

/// What runs the model: the in-process engine, or a fleet of workers.
pub(super) struct Backend {
    /// The coordinator's engine.
    pub(super) engine: Arc<dyn Engine>,
    /// The model's tokenizer, for the HTTP front's text (none for a model without one).
    pub(super) tokenizer: Option<Tokenizer>,
    /// The fleet, when the engine is one (for `Fleet` and the workers' metrics).
    pub(super) fleet: Option<Arc<FleetEngine>>,
    /// The in-process engine's facts (its KV cache, its weights) and metrics; none for a fleet.
    pub(super) in_process: Option<(EngineFacts, Arc<dyn MetricsSource>)>,
}

impl Backend {
    /// The fleet if `fleet` names workers (adapter paths sent to them under `adapter_root`), else the in-process
    /// engine.
    pub(super) async fn start(
        model: &ResolvedModel,
        engine: &EngineConfig,
        fleet: &FleetSettings,
        adapter_root: Option<&AdapterRoot>,
    ) -> Result<Self, ServeError> {
        if fleet.is_enabled() {
            Self::fleet(model, engine, fleet, adapter_root).await
        } else {
            Self::in_process(model, engine).await
        }
    }

    async fn in_process(model: &ResolvedModel, config: &EngineConfig) -> Result<Self, ServeError> {
        let engine = Arc::new(load_engine(&model.path, config.clone()).await?);
        let tokenizer = engine.tokenizer().cloned();
        let in_process = Some((engine.facts().clone(), engine.clone() as Arc<dyn MetricsSource>));
        Ok(Self { engine, tokenizer, fleet: None, in_process })
    }

    /// The fleet, once at least one worker is ready (waiting up to `--worker-wait` for one). The model's files supply
    /// only the limits and tokenizer; adapter paths go to the workers absolute, those inside the adapter root under
    /// the workers' mount of it (`--worker-adapter-root`).
    async fn fleet(
        model: &ResolvedModel,
        engine: &EngineConfig,
        settings: &FleetSettings,
        adapter_root: Option<&AdapterRoot>,
    ) -> Result<Self, ServeError> {
        let (path, max_context) = (model.path.clone(), engine.max_context_length);
        let (info, tokenizer) = blocking(move || {
            Ok::<_, EngineLoadError>((read_model_info(&path, max_context)?, Tokenizer::for_model(&path)?))
        })
        .await??;
        let fleet_config = settings.fleet_config(adapter_root);
        let fleet = Arc::new(FleetEngine::start(info, settings.workers.clone(), fleet_config).await?);
        fleet.wait_ready().await?;
        Ok(Self { engine: fleet.clone(), tokenizer, fleet: Some(fleet), in_process: None })
    }
}
