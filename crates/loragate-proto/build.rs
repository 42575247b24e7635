//! Compiles `proto/loragate/v1/loragate.proto` with protox (pure Rust, no system `protoc`) into `OUT_DIR`, and
//! writes the encoded descriptor set next to it for gRPC reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let proto_file = proto_root.join("loragate/v1/loragate.proto");
    println!("cargo:rerun-if-changed={}", proto_root.display());

    let descriptors = protox::compile([&proto_file], [&proto_root])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("loragate_descriptor.bin"), prost::Message::encode_to_vec(&descriptors))?;
    // Our codec: prost's, with undecodable messages reported as INVALID_ARGUMENT (see src/codec.rs).
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::LoragateCodec")
        // A push's chunks decode as `Bytes`, slices of the decode buffer, not a copy each: the receiver copies them
        // into its write batches anyway, and the buffer, no longer shared, is reused for the next message.
        .bytes(".loragate.v1.PushLoraAdapterRequest")
        .compile_fds(descriptors)?;
    Ok(())
}
