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
use crate::front::HttpFront;
use crate::json_body::Parsed;
use crate::output::{ResponseHeader, StreamOptions, respond, unix_now};
use crate::sampling::{self, PromptSpec, SamplingPlan, VllmRequest, refuse_unless_neutral};
use crate::state::AppState;

/// How a conversation is rendered, as the chat and tokenize endpoints take it (their fields of the same names);
/// absent fields get vLLM's defaults in [`chat_prompt`].
pub(crate) struct ChatRendering<'a> {
    /// End with the template's opening of an assistant turn (default: yes).
    pub(crate) add_generation_prompt: Option<bool>,
    /// Tool definitions handed to the template.
    pub(crate) tools: Option<&'a Value>,
    /// Extra template variables (default: none).
    pub(crate) chat_template_kwargs: Option<Map<String, Value>>,
    /// Add the tokenizer's special tokens around the rendered text (default: no; the template writes its own).
    pub(crate) add_special_tokens: Option<bool>,
}

/// A conversation rendered with the model's chat template and encoded: the prompt's token ids.
pub(crate) fn chat_prompt(
    front: &HttpFront,
    messages: Vec<Value>,
    rendering: ChatRendering<'_>,
) -> Result<Vec<u32>, HttpError> {
    let add_generation_prompt = rendering.add_generation_prompt.unwrap_or(true);
    let kwargs = rendering.chat_template_kwargs.unwrap_or_default();
    let add_special_tokens = rendering.add_special_tokens.unwrap_or(false);
    let template = front.chat_template().ok_or_else(|| {
        HttpError::invalid(
            "messages",
            "this model has no usable chat template (none in its chat_template.jinja, its tokenizer_config.json or \
             its GGUF metadata, or one that did not compile: see the start-up log), so it serves completions only",
        )
    })?;
    let messages = normalize_messages(messages).map_err(|reason| HttpError::invalid("messages", reason))?;
    let text = template
        .render(&messages, add_generation_prompt, rendering.tools, &kwargs)
        .map_err(|reason| HttpError::invalid("messages", format!("the chat template refused them: {reason}")))?;
    front.codec().encode(&text, add_special_tokens).map_err(|reason| HttpError::invalid("messages", reason))
}

/// A chat body as it arrives (any other key is refused).
pub(crate) type ChatRequest = VllmRequest<ChatBody>;

/// A chat request, rendered, encoded and ready to start: nothing of its body is left.
struct Plan {
    prompt: PromptSpec,
    sampling: SamplingPlan,
    model: String,
    options: ChatOptions,
    stream: bool,
}

impl Plan {
    fn parse(front: &HttpFront, request: ChatRequest, request_id: String) -> Result<Self, HttpError> {
        let ChatRequest { body, mut fields } = request;
        refuse_unless_neutral(
            "response_format",
            body.response_format.as_ref(),
            &[json!({"type": "text"})],
            "constrained decoding is not implemented",
        )?;
        refuse_unless_neutral(
            "tool_choice",
            body.tool_choice.as_ref(),
            &[json!("none"), json!("auto")],
            "no tool call is forced",
        )?;
        refuse_unless_neutral("chat_template", body.chat_template.as_ref(), &[], "the model's own template is used")?;
        refuse_unless_neutral(
            "continue_final_message",
            body.continue_final_message.as_ref(),
            &[json!(false)],
            "a new assistant turn is always started",
        )?;
        let model = front.model_or_base(body.model)?;
        let messages = body.messages.ok_or(HttpError::MissingField("messages"))?;
        let rendering = ChatRendering {
            add_generation_prompt: body.add_generation_prompt,
            tools: body.tools.as_ref(),
            chat_template_kwargs: body.chat_template_kwargs,
            add_special_tokens: body.add_special_tokens,
        };
        let token_ids = chat_prompt(front, messages, rendering)?;
        fields.set_max_tokens(body.max_completion_tokens);
        let with_logprobs = body.logprobs.unwrap_or(false);
        if !with_logprobs && body.top_logprobs.is_some_and(|k| k > 0) {
            return Err(HttpError::invalid("top_logprobs", "needs logprobs: true"));
        }
        let mut sampling = fields.into_plan("")?;
        sampling.params.top_logprobs = if with_logprobs { body.top_logprobs.unwrap_or(0) } else { 0 };
        sampling.params.cache_salt = body.cache_salt;
        sampling.text.with_logprobs = with_logprobs;
        sampling.params.min_lora_version = body.min_lora_version.unwrap_or(0);
        let return_token_ids = body.return_token_ids.unwrap_or(false);
        let options = ChatOptions {
            with_logprobs,
            as_token_ids: body.return_tokens_as_token_ids.unwrap_or(false),
            prompt_token_ids: return_token_ids.then(|| token_ids.clone()),
            include_usage: StreamOptions::wants_usage(body.stream_options),
            eos_token_ids: front.coordinator().model_info().eos_token_ids.clone(),
        };
        let prompt = PromptSpec { request_id, lora_name: front.lora_name_for(&model).to_owned(), token_ids };
        Ok(Self { prompt, sampling, model, options, stream: body.stream.unwrap_or(false) })
    }
}

/// The handler of `POST /v1/chat/completions`.
pub(crate) async fn create_chat_completion(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    headers: HeaderMap,
    Parsed(request): Parsed<ChatRequest>,
) -> Result<Response, HttpError> {
    let front = state.front();
    let created = unix_now();
    // The request is consumed here: only its plan (no part of the body) waits at the gate.
    let plan = Plan::parse(front, request, caller_request_id(&headers)?)?;
    let started = sampling::start(front, &caller, vec![plan.prompt], plan.sampling, Api::Chat).await?;
    let request_id = started.request_ids[0].clone();
    let header = ResponseHeader { id: format!("chatcmpl-{request_id}"), created, model: plan.model };
    let render = ChatRender::new(header, front.codec().clone(), plan.options, started.prompt_tokens());
    respond(started.parts, render, plan.stream, Some(&request_id)).await
}
