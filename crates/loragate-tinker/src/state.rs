//! [`TinkerState`]: what every handler and sample task of the front shares. Handlers import this module, never the
//! one that builds the routes.

use std::sync::Arc;

use loragate_core::Coordinator;
use loragate_text::TextCodec;

use crate::front::TinkerConfig;
use crate::ids::IdMaker;
use crate::store::FutureStore;

/// What every handler and sample task shares.
#[derive(Clone)]
pub(crate) struct TinkerState(Arc<Shared>);

pub(crate) struct Shared {
    pub(crate) coordinator: Coordinator,
    pub(crate) served_model_name: Arc<str>,
    pub(crate) codec: Arc<dyn TextCodec>,
    pub(crate) config: TinkerConfig,
    pub(crate) store: FutureStore,
    pub(crate) ids: IdMaker,
}

impl TinkerState {
    pub(crate) fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }

    pub(crate) fn coordinator(&self) -> &Coordinator {
        &self.0.coordinator
    }

    pub(crate) fn served_model_name(&self) -> &str {
        &self.0.served_model_name
    }

    pub(crate) fn codec(&self) -> &Arc<dyn TextCodec> {
        &self.0.codec
    }

    pub(crate) fn config(&self) -> &TinkerConfig {
        &self.0.config
    }

    pub(crate) fn store(&self) -> &FutureStore {
        &self.0.store
    }

    pub(crate) fn ids(&self) -> &IdMaker {
        &self.0.ids
    }
}
