//! Pushing an adapter's weights over the connection (`PushLoraAdapter`), with no shared filesystem: the header (the
//! name, `adapter_config.json`, the SHA-256 and size of `adapter_model.safetensors`), then the safetensors bytes in
//! chunks of [`PUSH_CHUNK_BYTES`]. The bytes come from a PEFT directory on this machine, read once, as they are
//! sent, or from tensors in memory, serialized to safetensors here. Tensors' SHA-256 is computed before the header
//! goes out, so the server checks every byte it stores against it. A file's is computed as it is read and sent (the
//! header declares its size only): a separate first pass over the file would delay the first byte by a whole read
//! and hash; the file is instead checked unchanged (size, modification time, inode) before its last chunk goes out,
//! so a file rewritten or replaced meanwhile is never installed (the server refuses the short body). Either way the
//! SHA-256 the server answers having stored must be the one this client computed.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use loragate_proto::v1::push_lora_adapter_request::Part;
use loragate_proto::v1::{PushLoraAdapterHeader, PushLoraAdapterRequest, PushLoraAdapterResponse};

use crate::control::SwapOptions;
use crate::error::ClientError;
use crate::swap::TrainerClient;

mod payload;

/// How many safetensors bytes one message of a push carries.
pub const PUSH_CHUNK_BYTES: usize = 1 << 20;

/// The element type of a pushed tensor (the dtypes LoRA weights come in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorDtype {
    /// 32-bit IEEE float (`F32`).
    F32,
    /// 16-bit IEEE float (`F16`).
    F16,
    /// bfloat16 (`BF16`).
    BF16,
}

impl TensorDtype {
    /// The dtype a name means: safetensors' (`F32`, `F16`, `BF16`), numpy's and torch's (`float32`, `float16`,
    /// `bfloat16`, `half`), any case; `None` for any other.
    pub fn parse(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().trim_start_matches("torch.") {
            "f32" | "float32" | "float" => Some(Self::F32),
            "f16" | "float16" | "half" => Some(Self::F16),
            "bf16" | "bfloat16" => Some(Self::BF16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
        }
    }
}

/// One tensor of an adapter held in memory: its name as in `adapter_model.safetensors`
/// (`base_model.model.….lora_A.weight`), dtype, shape and little-endian, C-ordered bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// The tensor's name.
    pub name: String,
    /// Its element type.
    pub dtype: TensorDtype,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its elements, little-endian, row-major: `shape`'s product times the dtype's size bytes.
    pub data: Vec<u8>,
}

/// The weights a push sends.
#[derive(Clone, Debug, PartialEq)]
pub enum AdapterPayload {
    /// A PEFT directory on this machine (`adapter_config.json`, `adapter_model.safetensors`); the safetensors file
    /// is streamed as it is read, never held whole.
    Directory(PathBuf),
    /// Tensors in memory and the adapter's `adapter_config.json` text; serialized to safetensors here.
    Tensors {
        /// The adapter's `adapter_config.json` (PEFT), as text.
        config_json: String,
        /// The tensors.
        tensors: Vec<Tensor>,
    },
}

impl TrainerClient {
    /// Pushes a new version of `lora_name` (a name not loaded yet is loaded) and has the server serve it as
    /// `SwapLoraAdapter` would, pausing as `options` say. Returns the server's answer: the new `version`, the
    /// `sha256` it stored (checked against the one this client computed), and what the swap's pause did.
    pub async fn push_adapter(
        &self,
        lora_name: &str,
        payload: AdapterPayload,
        options: SwapOptions,
    ) -> Result<PushLoraAdapterResponse, ClientError> {
        let body = payload::Body::prepare(payload).await?;
        let declared = body.sha256.clone();
        let header = PushLoraAdapterHeader {
            lora_name: lora_name.to_owned(),
            adapter_config_json: body.config_json.clone(),
            sha256: declared.clone().unwrap_or_default(),
            total_bytes: body.total_bytes,
            mode: options.mode.into(),
            kv_policy: options.kv_policy.into(),
        };
        let read_failure = Arc::new(Mutex::new(None));
        let streamed = Arc::new(Mutex::new(None));
        let messages =
            futures::stream::once(async move { PushLoraAdapterRequest { part: Some(Part::Header(header)) } }).chain(
                body.chunks(read_failure.clone(), streamed.clone())
                    .map(|chunk| PushLoraAdapterRequest { part: Some(Part::Chunk(chunk)) }),
            );
        let answer = self.control.clone().push_lora_adapter(messages).await;
        // A file that failed to read (or changed) mid-push ended the stream early (the server refuses the short
        // body): report the cause, not the refusal.
        if let Some(failure) = read_failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
            return Err(failure);
        }
        let answer = answer.map_err(ClientError::Rejected)?.into_inner();
        let computed = declared.or_else(|| streamed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
        let Some(sha256) = computed else {
            return Err(ClientError::Protocol("the server answered a push whose file was not sent whole".to_owned()));
        };
        if !answer.sha256.is_empty() && !answer.sha256.eq_ignore_ascii_case(&sha256) {
            return Err(ClientError::Protocol(format!(
                "the server stored sha256 {} for a push of sha256 {sha256}",
                answer.sha256
            )));
        }
        Ok(answer)
    }
}

#[cfg(test)]
mod tests;
