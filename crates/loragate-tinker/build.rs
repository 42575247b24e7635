//! Compiles `proto/tinker_public/sample_response.proto` (our own copy of the Tinker SDK's `SampleResponse` schema)
//! with protox (pure Rust, no system `protoc`) into prost messages in `OUT_DIR`. No services: messages only.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let proto_file = proto_root.join("tinker_public/sample_response.proto");
    println!("cargo:rerun-if-changed={}", proto_file.display());

    let descriptors = protox::compile([&proto_file], [&proto_root])?;
    tonic_prost_build::configure().build_client(false).build_server(false).compile_fds(descriptors)?;
    Ok(())
}
