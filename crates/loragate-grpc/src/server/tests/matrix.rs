//! The route × key matrix of docs/security.md, RPC by RPC: every RPC of this front, called with the admin key, the
//! API key, a tenant key that may only sample and a tenant key with `control` (and with no key), each on a fresh
//! server, answers the code the matrix says. The tenants own `team-a/*`; `team-b/*` belongs to another tenant.

use loragate_core::AdapterRoot;
use loragate_core::testing::{MATRIX_KEYS, matrix_keyring};
use loragate_proto::v1::fleet_client::FleetClient;
use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

use super::*;

/// One RPC with its arguments.
#[derive(Clone, Copy, Debug)]
enum Call {
    Sample(&'static str),
    SampleStream(&'static str),
    Abort(&'static str),
    Resume(&'static str),
    Swap(&'static str, &'static str),
    Wait(&'static str),
    Load(&'static str, &'static str),
    Unload(&'static str),
    ListAdapters,
    ListReplicas,
    Push(&'static str),
    Staleness(&'static str),
    ListWorkers,
    AddWorker,
    RemoveWorker,
    Health,
}

const OK: Code = Code::Ok;
const DENIED: Code = Code::PermissionDenied;
const SAMPLE: [Code; 4] = [OK, OK, OK, OK];
const FOREIGN_SAMPLE: [Code; 4] = [OK, OK, DENIED, DENIED];
const CONTROL: [Code; 4] = [OK, DENIED, DENIED, OK];
const FOREIGN_CONTROL: [Code; 4] = [OK, DENIED, DENIED, DENIED];
/// The fleet's RPCs without a fleet: the admin key gets as far as `FAILED_PRECONDITION`.
const FLEET: [Code; 4] = [Code::FailedPrecondition, DENIED, DENIED, DENIED];

fn rows() -> Vec<(Call, [Code; 4])> {
    use Call::*;
    vec![
        (Health, SAMPLE),
        (Sample("team-a/policy"), SAMPLE),
        (Sample(""), SAMPLE),
        (Sample("team-a/policy@1"), SAMPLE),
        (Sample("team-b/policy"), FOREIGN_SAMPLE),
        (Sample("team-b/policy@1"), FOREIGN_SAMPLE),
        (SampleStream("team-a/policy"), SAMPLE),
        (SampleStream("team-b/policy"), FOREIGN_SAMPLE),
        (Wait("team-a/policy"), SAMPLE),
        (Wait("team-b/policy"), FOREIGN_SAMPLE),
        (ListAdapters, SAMPLE),
        (Abort("team-a/policy"), CONTROL),
        (Abort("team-b/policy"), FOREIGN_CONTROL),
        (Resume("team-a/policy"), CONTROL),
        (Resume("team-b/policy"), FOREIGN_CONTROL),
        (Unload("team-a/policy"), CONTROL),
        (Unload("team-b/policy"), FOREIGN_CONTROL),
        (Staleness("team-a/policy"), CONTROL),
        (Staleness("team-b/policy"), FOREIGN_CONTROL),
        (Load("team-a/new", "team-a/step-2"), CONTROL),
        (Load("team-a/new", "team-b/step-2"), FOREIGN_CONTROL),
        (Load("team-a/new", "team-b/no-such-dir"), [Code::InvalidArgument, DENIED, DENIED, DENIED]),
        (Load("team-b/new", "team-b/step-2"), FOREIGN_CONTROL),
        (Swap("team-a/policy", "team-a/step-2"), CONTROL),
        (Swap("team-a/policy", "team-b/step-2"), FOREIGN_CONTROL),
        (Swap("team-a/policy", "team-a/../team-b/step-2"), FOREIGN_CONTROL),
        // A push whose header is all it sends: INVALID_ARGUMENT once its caller may control the adapter.
        (Push("team-a/policy"), [Code::InvalidArgument, DENIED, DENIED, Code::InvalidArgument]),
        (Push("team-b/policy"), [Code::InvalidArgument, DENIED, DENIED, DENIED]),
        // The replicas' addresses describe the deployment, not an adapter: the admin key's.
        (ListReplicas, [OK, DENIED, DENIED, DENIED]),
        (ListWorkers, FLEET),
        (AddWorker, FLEET),
        (RemoveWorker, FLEET),
    ]
}

fn keyed<T>(message: T, key: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(key) = key {
        let value: MetadataValue<_> = format!("Bearer {key}").parse().expect("ascii");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

/// An adapter root with `team-a/step-2` and `team-b/step-2`.
fn adapter_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("a temporary directory");
    for dir in ["team-a/step-2", "team-b/step-2"] {
        std::fs::create_dir_all(root.path().join(dir)).expect("mkdir");
        std::fs::write(root.path().join(dir).join("adapter_model.safetensors"), dir).expect("weights");
    }
    root
}

/// `call` with `key` on a fresh server (authentication on, `team-a/policy` and `team-b/policy` loaded).
async fn code_of(root: &tempfile::TempDir, call: Call, key: Option<&str>) -> (Code, String) {
    let config = CoordinatorConfig {
        auth: matrix_keyring(),
        adapter_root: Some(AdapterRoot::new(root.path()).expect("root")),
        ..CoordinatorConfig::default()
    };
    let (harness, _coordinator) = serve_with(config, &["team-a/policy", "team-b/policy"]).await;
    let (mut sampler, mut control) = (harness.sampler.clone(), harness.control.clone());
    let mut fleet = FleetClient::new(harness.channel.clone());
    let answer: Result<(), Status> = match call {
        Call::Health => {
            let mut health = tonic_health::pb::health_client::HealthClient::new(harness.channel.clone());
            let check = tonic_health::pb::HealthCheckRequest { service: String::new() };
            health.check(keyed(check, key)).await.map(drop)
        }
        Call::Sample(lora) => sampler.sample(keyed(sample_request(lora, 2), key)).await.map(drop),
        Call::SampleStream(lora) => match sampler.sample_stream(keyed(sample_request(lora, 2), key)).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(_)) => {}
                        Ok(None) => break Ok(()),
                        Err(status) => break Err(status),
                    }
                }
            }
            Err(status) => Err(status),
        },
        Call::Abort(lora) => control.abort_lora_requests(keyed(pause(lora), key)).await.map(drop),
        Call::Resume(lora) => control.resume_lora_requests(keyed(resume(lora), key)).await.map(drop),
        Call::Swap(lora, path) => {
            let swap = pb::SwapLoraAdapterRequest { lora_name: lora.into(), path: path.into(), ..Default::default() };
            control.swap_lora_adapter(keyed(swap, key)).await.map(drop)
        }
        Call::Wait(lora) => {
            let wait = pb::WaitLoraUnpausedRequest { lora_name: lora.into(), ..Default::default() };
            control.wait_lora_unpaused(keyed(wait, key)).await.map(drop)
        }
        Call::Load(lora, path) => {
            let load = pb::LoadLoraAdapterRequest { lora_name: lora.into(), path: path.into() };
            control.load_lora_adapter(keyed(load, key)).await.map(drop)
        }
        Call::Unload(lora) => control
            .unload_lora_adapter(keyed(pb::UnloadLoraAdapterRequest { lora_name: lora.into() }, key))
            .await
            .map(drop),
        Call::ListAdapters => control.list_lora_adapters(keyed(pb::ListLoraAdaptersRequest {}, key)).await.map(drop),
        Call::ListReplicas => control.list_replicas(keyed(pb::ListReplicasRequest {}, key)).await.map(drop),
        Call::Push(lora) => {
            let header = pb::PushLoraAdapterHeader { lora_name: lora.into(), ..Default::default() };
            let parts = futures::stream::iter([pb::PushLoraAdapterRequest {
                part: Some(pb::push_lora_adapter_request::Part::Header(header)),
            }]);
            control.push_lora_adapter(keyed(parts, key)).await.map(drop)
        }
        Call::Staleness(lora) => {
            let bound = pb::SetLoraStalenessRequest { lora_name: lora.into(), max_staleness: 1, batch_size: 4 };
            control.set_lora_staleness(keyed(bound, key)).await.map(drop)
        }
        Call::ListWorkers => fleet.list_workers(keyed(pb::ListWorkersRequest {}, key)).await.map(drop),
        Call::AddWorker => fleet
            .add_worker(keyed(pb::AddWorkerRequest { address: "grpc://127.0.0.1:9001".into() }, key))
            .await
            .map(drop),
        Call::RemoveWorker => {
            let remove = pb::RemoveWorkerRequest { address: "grpc://127.0.0.1:9001".into(), drain: false };
            fleet.remove_worker(keyed(remove, key)).await.map(drop)
        }
    };
    match answer {
        Ok(()) => (Code::Ok, String::new()),
        Err(status) => (status.code(), status.message().to_owned()),
    }
}

#[tokio::test]
async fn every_rpc_answers_each_key_as_the_matrix_says() {
    let root = adapter_root();
    let mut wrong = Vec::new();
    for (call, codes) in rows() {
        let without_key = if matches!(call, Call::Health) { Code::Ok } else { Code::Unauthenticated };
        let (code, message) = code_of(&root, call, None).await;
        if code != without_key {
            wrong.push(format!("{call:?} without a key: {code:?}, not {without_key:?} ({message})"));
        }
        for (key, expected) in MATRIX_KEYS.iter().zip(codes) {
            let (code, message) = code_of(&root, call, Some(key)).await;
            if code != expected {
                wrong.push(format!("{call:?} with {key}: {code:?}, not {expected:?} ({message})"));
            }
        }
    }
    assert!(wrong.is_empty(), "cells that differ from the matrix:\n{}", wrong.join("\n"));
}

#[tokio::test]
async fn a_tenants_refused_load_names_the_path_field_and_its_own_directories_only() {
    let root = adapter_root();
    for path in ["team-b/step-2", "team-b/no-such-dir"] {
        let (code, message) = code_of(&root, Call::Load("team-a/new", path), Some("k-a-control")).await;
        assert_eq!(code, Code::PermissionDenied);
        assert_eq!(
            message,
            format!(
                "path: {path:?} is outside the directories this key may load adapters from (team-a/*, under the \
                 adapter root)"
            ),
            "the same words whether or not the path exists"
        );
    }
}
