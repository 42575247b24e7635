//! vLLM's tokenizer endpoints: `POST /tokenize` (a `prompt`, or chat `messages` rendered with the model's chat
//! template) → `{count, max_model_len, tokens, token_strs}`, and `POST /detokenize` (`tokens`) → `{prompt}`. A
//! `model`, when given, must be the base model's served name or a loaded adapter (they share the tokenizer).

use axum::Json;
use axum::extract::State;
use loragate_core::AdapterKey;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::chat::{ChatRendering, chat_prompt};
use crate::error::{Api, HttpError};
use crate::front::HttpFront;
use crate::json_body::JsonBody;
use crate::state::AppState;

/// The body of `POST /tokenize`: a `prompt` or chat `messages` (strict: another field is a 400 naming it).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenizeBody {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<Value>>,
    /// Add the tokenizer's special tokens (default: true for a prompt, false for messages).
    add_special_tokens: Option<bool>,
    /// With messages: end with the assistant's turn opening (default true).
    add_generation_prompt: Option<bool>,
    chat_template_kwargs: Option<Map<String, Value>>,
    tools: Option<Value>,
    /// Also return each token's string in the vocabulary.
    return_token_strs: Option<bool>,
}

/// vLLM's tokenize answer.
#[derive(Debug, Serialize)]
pub(crate) struct Tokenized {
    count: usize,
    max_model_len: u32,
    tokens: Vec<u32>,
    token_strs: Option<Vec<Option<String>>>,
}

/// The body of `POST /detokenize` (strict).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DetokenizeBody {
    model: Option<String>,
    tokens: Option<Vec<u32>>,
}

/// vLLM's detokenize answer.
#[derive(Debug, Serialize)]
pub(crate) struct Detokenized {
    prompt: String,
}

/// Checks that `model`, if given, is the base model or a loaded adapter.
fn check_model(front: &HttpFront, model: Option<String>) -> Result<(), HttpError> {
    let Some(model) = model else { return Ok(()) };
    let model = front.model_or_base(Some(model))?;
    let key = AdapterKey::parse(front.lora_name_for(&model)).map_err(|err| HttpError::in_api(err, Api::Completions))?;
    front.coordinator().adapter(&key).map(|_| ()).map_err(|err| HttpError::in_api(err, Api::Completions))
}

/// `POST /tokenize`.
pub(crate) async fn tokenize(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<TokenizeBody>,
) -> Result<Json<Tokenized>, HttpError> {
    let front = state.front();
    check_model(front, body.model)?;
    let tokens = match (body.prompt, body.messages) {
        (Some(prompt), None) => front
            .codec()
            .encode(&prompt, body.add_special_tokens.unwrap_or(true))
            .map_err(|reason| HttpError::invalid("prompt", reason))?,
        (None, Some(messages)) => {
            let rendering = ChatRendering {
                add_generation_prompt: body.add_generation_prompt,
                tools: body.tools.as_ref(),
                chat_template_kwargs: body.chat_template_kwargs,
                add_special_tokens: body.add_special_tokens,
            };
            chat_prompt(front, messages, rendering)?
        }
        (Some(_), Some(_)) => return Err(HttpError::invalid("prompt", "give a prompt or messages, not both")),
        (None, None) => return Err(HttpError::MissingField("prompt")),
    };
    let token_strs = body
        .return_token_strs
        .unwrap_or(false)
        .then(|| tokens.iter().map(|&token| front.codec().token_str(token)).collect());
    let max_model_len = front.coordinator().model_info().context_length;
    Ok(Json(Tokenized { count: tokens.len(), max_model_len, tokens, token_strs }))
}

/// `POST /detokenize`.
pub(crate) async fn detokenize(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<DetokenizeBody>,
) -> Result<Json<Detokenized>, HttpError> {
    let front = state.front();
    check_model(front, body.model)?;
    let tokens = body.tokens.ok_or(HttpError::MissingField("tokens"))?;
    let vocab_size = front.coordinator().model_info().vocab_size;
    if let Some((index, token)) = tokens.iter().enumerate().find(|(_, token)| **token >= vocab_size) {
        return Err(HttpError::invalid(
            "tokens",
            format!("token {token} at index {index} is outside the vocabulary (size {vocab_size})"),
        ));
    }
    Ok(Json(Detokenized { prompt: front.codec().decode(&tokens) }))
}
