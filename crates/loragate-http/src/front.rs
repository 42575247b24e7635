//! [`HttpFront`]: what the HTTP front serves (the coordinator, the base model's served name, the text codec, the chat
//! template, limits, and the routes of other fronts sharing the listener), and how requests name models.

use std::sync::Arc;

use axum::Router;
use loragate_core::{Coordinator, MetricsSource};
use loragate_net::ConnectionLimits;
use loragate_net::json_body::DEFAULT_BODY_LIMIT;

use crate::chat_template::ChatTemplate;
use crate::error::HttpError;
use loragate_text::TextCodec;

/// What the HTTP front serves: the coordinator, the base model's served name, the text codec, the chat template
/// (if the model has one), the body limit, the connection limits, and routes of other fronts that share the listener
/// (the Tinker API).
#[derive(Clone)]
pub struct HttpFront {
    pub(crate) coordinator: Coordinator,
    pub(crate) served_model_name: Arc<str>,
    pub(crate) codec: Arc<dyn TextCodec>,
    pub(crate) chat_template: Option<Arc<ChatTemplate>>,
    pub(crate) body_limit: usize,
    pub(crate) connections: ConnectionLimits,
    pub(crate) metrics_sources: Vec<Arc<dyn MetricsSource>>,
    pub(crate) extra_routes: Option<Router>,
}

impl HttpFront {
    /// A front over `coordinator`. `served_model_name` is what `model` and `/v1/models` call the base model;
    /// `codec` encodes text prompts and decodes generated tokens. The body limit is [`DEFAULT_BODY_LIMIT`], the
    /// connection limits are [`ConnectionLimits::default`].
    pub fn new(coordinator: Coordinator, served_model_name: impl Into<String>, codec: Arc<dyn TextCodec>) -> Self {
        let served_model_name: String = served_model_name.into();
        Self {
            coordinator,
            served_model_name: served_model_name.into(),
            codec,
            chat_template: None,
            body_limit: DEFAULT_BODY_LIMIT,
            connections: ConnectionLimits::default(),
            metrics_sources: Vec::new(),
            extra_routes: None,
        }
    }

    /// Serves `POST /v1/chat/completions` (and chat `messages` on `/tokenize`) with `template`. Without one, chat
    /// requests get 400 saying the model has no chat template.
    pub fn with_chat_template(mut self, template: ChatTemplate) -> Self {
        self.chat_template = Some(Arc::new(template));
        self
    }

    /// Sets the connection cap and timeouts (clones of one [`ConnectionLimits`] share its cap with other fronts).
    pub fn with_connection_limits(mut self, connections: ConnectionLimits) -> Self {
        self.connections = connections;
        self
    }

    /// Adds `source`'s metrics to `/metrics` (a fleet's per-worker metrics).
    pub fn with_metrics_source(mut self, source: Arc<dyn MetricsSource>) -> Self {
        self.metrics_sources.push(source);
        self
    }

    pub(crate) fn metrics_sources(&self) -> &[Arc<dyn MetricsSource>] {
        &self.metrics_sources
    }

    /// Serves `routes` on the same listener, beside this front's own (another API over the same coordinator, such as
    /// the Tinker front). They must have their state applied, at least one route, and no fallback (unknown paths keep
    /// this front's 404); their paths must not overlap this front's. They pass the same guard (cross-origin, JSON
    /// bodies, keys) and are counted in the request metrics like every route.
    pub fn with_routes(mut self, routes: Router) -> Self {
        self.extra_routes = Some(match self.extra_routes.take() {
            Some(earlier) => earlier.merge(routes),
            None => routes,
        });
        self
    }

    /// Sets the largest request body accepted, in bytes (larger ones get 413).
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    pub(crate) fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }

    pub(crate) fn served_model_name(&self) -> &str {
        &self.served_model_name
    }

    pub(crate) fn codec(&self) -> &Arc<dyn TextCodec> {
        &self.codec
    }

    pub(crate) fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_deref()
    }

    /// The core's `lora_name` for a completion's `model`: empty (the base model) for the served name, else the
    /// model itself (an adapter's name; the core checks it).
    pub(crate) fn lora_name_for<'a>(&self, model: &'a str) -> &'a str {
        if model == &*self.served_model_name { "" } else { model }
    }

    /// A request's `model`: the served name when it names none (as vLLM does); an empty name is refused.
    pub(crate) fn model_or_base(&self, model: Option<String>) -> Result<String, HttpError> {
        match model {
            None => Ok(self.served_model_name.to_string()),
            Some(model) if model.is_empty() => Err(HttpError::invalid(
                "model",
                format!("must name the base model ({:?}) or a loaded adapter", self.served_model_name),
            )),
            Some(model) => Ok(model),
        }
    }
}
