//! vLLM's `GenerateRequest` as the core's validated [`SampleRequest`], with vLLM's defaults where the proto is
//! silent: `temperature` unset is greedy, `max_new_tokens = 0` is 20 (capped by the context), `top_k` / `top_p`
//! unset are disabled, `repetition_penalty = 0` is no penalty, an empty `lora_name` is the base model, an empty
//! `request_id` gets a fresh id. `min_p`, the penalties, `min_new_tokens` and top-N candidates map to the core's
//! sampler; a field this worker cannot honour (a stop string, text prompts, a logit bias, …) is refused naming the
//! field rather than ignored.

use loragate_core::{ModelInfo, RawSampleRequest, RequestId, SampleRequest};
use vllm_proto as pb;

use crate::error::WorkerError;

/// vLLM's default budget when `StoppingCriteria.max_new_tokens` is 0.
pub const DEFAULT_MAX_NEW_TOKENS: u32 = 20;

/// Which parts of the output the caller asked for (`ResponseOptions`; vLLM's defaults: all off but text).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ResponseOptions {
    pub(crate) prompt_token_ids: bool,
    pub(crate) prompt_logprobs: bool,
    pub(crate) output_token_ids: bool,
    pub(crate) output_logprobs: bool,
    /// `output_candidates.top_n`: each output token's rank and the N most likely tokens at its position.
    pub(crate) output_top_n: u32,
    /// `prompt_candidates.top_n`: each prompt token's rank and the N most likely tokens at its position.
    pub(crate) prompt_top_n: Option<u32>,
}

/// A parsed `GenerateRequest`.
#[derive(Debug)]
pub(crate) struct GenerateCall {
    /// The validated request (one sequence).
    pub(crate) request: SampleRequest,
    /// What to put in the responses.
    pub(crate) options: ResponseOptions,
}

/// Parses `request` for a worker serving `model` as `served_model_name`. Errors name the offending field.
pub(crate) fn parse_generate(
    request: pb::GenerateRequest,
    model: &ModelInfo,
    served_model_name: &str,
) -> Result<GenerateCall, WorkerError> {
    if !request.model.is_empty() && request.model != served_model_name {
        return Err(WorkerError::ModelNotFound(request.model));
    }
    if !request.media.is_empty() {
        return Err(WorkerError::invalid("media", "multimodal inputs are not supported"));
    }
    let prompt = match request.prompt {
        Some(pb::generate_request::Prompt::TokenIds(ids)) => ids.ids,
        Some(pb::generate_request::Prompt::Text(_)) => {
            return Err(WorkerError::invalid(
                "prompt.text",
                "this worker takes token ids only (GetModelInfo.supports_text_input is false)",
            ));
        }
        None => return Err(WorkerError::invalid("prompt", "is required")),
    };
    let prompt = truncate_prompt(prompt, request.truncate_prompt_tokens);
    let sampling = request.sampling.unwrap_or_default();
    check_sampling(&sampling)?;
    let decoding = request.decoding.unwrap_or_default();
    check_decoding(&decoding)?;
    let stopping = request.stopping.unwrap_or_default();
    check_stopping(&stopping)?;
    let response = request.response.unwrap_or_default();
    let prompt_top_n = top_n(&response.prompt_candidates, "response.prompt_candidates")?;
    let output_top_n = top_n(&response.output_candidates, "response.output_candidates")?.unwrap_or(0);
    if let Some(kv) = &request.kv
        && (kv.kv_transfer_params.is_some() || kv.ec_transfer_params.is_some())
    {
        return Err(WorkerError::invalid("kv", "KV and encoder cache transfer are not supported"));
    }

    let request_id = RequestId::parse_or_generate(&request.request_id).map_err(WorkerError::from_core)?;
    let max_tokens = match stopping.max_new_tokens {
        // vLLM's default budget, within what the context leaves (an explicit budget is never shortened).
        0 => DEFAULT_MAX_NEW_TOKENS.min(model.context_length.saturating_sub(prompt.len() as u32)).max(1),
        n => n,
    };
    let top_k = match sampling.top_k {
        None | Some(0) => 0,
        Some(k) => i32::try_from(k).map_err(|_| WorkerError::invalid("sampling.top_k", format!("{k} is too large")))?,
    };
    let raw = RawSampleRequest {
        request_id: request_id.as_str().to_owned(),
        lora_name: request.lora_name.clone(),
        prompt_token_ids: prompt,
        max_tokens: Some(max_tokens),
        temperature: request.temperature.unwrap_or(0.0),
        top_p: sampling.top_p,
        top_k,
        // vLLM seeds are int64; the engine's are u64 with the same bits.
        seed: sampling.seed.map(|seed| seed as u64),
        stop_token_ids: stopping.stop_token_ids,
        ignore_eos: stopping.ignore_eos,
        min_p: sampling.min_p.unwrap_or(0.0),
        // 0 is the proto's "unset"; 1 is no penalty.
        repetition_penalty: (decoding.repetition_penalty != 0.0).then_some(decoding.repetition_penalty),
        presence_penalty: decoding.presence_penalty,
        frequency_penalty: decoding.frequency_penalty,
        min_tokens: stopping.min_new_tokens,
        num_samples: 1,
        include_prompt_logprobs: response.prompt_logprobs || prompt_top_n.is_some(),
        top_logprobs: output_top_n,
        prompt_top_logprobs: prompt_top_n,
        // vLLM's protocol names versions in the adapter's name (`NAME@V`), never as a minimum.
        min_lora_version: 0,
        cache_salt: request.kv.as_ref().map(|kv| kv.cache_salt.clone()),
    };
    let request = SampleRequest::parse(raw, model).map_err(WorkerError::from_core)?;
    let options = ResponseOptions {
        prompt_token_ids: response.prompt_token_ids,
        prompt_logprobs: response.prompt_logprobs,
        output_token_ids: response.output_token_ids,
        output_logprobs: response.output_logprobs,
        output_top_n,
        prompt_top_n,
    };
    Ok(GenerateCall { request, options })
}

