//! How SDK users name what they sample: `base_model="<served name>"` is the base model and
//! `model_path="tinker://loragate/<adapter>"` an adapter (everything after the prefix, `/` included). Anything else is
//! refused with a message that names the expected form. The adapter is looked up on every call, so a sampling client
//! follows its adapter across swaps, unloads and reloads.

use loragate_core::{AdapterKey, AdapterName, Coordinator};

use crate::error::TinkerError;

/// The prefix of loragate's `model_path`s.
pub const MODEL_PATH_PREFIX: &str = "tinker://loragate/";

/// What a request names: the served base model's name and the target fields as the SDK sends them.
pub(crate) struct Naming<'a> {
    /// The base model's served name.
    pub(crate) served_model_name: &'a str,
    /// The coordinator, to check that an adapter is loaded.
    pub(crate) coordinator: &'a Coordinator,
}

impl Naming<'_> {
    /// The target of `base_model` and/or `model_path`, which must be served now.
    pub(crate) fn resolve(
        &self,
        base_model: Option<&str>,
        model_path: Option<&str>,
    ) -> Result<AdapterKey, TinkerError> {
        match (base_model, model_path) {
            (_, Some(model_path)) => {
                let target = self.adapter_of(model_path)?;
                match base_model {
                    Some(base) if base != self.served_model_name => Err(TinkerError::invalid(
                        "base_model",
                        format!(
                            "is '{base}', but model_path '{model_path}' is an adapter of '{}' (omit base_model or \
                             pass that name)",
                            self.served_model_name
                        ),
                    )),
                    _ => Ok(target),
                }
            }
            (Some(base), None) if base == self.served_model_name => Ok(AdapterKey::Base),
            (Some(base), None) => {
                let mut detail =
                    format!("base_model '{base}' is not served here (this server serves '{}')", self.served_model_name);
                if let Ok(name) = AdapterName::parse(base)
                    && self.coordinator.lora(&name).is_ok()
                {
                    detail.push_str(&format!("; '{base}' is an adapter: use model_path='{MODEL_PATH_PREFIX}{base}'"));
                }
                Err(TinkerError::UnknownTarget(detail))
            }
            (None, None) => Err(TinkerError::invalid(
                "base_model",
                format!(
                    "base_model or model_path is required: base_model='{}' or model_path='{MODEL_PATH_PREFIX}<adapter>'",
                    self.served_model_name
                ),
            )),
        }
    }

    /// Checks that `target` is still served (a sampling session's adapter may have been unloaded since).
    pub(crate) fn check_served(&self, target: &AdapterKey) -> Result<(), TinkerError> {
        match target {
            AdapterKey::Base => Ok(()),
            AdapterKey::Lora(name) => self.adapter_of(&format!("{MODEL_PATH_PREFIX}{name}")).map(|_| ()),
        }
    }

    fn adapter_of(&self, model_path: &str) -> Result<AdapterKey, TinkerError> {
        if !model_path.starts_with("tinker://") {
            return Err(TinkerError::invalid(
                "model_path",
                format!("'{model_path}' must have the form '{MODEL_PATH_PREFIX}<adapter>'"),
            ));
        }
        let expected = || {
            TinkerError::UnknownTarget(format!(
                "model_path '{model_path}' is not a loragate path: loragate serves its loaded adapters as \
                 '{MODEL_PATH_PREFIX}<adapter>' (Tinker checkpoints such as 'tinker://<run-id>/sampler_weights/<name>' \
                 are not supported)"
            ))
        };
        let name = model_path.strip_prefix(MODEL_PATH_PREFIX).filter(|name| !name.is_empty()).ok_or_else(expected)?;
        let not_loaded = || {
            TinkerError::UnknownTarget(format!(
                "adapter '{name}' (model_path '{model_path}') is not loaded on this server"
            ))
        };
        let name = AdapterName::parse(name).map_err(|_| not_loaded())?;
        self.coordinator.lora(&name).map_err(|_| not_loaded())?;
        Ok(AdapterKey::Lora(name))
    }
}

/// The `model_path` of a target (`None` for the base model).
pub(crate) fn model_path_of(target: &AdapterKey) -> Option<String> {
    target.adapter_name().map(|name| format!("{MODEL_PATH_PREFIX}{name}"))
}

#[cfg(test)]
mod tests {
    use loragate_core::CoordinatorConfig;
    use loragate_core::testing::{ScriptedEngine, coordinator_with_adapters};

    use super::*;

    fn detail(result: Result<AdapterKey, TinkerError>) -> (u16, String) {
        let err = result.expect_err("refused");
        (err.status().as_u16(), err.to_string())
    }

    #[tokio::test]
    async fn base_model_and_model_path_name_the_base_model_and_adapters_or_are_refused_by_name() {
        let coordinator =
            coordinator_with_adapters(ScriptedEngine::new(1), CoordinatorConfig::default(), &["meow", "org/policy"])
                .await;
        let naming = Naming { served_model_name: "demo", coordinator: &coordinator };
        let meow = AdapterKey::Lora(AdapterName::parse("meow").expect("name"));

        assert_eq!(naming.resolve(Some("demo"), None).ok(), Some(AdapterKey::Base));
        assert_eq!(naming.resolve(None, Some("tinker://loragate/meow")).ok(), Some(meow.clone()));
        assert_eq!(naming.resolve(Some("demo"), Some("tinker://loragate/meow")).ok(), Some(meow.clone()));
        let policy = naming.resolve(None, Some("tinker://loragate/org/policy")).expect("names may contain '/'");
        assert_eq!(policy.as_wire_str(), "org/policy");
        assert_eq!(model_path_of(&meow).as_deref(), Some("tinker://loragate/meow"));
        assert_eq!(model_path_of(&AdapterKey::Base), None);

        let (status, message) = detail(naming.resolve(Some("llama"), None));
        assert_eq!(
            (status, message.as_str()),
            (404, "base_model 'llama' is not served here (this server serves 'demo')")
        );
        let (status, message) = detail(naming.resolve(Some("meow"), None));
        assert_eq!(status, 404);
        assert!(message.ends_with("; 'meow' is an adapter: use model_path='tinker://loragate/meow'"), "{message}");
        let (status, message) = detail(naming.resolve(None, Some("tinker://loragate/meow2")));
        assert_eq!(
            (status, message.as_str()),
            (404, "adapter 'meow2' (model_path 'tinker://loragate/meow2') is not loaded on this server")
        );
        for other in ["tinker://run-1/sampler_weights/final", "tinker://loragate/", "tinker://loragate"] {
            let (status, message) = detail(naming.resolve(None, Some(other)));
            assert_eq!(status, 404, "{other}");
            assert!(message.contains("'tinker://loragate/<adapter>'"), "{message}");
        }
        let (status, message) = detail(naming.resolve(Some("llama"), Some("tinker://loragate/meow")));
        assert_eq!(status, 400);
        assert!(message.starts_with("base_model: "), "{message}");
        assert_eq!(detail(naming.resolve(None, None)).0, 400);
        assert_eq!(detail(naming.resolve(None, Some("meow"))).0, 400);

        assert!(naming.check_served(&meow).is_ok() && naming.check_served(&AdapterKey::Base).is_ok());
        coordinator.unload_adapter(&AdapterName::parse("meow").expect("name")).await.expect("unload");
        assert_eq!(naming.check_served(&meow).map_err(|err| err.status().as_u16()), Err(404));
    }
}
