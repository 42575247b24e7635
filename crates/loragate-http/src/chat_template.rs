//! Chat templates: the Jinja template a model's `tokenizer_config.json` (or `chat_template.jinja`) ships, rendered
//! with [`minijinja`] the way Hugging Face's servers render it (`trim_blocks`, `lstrip_blocks`, loop controls,
//! Python string methods, `raise_exception`, `tojson`), over `messages`, `add_generation_prompt`, `bos_token`,
//! `eos_token`, `tools` and the request's `chat_template_kwargs`.

use std::path::{Path, PathBuf};

use minijinja::value::Serde;
use minijinja::{Environment, ErrorKind};
use serde_json::{Map, Value};

/// The name the template is registered under.
const TEMPLATE: &str = "chat";

/// A model's chat template, compiled once.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bos_token", &self.bos_token).field("eos_token", &self.eos_token).finish()
    }
}

/// Why a chat template could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `tokenizer_config.json` is not the JSON expected.
    #[error("tokenizer_config.json: {0}")]
    Config(String),
    /// The template does not compile.
    #[error("the chat template does not compile: {0}")]
    Template(String),
}

impl ChatTemplate {
    /// Compiles `source`, with the special tokens it may name.
    pub fn new(
        source: impl Into<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|err| ChatTemplateError::Template(err.to_string()))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned(TEMPLATE, source.into()).map_err(|err| ChatTemplateError::Template(err.to_string()))?;
        Ok(Self { env, bos_token: bos_token.unwrap_or_default(), eos_token: eos_token.unwrap_or_default() })
    }

    /// The template of a `tokenizer_config.json`'s text, if it has one: `chat_template` as a string, or the
    /// `default` entry of a list of named templates; `bos_token` and `eos_token` as strings or added-token objects.
    pub fn from_tokenizer_config(json: &str) -> Result<Option<Self>, ChatTemplateError> {
        let config: Value = serde_json::from_str(json).map_err(|err| ChatTemplateError::Config(err.to_string()))?;
        let source = match config.get("chat_template") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(source)) => source.clone(),
            Some(Value::Array(named)) => {
                let default = named.iter().find(|entry| entry.get("name").and_then(Value::as_str) == Some("default"));
                match default.and_then(|entry| entry.get("template")).and_then(Value::as_str) {
                    Some(source) => source.to_owned(),
                    None => {
                        return Err(ChatTemplateError::Config("chat_template lists no \"default\" template".into()));
                    }
                }
            }
            Some(other) => {
                return Err(ChatTemplateError::Config(format!("chat_template is neither text nor a list: {other}")));
            }
        };
        Self::new(source, special_token(&config, "bos_token"), special_token(&config, "eos_token")).map(Some)
    }

    /// The template of a Hugging Face model directory: `chat_template.jinja` if present, else `tokenizer_config.json`'s
    /// `chat_template` (special tokens from `tokenizer_config.json` either way). `None` if it has neither.
    pub fn from_model_dir(dir: &Path) -> Result<Option<Self>, ChatTemplateError> {
        let read = |name: &str| -> Result<Option<String>, ChatTemplateError> {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) => Ok(Some(text)),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(ChatTemplateError::Read { path, source }),
            }
        };
        let config = read("tokenizer_config.json")?;
        match read("chat_template.jinja")? {
            Some(source) => {
                let config: Value = match &config {
                    Some(text) => {
                        serde_json::from_str(text).map_err(|err| ChatTemplateError::Config(err.to_string()))?
                    }
                    None => Value::Null,
                };
                Self::new(source, special_token(&config, "bos_token"), special_token(&config, "eos_token")).map(Some)
            }
            None => config.as_deref().map_or(Ok(None), Self::from_tokenizer_config),
        }
    }

    /// Renders the conversation. `messages` are OpenAI chat messages (their text parts already joined); the error is
    /// the template's own message (its `raise_exception`, or a rendering failure).
    pub(crate) fn render(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
        tools: Option<&Value>,
        kwargs: &Map<String, Value>,
    ) -> Result<String, String> {
        let mut context = kwargs.clone();
        context.insert("messages".into(), Value::Array(messages.to_vec()));
        context.insert("add_generation_prompt".into(), Value::Bool(add_generation_prompt));
        context.insert("bos_token".into(), Value::String(self.bos_token.clone()));
        context.insert("eos_token".into(), Value::String(self.eos_token.clone()));
        if let Some(tools) = tools.filter(|tools| !tools.is_null()) {
            context.insert("tools".into(), tools.clone());
        }
        let template = self.env.get_template(TEMPLATE).map_err(|err| err.to_string())?;
        template.render(minijinja::Value::from(Serde(&context))).map_err(|err| match err.detail() {
            Some(detail) if err.kind() == ErrorKind::InvalidOperation => detail.to_owned(),
            _ => err.to_string(),
        })
    }
}