/// vLLM's `truncate_prompt_tokens`: 0 keeps the prompt, N keeps its last N tokens.
fn truncate_prompt(mut prompt: Vec<u32>, keep: u32) -> Vec<u32> {
    let keep = keep as usize;
    if keep > 0 && prompt.len() > keep {
        prompt.drain(..prompt.len() - keep);
    }
    prompt
}

fn unsupported(field: &'static str) -> WorkerError {
    WorkerError::invalid(field, "is not supported by loragate worker")
}

fn check_sampling(sampling: &pb::RandomSampling) -> Result<(), WorkerError> {
    if sampling.num_sequences > 1 {
        // As vLLM's gRPC frontend: one sequence per request (responses carry one `outputs`).
        return Err(WorkerError::invalid(
            "sampling.num_sequences",
            format!("is {}; only 1 is supported (send one request per sequence)", sampling.num_sequences),
        ));
    }
    Ok(())
}

fn check_decoding(decoding: &pb::DecodingParameters) -> Result<(), WorkerError> {
    if !decoding.logit_bias.is_empty() {
        return Err(unsupported("decoding.logit_bias"));
    }
    if !decoding.allowed_token_ids.is_empty() {
        return Err(unsupported("decoding.allowed_token_ids"));
    }
    if !decoding.bad_words_token_ids.is_empty() {
        return Err(unsupported("decoding.bad_words_token_ids"));
    }
    match &decoding.structured_output {
        None | Some(pb::decoding_parameters::StructuredOutput::JsonObject(false)) => Ok(()),
        Some(_) => Err(unsupported("decoding.structured_output")),
    }
}

fn check_stopping(stopping: &pb::StoppingCriteria) -> Result<(), WorkerError> {
    if !stopping.stop_strings.is_empty() {
        return Err(WorkerError::invalid("stopping.stop_strings", "this worker takes stop_token_ids only"));
    }
    if stopping.thinking_token_budget.is_some_and(|budget| budget != -1) {
        return Err(unsupported("stopping.thinking_token_budget"));
    }
    Ok(())
}

/// The N of a `top_n` candidate selection (`None`: no candidates asked for). Candidates by token id, or all of
/// them, are refused naming `field`.
fn top_n(candidates: &Option<pb::CandidateTokens>, field: &'static str) -> Result<Option<u32>, WorkerError> {
    match candidates.as_ref().and_then(|c| c.select.as_ref()) {
        None | Some(pb::candidate_tokens::Select::TopN(0)) | Some(pb::candidate_tokens::Select::All(false)) => Ok(None),
        Some(pb::candidate_tokens::Select::TopN(n)) => Ok(Some(*n)),
        Some(pb::candidate_tokens::Select::TokenIds(ids)) if ids.ids.is_empty() => Ok(None),
        Some(_) => Err(WorkerError::invalid(field, "only top_n candidates are supported by loragate worker")),
    }
}

#[cfg(test)]
mod tests {
    use loragate_core::{AdapterKey, AdapterName};

    use super::*;

    fn model() -> ModelInfo {
        ModelInfo { vocab_size: 260, context_length: 64, eos_token_ids: vec![257] }
    }

