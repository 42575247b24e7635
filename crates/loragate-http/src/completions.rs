//! `POST /v1/completions`, OpenAI-compatible with vLLM's extensions. A request for a paused adapter is held, parsed,
//! by the core's gate in `Coordinator::sample` (its body is gone by then).
//!
//! Data flow: the JSON body → [`CompletionBody`] (this API's own fields) and the shared
//! [`VllmSampling`](crate::sampling::VllmSampling) → one [`PromptSpec`] per prompt (text encoded by the
//! [`TextCodec`](crate::TextCodec)) →
//! [`sampling::start`] (the core validates and samples each, holding it at a paused adapter's gate) → the shared
//! output deltas → [`CompletionRender`]: one JSON response, or server-sent events.
//!
//! A batch of prompts is one core request per prompt, each with its own request id (`<id>-<i>`), so aborts and the
//! gate apply per prompt; choice `index` is `prompt index × n + sample index`, as OpenAI orders them.

mod request;
mod response;

use axum::extract::{Extension, State};
use axum::response::Response;
use http::HeaderMap;
use loragate_core::{Principal, RequestId};

use self::request::{CompletionBody, Prompt};
use self::response::{CompletionOptions, CompletionRender, EchoedPrompt};
use crate::error::{Api, HttpError};
use crate::front::HttpFront;
use crate::json_body::Parsed;
use crate::output::{REQUEST_ID_HEADER, ResponseHeader, StreamOptions, respond, unix_now};
use crate::sampling::{self, PromptSpec, SamplingPlan, VllmRequest, refuse_unless_neutral};
use crate::state::AppState;

/// A completion body as it arrives (any other key is refused).
pub(crate) type CompletionRequest = VllmRequest<CompletionBody>;

/// A completion request, parsed and ready to start.
struct Plan {
    prompts: Vec<PromptSpec>,
    sampling: SamplingPlan,
    model: String,
    echo: bool,
    with_logprobs: bool,
    as_token_ids: bool,
    prompt_logprobs: bool,
    return_token_ids: bool,
    stream: bool,
    include_usage: bool,
}

impl Plan {
    fn parse(front: &HttpFront, request: CompletionRequest, base_id: &str) -> Result<Self, HttpError> {
        let CompletionRequest { body, fields } = request;
        refuse_unless_neutral("suffix", body.suffix.as_ref(), &[serde_json::json!("")], "nothing is inserted")?;
        let model = front.model_or_base(body.model)?;
        let lora_name = front.lora_name_for(&model).to_owned();
        let prompts = body.prompt.ok_or(HttpError::MissingField("prompt"))?.0;
        let add_special_tokens = body.add_special_tokens.unwrap_or(true);
        let echo = body.echo.unwrap_or(false);
        let explicit_prompt_logprobs = fields.prompt_logprobs;
        let mut sampling = fields.into_plan("")?;
        // With echo, the echoed prompt's logprobs need the prompt's logprobs (with as many alternatives).
        let prompt_alternatives = explicit_prompt_logprobs.or(body.logprobs.filter(|_| echo));
        sampling.params.top_logprobs = body.logprobs.unwrap_or(0);
        sampling.params.prompt_top_logprobs = prompt_alternatives;
        sampling.params.cache_salt = body.cache_salt;
        sampling.text.with_logprobs = body.logprobs.is_some();
        sampling.params.min_lora_version = body.min_lora_version.unwrap_or(0);
        let ids = prompt_request_ids(base_id, prompts.len());
        let prompts = prompts
            .into_iter()
            .zip(ids)
            .map(|(prompt, request_id)| {
                let token_ids = match prompt {
                    Prompt::Text(text) => front
                        .codec()
                        .encode(&text, add_special_tokens)
                        .map_err(|reason| HttpError::invalid("prompt", reason))?,
                    Prompt::TokenIds(token_ids) => token_ids,
                };
                Ok(PromptSpec { request_id, lora_name: lora_name.clone(), token_ids })
            })
            .collect::<Result<_, HttpError>>()?;
        Ok(Self {
            prompts,
            sampling,
            model,
            echo,
            with_logprobs: body.logprobs.is_some(),
            as_token_ids: body.return_tokens_as_token_ids.unwrap_or(false),
            prompt_logprobs: explicit_prompt_logprobs.is_some(),
            return_token_ids: body.return_token_ids.unwrap_or(false),
            stream: body.stream.unwrap_or(false),
            include_usage: StreamOptions::wants_usage(body.stream_options),
        })
    }
}