/// A special token's text: a string, or an added-token object's `content`.
fn special_token(config: &Value, name: &str) -> Option<String> {
    match config.get(name)? {
        Value::String(token) => Some(token.clone()),
        Value::Object(token) => token.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

/// OpenAI chat messages as templates expect them: each an object with a string `role`; `content` a string (text
/// parts joined with newlines, as vLLM does for string-format templates) or `null`; other keys kept. Images and other
/// non-text parts are refused, naming the message.
pub(crate) fn normalize_messages(messages: Vec<Value>) -> Result<Vec<Value>, String> {
    if messages.is_empty() {
        return Err("must hold at least one message".to_owned());
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(index, message)| {
            let Value::Object(mut message) = message else {
                return Err(format!("message {index} is not an object"));
            };
            if !message.get("role").is_some_and(Value::is_string) {
                return Err(format!("message {index} has no string role"));
            }
            let content = match message.remove("content") {
                None | Some(Value::Null) => Value::Null,
                Some(Value::String(text)) => Value::String(text),
                Some(Value::Array(parts)) => Value::String(text_parts(index, parts)?),
                Some(other) => {
                    return Err(format!("message {index}: content must be text or a list of parts, got {other}"));
                }
            };
            message.insert("content".into(), content);
            Ok(Value::Object(message))
        })
        .collect()
}

fn text_parts(index: usize, parts: Vec<Value>) -> Result<String, String> {
    let texts = parts
        .into_iter()
        .map(|part| match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(text)) => Ok(text.to_owned()),
            (kind, _) => Err(format!(
                "message {index}: only text parts are supported, got {}",
                kind.unwrap_or("a part without a type")
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(texts.join("\n"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const LLAMA_LIKE: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}\
        {{ message['content'].strip() }}\n{% else %}<|{{ message['role'] }}|>{{ message['content'] }}{{ eos_token }}{% endif %}\
        {% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

    fn messages(value: Value) -> Vec<Value> {
        normalize_messages(value.as_array().expect("array").clone()).expect("valid messages")
    }

    #[test]
    fn a_template_renders_messages_special_tokens_and_the_generation_prompt() {
        let template = ChatTemplate::new(LLAMA_LIKE, Some("<s>".into()), Some("</s>".into())).expect("compiles");
        let conversation = messages(json!([
            {"role": "system", "content": "  Be brief.  "},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
        ]));
        let rendered = template.render(&conversation, true, None, &Map::new()).expect("renders");
        assert_eq!(rendered, "<s>Be brief.\n<|user|>Hi\nthere</s><|assistant|>");
        let without = template.render(&conversation, false, None, &Map::new()).expect("renders");
        assert!(!without.ends_with("<|assistant|>"));
    }

    #[test]
    fn raise_exception_and_kwargs_reach_the_template() {
        let source =
            "{% if not allowed %}{{ raise_exception('roles must alternate') }}{% endif %}{{ messages | length }}";
        let template = ChatTemplate::new(source, None, None).expect("compiles");
        let conversation = messages(json!([{"role": "user", "content": "x"}]));
        let refused = template.render(&conversation, true, None, &Map::new()).expect_err("raises");
        assert_eq!(refused, "roles must alternate");
        let kwargs: Map<String, Value> = [("allowed".to_owned(), json!(true))].into_iter().collect();
        assert_eq!(template.render(&conversation, true, None, &kwargs).expect("renders"), "1");
    }

    #[test]
    fn tokenizer_configs_give_the_template_and_its_special_tokens() {
        let config = json!({"chat_template": "{{ bos_token }}{{ eos_token }}", "bos_token": {"content": "<s>"}, "eos_token": "</s>"});
        let template = ChatTemplate::from_tokenizer_config(&config.to_string()).expect("loads").expect("has one");
        assert_eq!(template.render(&[], false, None, &Map::new()).expect("renders"), "<s></s>");
        let named =
            json!({"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]});
        let template = ChatTemplate::from_tokenizer_config(&named.to_string()).expect("loads").expect("has one");
        assert_eq!(template.render(&[], false, None, &Map::new()).expect("renders"), "d");
        assert!(ChatTemplate::from_tokenizer_config("{}").expect("loads").is_none());
        assert!(matches!(
            ChatTemplate::from_tokenizer_config(r#"{"chat_template": "{% if %}"}"#),
            Err(ChatTemplateError::Template(_))
        ));
    }

    #[test]
    fn messages_must_be_objects_with_roles_and_text() {
        for bad in [
            json!([]),
            json!(["hi"]),
            json!([{"content": "x"}]),
            json!([{"role": "user", "content": [{"type": "image_url"}]}]),
        ] {
            assert!(normalize_messages(bad.as_array().expect("array").clone()).is_err(), "{bad}");
        }
        let kept = messages(json!([{"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]}]));
        assert_eq!(kept[0]["tool_calls"][0]["id"], "1", "other keys are kept");
    }
}