    fn request(prompt: &[u32]) -> pb::GenerateRequest {
        pb::GenerateRequest {
            request_id: "r1".into(),
            prompt: Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds { ids: prompt.to_vec() })),
            ..Default::default()
        }
    }

    fn parse(request: pb::GenerateRequest) -> Result<GenerateCall, WorkerError> {
        parse_generate(request, &model(), "demo")
    }

    #[test]
    fn vllms_defaults_fill_what_the_proto_leaves_unset() {
        let call = parse(request(&[1, 2, 3])).expect("valid");
        assert_eq!(call.request.params().max_tokens(), DEFAULT_MAX_NEW_TOKENS, "max_new_tokens = 0 means 20");
        assert!(call.request.params().is_greedy(), "temperature unset is greedy");
        assert_eq!(call.request.params().top_k(), None);
        assert_eq!(call.request.params().top_p(), 1.0);
        assert_eq!(call.request.adapter(), &AdapterKey::Base, "empty lora_name is the base model");
        assert_eq!(call.options, ResponseOptions::default(), "token ids and logprobs default to off");
        assert_eq!(call.request.id().as_str(), "r1");
        let unnamed = parse(pb::GenerateRequest { request_id: String::new(), ..request(&[1]) }).expect("valid");
        assert!(!unnamed.request.id().as_str().is_empty(), "an empty request_id gets a fresh one");
    }

    #[test]
    fn the_default_budget_fits_the_context_and_an_explicit_one_is_kept() {
        let long = parse(request(&[1; 60])).expect("valid");
        assert_eq!(long.request.params().max_tokens(), 4, "20 capped by the 4 tokens the context leaves");
        let explicit = pb::GenerateRequest {
            stopping: Some(pb::StoppingCriteria { max_new_tokens: 7, ..Default::default() }),
            ..request(&[1])
        };
        assert_eq!(parse(explicit).expect("valid").request.params().max_tokens(), 7);
    }

    #[test]
    fn every_mapped_field_arrives() {
        let call = parse(pb::GenerateRequest {
            lora_name: "meow@3".into(),
            temperature: Some(0.7),
            sampling: Some(pb::RandomSampling {
                num_sequences: 1,
                top_k: Some(5),
                top_p: Some(0.9),
                seed: Some(-1),
                ..Default::default()
            }),
            stopping: Some(pb::StoppingCriteria {
                max_new_tokens: 9,
                stop_token_ids: vec![10, 11],
                ignore_eos: true,
                ..Default::default()
            }),
            response: Some(pb::ResponseOptions {
                prompt_token_ids: true,
                prompt_logprobs: true,
                output_token_ids: true,
                output_logprobs: true,
                ..Default::default()
            }),
            truncate_prompt_tokens: 2,
            ..request(&[1, 2, 3])
        })
        .expect("valid");
        let params = call.request.params();
        assert_eq!(call.request.adapter().adapter_name().map(AdapterName::as_str), Some("meow@3"));
        assert_eq!((params.temperature(), params.top_k(), params.top_p()), (0.7, Some(5), 0.9));
        assert_eq!(params.seed(), Some(u64::MAX), "int64 -1 keeps its bits");
        assert_eq!((params.max_tokens(), params.stop_token_ids(), params.ignore_eos()), (9, &[10, 11][..], true));
        assert_eq!(&call.request.prompt()[..], &[2, 3], "truncate_prompt_tokens keeps the last tokens");
        assert!(call.request.include_prompt_logprobs());
        assert!(call.options.output_token_ids && call.options.output_logprobs && call.options.prompt_token_ids);
    }

    #[test]
    fn min_p_penalties_min_tokens_and_top_n_candidates_reach_the_sampler() {
        let call = parse(pb::GenerateRequest {
            temperature: Some(0.7),
            sampling: Some(pb::RandomSampling { min_p: Some(0.05), ..Default::default() }),
            decoding: Some(pb::DecodingParameters {
                repetition_penalty: 1.2,
                presence_penalty: 0.5,
                frequency_penalty: -0.5,
                ..Default::default()
            }),
            stopping: Some(pb::StoppingCriteria { max_new_tokens: 8, min_new_tokens: 2, ..Default::default() }),
            response: Some(pb::ResponseOptions {
                output_candidates: Some(pb::CandidateTokens { select: Some(pb::candidate_tokens::Select::TopN(3)) }),
                prompt_candidates: Some(pb::CandidateTokens { select: Some(pb::candidate_tokens::Select::TopN(2)) }),
                ..Default::default()
            }),
            ..request(&[1, 2, 3])
        })
        .expect("valid");
        let params = call.request.params();
        assert_eq!((params.min_p(), params.repetition_penalty()), (0.05, 1.2));
        assert_eq!((params.presence_penalty(), params.frequency_penalty()), (0.5, -0.5));
        assert_eq!((params.min_tokens(), params.top_logprobs()), (2, 3));
        assert_eq!(call.request.prompt_top_logprobs(), Some(2));
        assert!(call.request.include_prompt_logprobs(), "prompt candidates need the prompt's logprobs");
        assert_eq!((call.options.output_top_n, call.options.prompt_top_n), (3, Some(2)));
        let unset = parse(request(&[1])).expect("valid");
        assert_eq!(unset.request.params().repetition_penalty(), 1.0, "0 is the proto's unset: no penalty");
    }

    #[test]
    fn what_this_worker_cannot_honour_is_refused_by_field() {
        let cases: Vec<(pb::GenerateRequest, &str)> = vec![
            (pb::GenerateRequest { prompt: None, ..request(&[1]) }, "prompt"),
            (
                pb::GenerateRequest { prompt: Some(pb::generate_request::Prompt::Text("hi".into())), ..request(&[1]) },
                "prompt.text",
            ),
            (
                pb::GenerateRequest {
                    sampling: Some(pb::RandomSampling { num_sequences: 2, ..Default::default() }),
                    ..request(&[1])
                },
                "sampling.num_sequences",
            ),
            (
                pb::GenerateRequest {
                    decoding: Some(pb::DecodingParameters { logit_bias: [(1, 2.0)].into(), ..Default::default() }),
                    ..request(&[1])
                },
                "decoding.logit_bias",
            ),
            (
                pb::GenerateRequest {
                    stopping: Some(pb::StoppingCriteria { stop_strings: vec!["x".into()], ..Default::default() }),
                    ..request(&[1])
                },
                "stopping.stop_strings",
            ),
            (
                pb::GenerateRequest {
                    response: Some(pb::ResponseOptions {
                        output_candidates: Some(pb::CandidateTokens {
                            select: Some(pb::candidate_tokens::Select::All(true)),
                        }),
                        ..Default::default()
                    }),
                    ..request(&[1])
                },
                "response.output_candidates",
            ),
            (request(&[300]), "prompt.token_ids"),
            (pb::GenerateRequest { temperature: Some(-1.0), ..request(&[1]) }, "temperature"),
            (
                pb::GenerateRequest {
                    stopping: Some(pb::StoppingCriteria { max_new_tokens: 100, ..Default::default() }),
                    ..request(&[1])
                },
                "stopping.max_new_tokens",
            ),
            (pb::GenerateRequest { lora_name: "two words".into(), ..request(&[1]) }, "lora_name"),
            // The probe's findings: these were named `request`.
            (
                pb::GenerateRequest {
                    sampling: Some(pb::RandomSampling { min_p: Some(1.5), ..Default::default() }),
                    ..request(&[1])
                },
                "sampling.min_p",
            ),
            (
                pb::GenerateRequest {
                    decoding: Some(pb::DecodingParameters { repetition_penalty: -1.0, ..Default::default() }),
                    ..request(&[1])
                },
                "decoding.repetition_penalty",
            ),
            (
                pb::GenerateRequest {
                    decoding: Some(pb::DecodingParameters { presence_penalty: 2.5, ..Default::default() }),
                    ..request(&[1])
                },
                "decoding.presence_penalty",
            ),
            (
                pb::GenerateRequest {
                    decoding: Some(pb::DecodingParameters { frequency_penalty: -3.0, ..Default::default() }),
                    ..request(&[1])
                },
                "decoding.frequency_penalty",
            ),
            (
                pb::GenerateRequest {
                    stopping: Some(pb::StoppingCriteria { max_new_tokens: 4, min_new_tokens: 5, ..Default::default() }),
                    ..request(&[1])
                },
                "stopping.min_new_tokens",
            ),
            (
                pb::GenerateRequest {
                    response: Some(pb::ResponseOptions {
                        output_candidates: Some(pb::CandidateTokens {
                            select: Some(pb::candidate_tokens::Select::TopN(21)),
                        }),
                        ..Default::default()
                    }),
                    ..request(&[1])
                },
                "response.output_candidates.top_n",
            ),
            (
                pb::GenerateRequest {
                    response: Some(pb::ResponseOptions {
                        prompt_candidates: Some(pb::CandidateTokens {
                            select: Some(pb::candidate_tokens::Select::TopN(21)),
                        }),
                        ..Default::default()
                    }),
                    ..request(&[1])
                },
                "response.prompt_candidates.top_n",
            ),
        ];
        for (request, field) in cases {
            match parse(request) {
                Err(WorkerError::InvalidArgument { field: got, .. }) => assert_eq!(got, field),
                other => panic!("expected an error on {field}, got {other:?}"),
            }
        }
        let other_model = pb::GenerateRequest { model: "gpt".into(), ..request(&[1]) };
        assert!(matches!(parse(other_model), Err(WorkerError::ModelNotFound(model)) if model == "gpt"));
        assert!(parse(pb::GenerateRequest { model: "demo".into(), ..request(&[1]) }).is_ok());
    }
}
