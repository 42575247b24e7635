//! What runs the model under `serve`'s coordinator: the in-process engine, or a fleet of workers.

use std::sync::Arc;

use loragate_core::{AdapterRoot, Engine};
use loragate_engine::{EngineConfig, EngineLoadError, Tokenizer, read_model_info};
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
        let engine = load_engine(&model.path, config.clone()).await?;
        let tokenizer = engine.tokenizer().cloned();
        Ok(Self { engine: Arc::new(engine), tokenizer, fleet: None })
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
        Ok(Self { engine: fleet.clone(), tokenizer, fleet: Some(fleet) })
    }
}
