//! The body of a push (`PUT /v1/lora_adapters/{name}`, on a server and on an agent): `multipart/form-data` with two
//! parts in order, `adapter_config.json` then `adapter_model.safetensors` (what `curl -F` and Python's
//! `requests`/`httpx` send), read part by part: the configuration whole (it is small), the weights chunk by chunk
//! into whatever receives them, never held whole.

use axum::extract::Request;
use http::header::CONTENT_TYPE;
use loragate_core::adapter_store::{MAX_CONFIG_BYTES, Receiver};
use loragate_core::{CONFIG_FILE, CoreError, PushHeader, PushUpload, WEIGHTS_FILE};

use crate::error::HttpError;

/// What takes a push's weights as they arrive: the coordinator's upload on a server, the store's receiver on an agent.
pub(crate) trait WeightsSink {
    /// Takes the next bytes of `adapter_model.safetensors`.
    async fn write(&mut self, chunk: &[u8]) -> Result<(), CoreError>;
}

impl WeightsSink for PushUpload {
    async fn write(&mut self, chunk: &[u8]) -> Result<(), CoreError> {
        PushUpload::write(self, chunk).await
    }
}

impl WeightsSink for Receiver {
    async fn write(&mut self, chunk: &[u8]) -> Result<(), CoreError> {
        Receiver::write(self, chunk).await
    }
}

/// A push's multipart body, read in order: [`PushBody::header`], then [`PushBody::weights_into`].
pub(crate) struct PushBody {
    parts: multer::Multipart<'static>,
}

impl PushBody {
    /// The body of `request`; anything but `multipart/form-data` with a boundary is refused (415).
    pub(crate) fn of(request: Request) -> Result<Self, HttpError> {
        let content_type = request.headers().get(CONTENT_TYPE).and_then(|value| value.to_str().ok()).map(str::to_owned);
        let boundary = content_type
            .as_deref()
            .and_then(|value| multer::parse_boundary(value).ok())
            .ok_or_else(|| HttpError::UnsupportedMediaType(content_type.clone()))?;
        Ok(Self { parts: multer::Multipart::new(request.into_body().into_data_stream(), boundary) })
    }

    /// Reads the `adapter_config.json` part (at most [`MAX_CONFIG_BYTES`]) and parses it, with the declared
    /// `sha256` of the weights, into the push's declarations.
    pub(crate) async fn header(&mut self, sha256: &str) -> Result<PushHeader, HttpError> {
        let mut config = self.next_part(CONFIG_FILE).await?;
        let mut config_bytes = Vec::new();
        while let Some(chunk) = config.chunk().await.map_err(multipart_error)? {
            if config_bytes.len() + chunk.len() > MAX_CONFIG_BYTES {
                return Err(HttpError::invalid(CONFIG_FILE, "is over 1 MiB"));
            }
            config_bytes.extend_from_slice(&chunk);
        }
        PushHeader::parse(config_bytes, sha256, None).map_err(HttpError::control)
    }

    /// Feeds the `adapter_model.safetensors` part to `sink` as it arrives, then checks that no part follows.
    pub(crate) async fn weights_into(mut self, sink: &mut impl WeightsSink) -> Result<(), HttpError> {
        let mut weights = self.next_part(WEIGHTS_FILE).await?;
        while let Some(chunk) = weights.chunk().await.map_err(multipart_error)? {
            sink.write(&chunk).await.map_err(HttpError::control)?;
        }
        // A part must be dropped before the next one is read.
        drop(weights);
        if let Some(extra) = self.parts.next_field().await.map_err(multipart_error)? {
            let extra = extra.name().unwrap_or("(unnamed)").to_owned();
            return Err(HttpError::invalid(
                extra,
                "a push has two parts: adapter_config.json, adapter_model.safetensors",
            ));
        }
        Ok(())
    }

    /// The next part, which must be named `expected`.
    async fn next_part(&mut self, expected: &'static str) -> Result<multer::Field<'static>, HttpError> {
        let Some(field) = self.parts.next_field().await.map_err(multipart_error)? else {
            return Err(HttpError::MissingField(expected));
        };
        match field.name() {
            Some(name) if name == expected => Ok(field),
            other => Err(HttpError::invalid(
                other.unwrap_or("(unnamed part)").to_owned(),
                format!(
                    "expected the part {expected}: a push sends adapter_config.json, then adapter_model.safetensors"
                ),
            )),
        }
    }
}

/// A body that is not well-formed multipart (or could not be read) is refused naming what was being read.
fn multipart_error(err: multer::Error) -> HttpError {
    HttpError::invalid("body", format!("not a readable multipart/form-data body: {err}"))
}
