//! Compiles etcd's v3 API (`proto/`, the files of the `etcd-client` crate 0.21.1, etcd v3.5's API) with protox (pure
//! Rust, no system `protoc`) into gRPC clients. Only etcd's own packages are generated; the HTTP-gateway and OpenAPI
//! annotations they import are read, not generated.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("proto");
    println!("cargo:rerun-if-changed={}", proto_root.display());
    let mut descriptors = protox::compile([proto_root.join("etcd/api/etcdserverpb/rpc.proto")], [&proto_root])?;
    descriptors.file.retain(|file| file.name().starts_with("etcd/"));
    tonic_prost_build::configure().build_client(true).build_server(false).compile_fds(descriptors)?;
    Ok(())
}
