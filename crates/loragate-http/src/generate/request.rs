//! The body of `POST /inference/v1/generate` (vLLM's `GenerateRequest`), apart from the sampling fields shared with
//! the OpenAI endpoints ([`VllmSampling`](crate::sampling::VllmSampling), parsed from `sampling_params`). Unknown
//! fields are refused; `cache_salt`, `priority`, `kv_transfer_params` and `routed_experts_prompt_start` are accepted
//! and change nothing here.

use serde::Deserialize;
use serde_json::Value;

use crate::output::StreamOptions;

/// vLLM's generate request's own fields.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct GenerateBody {
    /// The prompt (required).
    pub(crate) token_ids: Option<Vec<u32>>,
    /// The base model's served name or an adapter's name; absent for the base model.
    pub(crate) model: Option<String>,
    /// The caller's id (else `X-Request-Id`, else one the server makes).
    pub(crate) request_id: Option<String>,
    /// Answer with server-sent events.
    pub(crate) stream: Option<bool>,
    /// With `stream`: `include_usage`.
    pub(crate) stream_options: Option<StreamOptions>,
    /// Multimodal features: refused (out of scope).
    pub(crate) features: Option<Value>,
    /// vLLM's namespace of the request's cached prefixes: requests with other salts never share cached keys and
    /// values.
    pub(crate) cache_salt: Option<String>,
    /// loragate's: the oldest adapter version that may serve the request (0 or absent: any); held at the gate
    /// until the adapter reaches it.
    pub(crate) min_lora_version: Option<u64>,
}

/// The one field of `sampling_params` this endpoint reads itself.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct GenerateSampling {
    /// Return each token's logprob, with this many alternatives (`null`: no logprobs).
    pub(crate) logprobs: Option<u32>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::json_body::parse_value;

    #[test]
    fn skyrls_and_prime_rls_bodies_parse() {
        let skyrl = json!({"sampling_params": {"min_tokens": 1, "logprobs": 1}, "model": "meow", "token_ids": [1, 2],
            "cache_salt": "salt"});
        let body: GenerateBody = parse_value(&skyrl, "").expect("parses");
        assert_eq!((body.token_ids, body.model.as_deref()), (Some(vec![1, 2]), Some("meow")));
        let extras: GenerateSampling = parse_value(&skyrl["sampling_params"], "sampling_params").expect("parses");
        assert_eq!(extras.logprobs, Some(1));
        let err = parse_value::<GenerateBody>(&json!({"token_ids": [1, -1]}), "").expect_err("negative id");
        assert_eq!(err.param().as_deref(), Some("token_ids"));
        let err = parse_value::<GenerateSampling>(&json!({"logprobs": true}), "sampling_params").expect_err("bool");
        assert_eq!(err.param().as_deref(), Some("sampling_params.logprobs"));
    }
}
