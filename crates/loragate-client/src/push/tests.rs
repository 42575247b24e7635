//! Pushes against a scripted server: the header first with the size (and, for tensors, the SHA-256) of the bytes that
//! follow in chunks, a file hashed as it is sent and never sent whole if it changed meanwhile, tensors serialized to
//! exactly the bytes of the file they came from, bad input refused before anything is sent.

use std::sync::{Arc, Mutex};

use loragate_proto::v1::{KvPolicy, PauseMode};
use sha2::{Digest, Sha256};

use super::payload::{hex, serialize};
use super::*;
use crate::scripted_server::{Script, lock, serve};

fn tensor(name: &str, shape: &[usize], seed: u8) -> Tensor {
    let len = shape.iter().product::<usize>() * 4;
    Tensor {
        name: name.into(),
        dtype: TensorDtype::F32,
        shape: shape.to_vec(),
        data: (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect(),
    }
}

/// A two-module adapter of about 2.5 MiB: more than two chunks.
fn adapter() -> Vec<Tensor> {
    vec![
        tensor("base_model.model.layers.0.q_proj.lora_B.weight", &[640, 512], 2),
        tensor("base_model.model.layers.0.q_proj.lora_A.weight", &[512, 640], 1),
        tensor("base_model.model.layers.0.v_proj.lora_A.weight", &[4, 64], 3),
    ]
}

const CONFIG: &str = r#"{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}"#;

async fn trainer(script: &Arc<Script>) -> TrainerClient {
    TrainerClient::new(serve(script.clone()).await)
}

#[tokio::test]
async fn tensors_are_pushed_as_safetensors_in_chunks_after_a_header_with_their_sha256_and_size() {
    let script = Arc::new(Script::answering(vec![]));
    let payload = AdapterPayload::Tensors { config_json: CONFIG.into(), tensors: adapter() };
    let options = SwapOptions { mode: PauseMode::Abort, kv_policy: KvPolicy::Reuse };
    let pushed = trainer(&script).await.push_adapter("policy", payload, options).await.expect("pushed");

    let received = lock(&script.pushes)[0].clone();
    let expected = serialize(&adapter()).expect("serializable");
    assert_eq!(received.bytes, expected, "the bytes sent are the serialized tensors");
    assert_eq!(pushed.version, 9);
    assert_eq!(pushed.sha256, hex(&Sha256::digest(&expected)));
    assert_eq!(received.header.sha256, pushed.sha256, "the header carried the sha256 the server checked");
    assert_eq!(received.header.total_bytes, expected.len() as u64);
    assert_eq!(received.header.lora_name, "policy");
    assert_eq!(received.header.adapter_config_json, CONFIG);
    assert_eq!((received.header.mode(), received.header.kv_policy()), (PauseMode::Abort, KvPolicy::Reuse));
    assert!(received.chunk_sizes.len() >= 3, "{:?}", received.chunk_sizes);
    assert!(
        received.chunk_sizes.iter().all(|&size| size > 0 && size <= PUSH_CHUNK_BYTES),
        "{:?}",
        received.chunk_sizes
    );

    let parsed = safetensors::SafeTensors::deserialize(&received.bytes).expect("valid safetensors");
    for original in adapter() {
        let view = parsed.tensor(&original.name).expect("every tensor is there");
        assert_eq!(view.shape(), original.shape.as_slice());
        assert_eq!(view.data(), original.data.as_slice());
    }
}

#[tokio::test]
async fn a_directory_push_sends_the_files_bytes_and_equals_a_push_of_its_tensors() {
    let temp = tempfile::tempdir().expect("a temporary directory");
    let dir = temp.path().to_path_buf();
    let bytes = serialize(&adapter()).expect("serializable");
    std::fs::write(dir.join("adapter_model.safetensors"), &bytes).expect("write");
    std::fs::write(dir.join("adapter_config.json"), CONFIG).expect("write");

    let script = Arc::new(Script::answering(vec![]));
    let trainer = trainer(&script).await;
    let from_dir = trainer
        .push_adapter("policy", AdapterPayload::Directory(dir.clone()), SwapOptions::default())
        .await
        .expect("pushed");
    let mut reordered = adapter();
    reordered.reverse();
    let from_tensors = trainer
        .push_adapter(
            "policy",
            AdapterPayload::Tensors { config_json: CONFIG.into(), tensors: reordered },
            SwapOptions::default(),
        )
        .await
        .expect("pushed");
    assert_eq!(from_dir.sha256, from_tensors.sha256, "the same tensors are the same bytes, in any order");

    let pushes = lock(&script.pushes).clone();
    assert_eq!(pushes[0].bytes, bytes);
    assert_eq!(from_dir.sha256, hex(&Sha256::digest(&bytes)), "checked against the digest computed as it was sent");
    assert_eq!(pushes[0].header.total_bytes, bytes.len() as u64);
    assert!(pushes[0].header.sha256.is_empty(), "a file is hashed as it is sent, not in a pass before the header");
    assert_eq!(pushes[0].header.adapter_config_json, CONFIG);
    assert_eq!(pushes[0].header.mode(), PauseMode::Keep, "keep by default");
    assert!(pushes[0].chunk_sizes.iter().all(|&size| size <= PUSH_CHUNK_BYTES));
}

#[tokio::test]
async fn bad_tensors_are_refused_naming_the_tensor_before_anything_is_sent() {
    let script = Arc::new(Script::answering(vec![]));
    let trainer = trainer(&script).await;
    let mut short = adapter();
    short[1].data.pop();
    let mut twice = adapter();
    twice.push(twice[0].clone());
    let cases = [
        (short, "tensors[\"base_model.model.layers.0.q_proj.lora_A.weight\"]"),
        (twice, "tensors[\"base_model.model.layers.0.q_proj.lora_B.weight\"]"),
        (vec![], "tensors"),
    ];
    for (tensors, expected_field) in cases {
        let payload = AdapterPayload::Tensors { config_json: CONFIG.into(), tensors };
        match trainer.push_adapter("policy", payload, SwapOptions::default()).await {
            Err(ClientError::InvalidArgument { field, .. }) => assert_eq!(field, expected_field),
            other => panic!("expected a refusal naming {expected_field}, got {other:?}"),
        }
    }
    assert!(lock(&script.pushes).is_empty());
}

/// The chunks of a directory push, with the file changed by `change` once the first chunk was read: what was sent,
/// the failure left, and the digest left.
async fn chunks_with_a_change(
    change: impl FnOnce(&std::path::Path),
) -> (Vec<Vec<u8>>, Option<ClientError>, Option<String>) {
    use futures::StreamExt;
    let temp = tempfile::tempdir().expect("a temporary directory");
    let dir = temp.path().to_path_buf();
    std::fs::write(dir.join("adapter_model.safetensors"), serialize(&adapter()).expect("serializable")).expect("write");
    std::fs::write(dir.join("adapter_config.json"), CONFIG).expect("write");
    let body = payload::Body::prepare(AdapterPayload::Directory(dir.clone())).await.expect("prepared");
    let (failure, digest) = (Arc::new(Mutex::new(None)), Arc::new(Mutex::new(None)));
    let mut chunks = Box::pin(body.chunks(failure.clone(), digest.clone()));
    let mut sent = vec![chunks.next().await.expect("a first chunk")];
    change(&dir.join("adapter_model.safetensors"));
    while let Some(chunk) = chunks.next().await {
        sent.push(chunk);
    }
    let failure = lock(&failure).take();
    let digest = lock(&digest).take();
    (sent.into_iter().map(Vec::from).collect(), failure, digest)
}

#[tokio::test]
async fn a_file_changed_during_a_directory_push_is_never_sent_whole() {
    let whole = serialize(&adapter()).expect("serializable");
    let (sent, failure, digest) = chunks_with_a_change(|_| {}).await;
    assert_eq!(sent.concat(), whole, "unchanged: sent whole");
    assert_eq!(digest, Some(hex(&Sha256::digest(&whole))));
    assert!(failure.is_none(), "{failure:?}");

    let grown = |path: &std::path::Path| {
        use std::io::Write;
        std::fs::OpenOptions::new().append(true).open(path).expect("opened").write_all(b"more").expect("appended");
    };
    let replaced = |path: &std::path::Path| {
        let other = path.with_extension("new");
        std::fs::write(&other, serialize(&adapter()).expect("serializable")).expect("written");
        std::fs::rename(&other, path).expect("renamed over");
    };
    for (what, change) in [("grown", &grown as &dyn Fn(&std::path::Path)), ("replaced", &replaced)] {
        let (sent, failure, digest) = chunks_with_a_change(change).await;
        let sent: usize = sent.iter().map(Vec::len).sum();
        assert!(sent < whole.len(), "{what}: the last chunk was held back ({sent} of {} bytes sent)", whole.len());
        assert!(digest.is_none(), "{what}");
        match failure {
            Some(ClientError::Io { path, source }) => {
                assert!(path.ends_with("adapter_model.safetensors"), "{what}: {}", path.display());
                assert!(source.to_string().contains("changed during the push"), "{what}: {source}");
            }
            other => panic!("{what}: expected an I/O error naming the file, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_missing_directory_is_an_io_error_naming_the_file() {
    let script = Arc::new(Script::answering(vec![]));
    let temp = tempfile::tempdir().expect("a temporary directory");
    let missing = temp.path().join("no-such-adapter");
    match trainer(&script).await.push_adapter("p", AdapterPayload::Directory(missing), SwapOptions::default()).await {
        Err(ClientError::Io { path, .. }) => assert!(path.ends_with("adapter_config.json"), "{}", path.display()),
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_server_that_stored_other_bytes_is_a_protocol_error() {
    let script = Arc::new(Script::answering(vec![]));
    *lock(&script.pushed_sha256_override) = Some("00".repeat(32));
    let payload = AdapterPayload::Tensors { config_json: CONFIG.into(), tensors: adapter() };
    let outcome = trainer(&script).await.push_adapter("policy", payload, SwapOptions::default()).await;
    assert!(matches!(outcome, Err(ClientError::Protocol(_))), "{outcome:?}");
}

#[test]
fn dtype_names_of_safetensors_numpy_and_torch_are_understood() {
    for (name, dtype) in [
        ("F32", TensorDtype::F32),
        ("float32", TensorDtype::F32),
        ("torch.float32", TensorDtype::F32),
        ("float16", TensorDtype::F16),
        ("half", TensorDtype::F16),
        ("BF16", TensorDtype::BF16),
        ("bfloat16", TensorDtype::BF16),
        ("torch.bfloat16", TensorDtype::BF16),
    ] {
        assert_eq!(TensorDtype::parse(name), Some(dtype), "{name}");
    }
    for other in ["int8", "float64", "", "F8_E4M3"] {
        assert_eq!(TensorDtype::parse(other), None, "{other}");
    }
}
