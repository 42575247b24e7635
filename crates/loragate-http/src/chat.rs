//! `POST /v1/chat/completions`, OpenAI-compatible with vLLM's extensions: `messages` are rendered with the model's
//! chat template ([`ChatTemplate`](crate::ChatTemplate)), encoded without added special tokens (the template writes
//! them), and sampled as one core request through `Coordinator::sample` — the gate that holds a request while its
//! adapter is paused. A model without a chat template answers 400 saying so.

mod request;
mod response;

use axum::extract::{Extension, State};
use axum::response::Response;
use http::HeaderMap;
use loragate_core::Principal;
use serde_json::{Map, Value, json};

use self::request::ChatBody;
use self::response::{ChatOptions, ChatRender};
use crate::chat_template::normalize_messages;
use crate::completions::caller_request_id;
use crate::error::{Api, HttpError};
use crate::json_body::{JsonValue, parse_value};
use crate::output::{ResponseHeader, StreamOptions, respond, unix_now};
use crate::sampling::{self, PromptSpec, VllmSampling, refuse_unless_neutral};
use crate::server::{AppState, HttpFront};

/// A conversation rendered with the model's chat template and encoded: the prompt's token ids.
pub(crate) fn chat_prompt(
    front: &HttpFront,
    messages: Vec<Value>,
    add_generation_prompt: bool,
    tools: Option<&Value>,
    kwargs: &Map<String, Value>,
    add_special_tokens: bool,
) -> Result<Vec<u32>, HttpError> {
    let template = front.chat_template().ok_or_else(|| {
        HttpError::invalid(
            "messages",
            "this model has no chat template (no chat_template in its tokenizer_config.json), so it serves \
             completions only",
        )
    })?;
    let messages = normalize_messages(messages).map_err(|reason| HttpError::invalid("messages", reason))?;
    let text = template
        .render(&messages, add_generation_prompt, tools, kwargs)
        .map_err(|reason| HttpError::invalid("messages", format!("the chat template refused them: {reason}")))?;
    front.codec().encode(&text, add_special_tokens).map_err(|reason| HttpError::invalid("messages", reason))
}

/// The handler of `POST /v1/chat/completions`.
pub(crate) async fn create_chat_completion(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    headers: HeaderMap,
    JsonValue(body): JsonValue,
) -> Result<Response, HttpError> {
    let front = state.front();
    let created = unix_now();
    let request: ChatBody = parse_value(&body, "")?;
    let mut fields: VllmSampling = parse_value(&body, "")?;
    refuse_unless_neutral(
        "response_format",
        request.response_format.as_ref(),
        &[json!({"type": "text"})],
        "constrained decoding is not implemented",
    )?;
    refuse_unless_neutral(
        "tool_choice",
        request.tool_choice.as_ref(),
        &[json!("none"), json!("auto")],
        "no tool call is forced",
    )?;
    refuse_unless_neutral("chat_template", request.chat_template.as_ref(), &[], "the model's own template is used")?;
    refuse_unless_neutral(
        "continue_final_message",
        request.continue_final_message.as_ref(),
        &[json!(false)],
        "a new assistant turn is always started",
    )?;
    let model = front.model_or_base(request.model)?;
    let messages = request.messages.ok_or(HttpError::MissingField("messages"))?;
    let token_ids = chat_prompt(
        front,
        messages,
        request.add_generation_prompt.unwrap_or(true),
        request.tools.as_ref(),
        &request.chat_template_kwargs.unwrap_or_default(),
        request.add_special_tokens.unwrap_or(false),
    )?;
    fields.set_max_tokens(request.max_completion_tokens);
    let with_logprobs = request.logprobs.unwrap_or(false);
    if !with_logprobs && request.top_logprobs.is_some_and(|k| k > 0) {
        return Err(HttpError::invalid("top_logprobs", "needs logprobs: true"));
    }
    let mut plan = fields.into_plan("")?;
    plan.params.top_logprobs = if with_logprobs { request.top_logprobs.unwrap_or(0) } else { 0 };
    plan.text.with_logprobs = with_logprobs;
    let prompt = PromptSpec {
        request_id: caller_request_id(&headers)?,
        lora_name: front.lora_name_for(&model).to_owned(),
        token_ids,
    };
    let started = sampling::start(front, &caller, vec![prompt], plan, Api::Chat).await?;
    let request_id = started.request_ids[0].clone();
    let options = ChatOptions {
        with_logprobs,
        as_token_ids: request.return_tokens_as_token_ids.unwrap_or(false),
        prompt_token_ids: request.return_token_ids.unwrap_or(false).then(|| started.prompts[0].to_vec()),
        include_usage: StreamOptions::wants_usage(request.stream_options),
    };
    let header = ResponseHeader { id: format!("chatcmpl-{request_id}"), created, model };
    let render = ChatRender::new(header, front.codec().clone(), options, started.prompt_tokens());
    respond(started.parts, render, request.stream.unwrap_or(false), Some(&request_id)).await
}
