//! Every other `/api/v1/` route: a 404 whose detail names the feature and says it is not supported, with
//! `x-should-retry: false`. Never 501 or another 5xx: the SDK retries those for minutes.

use http::Uri;

use crate::error::TinkerError;

/// Route names (the first segment after `/api/v1/`) and the feature they belong to.
const FEATURES: &[(&[&str], &str)] = &[
    (&["create_model", "forward_backward", "forward", "optim_step", "get_info"], "LoRA training (TrainingClient)"),
    (
        &[
            "save_weights",
            "save_weights_for_sampler",
            "save_weights_external",
            "load_weights",
            "copy_weights",
            "weights_info",
        ],
        "Checkpoints (save_weights / load_weights; load adapters with LoadLoraAdapter or /v1/load_lora_adapter instead)",
    ),
    (&["create_custom_loss"], "Custom losses"),
    (&["training_runs", "checkpoints"], "Training run and checkpoint listings (RestClient)"),
    (&["sessions"], "Session listings (RestClient)"),
    (&["retrieve_futures"], "Session-wide future polling (retrieve_futures)"),
    (&["join_sampling_session"], "Joining sampling sessions (join_sampling_session)"),
    (&["cancel_future"], "Cancelling futures (cancel_future)"),
    (&["auth"], "JWT and API-key administration (auth)"),
    (&["audit", "billing"], "Administration (audit, billing)"),
];

/// The handler of every `/api/v1/` path this front does not serve.
pub(crate) async fn not_supported(uri: Uri) -> TinkerError {
    let route = uri.path().strip_prefix("/api/v1/").unwrap_or_default();
    let first_segment = route.split('/').next().unwrap_or_default();
    let feature = FEATURES
        .iter()
        .find(|(routes, _)| routes.contains(&first_segment))
        .map_or_else(|| format!("The Tinker route /api/v1/{route}"), |(_, feature)| format!("{feature} ({route})"));
    TinkerError::NotSupported { feature }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn detail(path: &str) -> String {
        not_supported(path.parse().expect("uri")).await.to_string()
    }

    #[tokio::test]
    async fn refusals_name_the_feature_and_the_route() {
        let training = detail("/api/v1/create_model").await;
        assert!(training.starts_with("LoRA training (TrainingClient) (create_model) is not supported"), "{training}");
        assert!(detail("/api/v1/training_runs/run-1/checkpoints").await.contains("(RestClient)"));
        let unknown = detail("/api/v1/something/new").await;
        assert!(unknown.starts_with("The Tinker route /api/v1/something/new is not supported"), "{unknown}");
    }
}
