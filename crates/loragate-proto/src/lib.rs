//! The `loragate.v1` gRPC contract, generated from `proto/loragate/v1/loragate.proto` at build time.
//!
//! Everything outside clients rely on lives here: the messages, the `LoraControl` and `Sampler` clients and servers,
//! and [`FILE_DESCRIPTOR_SET`] for gRPC reflection. The proto file is the documentation of every field.
//!
//! ```
//! use loragate_proto::v1::{SampleRequest, SamplingParams};
//!
//! let request = SampleRequest {
//!     lora_name: "meow".into(),
//!     prompt_token_ids: b"Make a noise.".iter().map(|&b| u32::from(b)).collect(),
//!     sampling_params: Some(SamplingParams { max_tokens: Some(16), ..Default::default() }),
//!     ..Default::default()
//! };
//! assert_eq!(request.num_samples, 0); // 0 means 1
//! ```

pub mod codec;

/// Generated code of the `loragate.v1` package.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod v1 {
    tonic::include_proto!("loragate.v1");
}

/// The encoded `FileDescriptorSet` of `loragate.v1`, for `tonic-reflection`.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/loragate_descriptor.bin"));