/// The request ids of `count` prompts: the caller's (or, empty, the core's own) for one prompt; `<base>-<i>` for a
/// batch, with a fresh base if the caller gave none.
pub(crate) fn prompt_request_ids(base_id: &str, count: usize) -> Vec<String> {
    if count == 1 {
        return vec![base_id.to_owned()];
    }
    let base = if base_id.is_empty() { RequestId::generate().to_string() } else { base_id.to_owned() };
    (0..count).map(|index| format!("{base}-{index}")).collect()
}

/// The id a multi-prompt response reports: the ids' common base (`<base>-<i>` → `<base>`), or the one id.
pub(crate) fn response_request_id(request_ids: &[String]) -> String {
    match request_ids {
        [one] => one.clone(),
        [first, ..] => first.rsplit_once('-').map_or_else(|| first.clone(), |(base, _)| base.to_owned()),
        [] => String::new(),
    }
}

/// The handler of `POST /v1/completions`.
pub(crate) async fn create_completion(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    headers: HeaderMap,
    Parsed(request): Parsed<CompletionRequest>,
) -> Result<Response, HttpError> {
    let front = state.front();
    let created = unix_now();
    // The request is consumed here: only its plan (no part of the body) waits at the gate.
    let plan = Plan::parse(front, request, &caller_request_id(&headers)?)?;
    let started = sampling::start(front, &caller, plan.prompts, plan.sampling, Api::Completions).await?;
    let request_id = response_request_id(&started.request_ids);
    let codec = front.codec().clone();
    let echo = plan.echo.then(|| started.prompts.iter().map(|prompt| EchoedPrompt::new(&*codec, prompt)).collect());
    let options = CompletionOptions {
        with_logprobs: plan.with_logprobs,
        as_token_ids: plan.as_token_ids,
        echo,
        prompt_logprobs: plan.prompt_logprobs,
        // vLLM returns the prompt's ids with return_token_ids, and streamed also with echo.
        prompt_token_ids: (plan.return_token_ids || (plan.echo && plan.stream)).then(|| started.prompts.clone()),
        include_usage: plan.include_usage,
        eos_token_ids: front.coordinator().model_info().eos_token_ids.clone(),
    };
    let header = ResponseHeader { id: format!("cmpl-{request_id}"), created, model: plan.model };
    let render = CompletionRender::new(header, codec, options, started.prompt_tokens());
    respond(started.parts, render, plan.stream, Some(&request_id)).await
}

/// The caller's `X-Request-Id`, or empty to have the core make one.
pub(crate) fn caller_request_id(headers: &HeaderMap) -> Result<String, HttpError> {
    match headers.get(REQUEST_ID_HEADER) {
        None => Ok(String::new()),
        Some(value) => {
            value.to_str().map(str::to_owned).map_err(|_| HttpError::invalid("X-Request-Id", "must be visible ASCII"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_gets_one_id_per_prompt_under_one_base() {
        assert_eq!(prompt_request_ids("r", 1), vec!["r"]);
        assert_eq!(prompt_request_ids("", 1), vec![""], "the core makes the id of a single prompt");
        assert_eq!(prompt_request_ids("r", 3), vec!["r-0", "r-1", "r-2"]);
        let generated = prompt_request_ids("", 2);
        assert!(generated[0].ends_with("-0") && generated[1].ends_with("-1") && generated[0].len() > 2);
        assert_eq!(response_request_id(&prompt_request_ids("base-x", 2)), "base-x");
        assert_eq!(response_request_id(&["solo-1".to_owned()]), "solo-1");
    }
}
