//! `loragate serve --state-dir DIR` killed (SIGKILL, no shutdown) and started again on the same directory: adapters
//! come back at their versions, no version is ever issued twice, pauses hold with their ids, owners and leases (a
//! lease that ran out while the server was down is gone), an adapter whose directory vanished is listed with its
//! error and refuses samples, and two servers never share a directory. Every server here has its own temporary
//! state directory.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use loragate_core::testing::eventually_within;
use loragate_proto::v1::lora_control_client::LoraControlClient;
use loragate_proto::v1::{self as pb};
use rand::Rng;
use tonic::Code;
use tonic::transport::Channel;

#[path = "support/spawned.rs"]
mod spawned;

use spawned::Spawned;

/// A `loragate serve` on the demo model, on free ports, recording into `state_dir`; killed (SIGKILL) when dropped.
struct Server {
    spawned: Spawned,
    grpc_addr: String,
    http_addr: String,
}

impl Server {
    fn start(state_dir: &Path, extra: &[&str]) -> Self {
        Self::try_start(state_dir, extra).unwrap_or_else(|stderr| panic!("loragate serve did not start: {stderr}"))
    }

    /// Starts it; its stderr if it exits before its ready line.
    fn try_start(state_dir: &Path, extra: &[&str]) -> Result<Self, String> {
        let dir = state_dir.to_str().expect("a UTF-8 temporary path");
        let mut args = vec!["serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--state-dir", dir];
        args.extend_from_slice(extra);
        let spawned = Spawned::try_start(&args)?;
        assert_eq!(spawned.ready["state_dir"].as_str(), Some(dir), "{}", spawned.ready);
        Ok(Self { grpc_addr: spawned.field("grpc_addr"), http_addr: spawned.field("http_addr"), spawned })
    }

    async fn control(&self) -> LoraControlClient<Channel> {
        let channel = Channel::from_shared(format!("http://{}", self.grpc_addr)).expect("uri");
        LoraControlClient::new(channel.connect().await.expect("gRPC connects"))
    }

    /// SIGKILL: nothing is flushed or shut down.
    fn kill(mut self) {
        self.spawned.kill();
    }
}

async fn load(control: &mut LoraControlClient<Channel>, name: &str, path: &str) -> Result<u64, tonic::Status> {
    let request = pb::LoadLoraAdapterRequest { lora_name: name.into(), path: path.into() };
    Ok(control.load_lora_adapter(request).await?.into_inner().version)
}

async fn pause(control: &mut LoraControlClient<Channel>, name: &str, owner: &str, lease_s: f64) -> String {
    let request = pb::AbortLoraRequestsRequest {
        lora_name: name.into(),
        mode: pb::PauseMode::Keep.into(),
        owner: owner.into(),
        lease_s,
        kv_policy: pb::KvPolicy::Unspecified.into(),
    };
    control.abort_lora_requests(request).await.expect("paused").into_inner().pause_id
}

async fn adapters(control: &mut LoraControlClient<Channel>) -> Vec<pb::LoraAdapterStatus> {
    control.list_lora_adapters(pb::ListLoraAdaptersRequest {}).await.expect("listed").into_inner().adapters
}

async fn adapter(control: &mut LoraControlClient<Channel>, name: &str) -> pb::LoraAdapterStatus {
    let listed = adapters(control).await;
    listed.into_iter().find(|adapter| adapter.lora_name == name).unwrap_or_else(|| panic!("{name} is listed"))
}

#[tokio::test]
async fn versions_pauses_and_leases_survive_a_kill() {
    let state = tempfile::tempdir().expect("state dir");
    let server = Server::start(state.path(), &[]);
    let mut control = server.control().await;
    assert_eq!(adapter(&mut control, "meow").await.version, 1);
    assert_eq!(load(&mut control, "meow", "woof").await.expect("swapped to woof's weights"), 2);
    let trainer = pause(&mut control, "meow", "trainer", 600.0).await;
    pause(&mut control, "woof", "short-lived", 1.0).await;
    server.kill();

    let server = Server::start(state.path(), &[]);
    let mut control = server.control().await;
    let meow = adapter(&mut control, "meow").await;
    assert_eq!(meow.version, 2, "the demo's meow flag is unchanged: what was loaded since stays");
    assert!(meow.paused && meow.weights_error.is_empty(), "{meow:?}");
    let held = &meow.pauses[0];
    assert_eq!((held.pause_id.as_str(), held.owner.as_str()), (trainer.as_str(), "trainer"));
    assert_eq!(held.mode, i32::from(pb::PauseMode::Keep));
    assert!(held.lease_left_s > 0.0 && held.lease_left_s <= 600.0, "{held:?}");
    eventually_within("woof's 1 s lease has ended", spawned::PATIENCE, || {
        let mut control = control.clone();
        async move { !adapter(&mut control, "woof").await.paused }
    })
    .await;

    let resumed = pb::ResumeLoraRequestsRequest { lora_name: "meow".into(), pause_id: trainer };
    assert!(control.resume_lora_requests(resumed).await.expect("resumed").into_inner().was_paused);
    assert_eq!(load(&mut control, "meow", "meow").await.expect("loads"), 3, "versions continue above 2");
    server.kill();
}

#[tokio::test]
async fn kills_at_random_points_never_lose_an_answered_change_or_repeat_a_version() {
    let state = tempfile::tempdir().expect("state dir");
    let mut highest_answered = 1; // The demo's meow starts at version 1.
    let mut trainer_pause: Option<String> = None;
    for round in 0..4 {
        let server = Server::start(state.path(), &[]);
        let mut control = server.control().await;
        let meow = adapter(&mut control, "meow").await;
        assert!(meow.version >= highest_answered, "round {round}: version {} < {highest_answered}", meow.version);
        if let Some(pause_id) = &trainer_pause {
            let ids: Vec<&str> = meow.pauses.iter().map(|pause| pause.pause_id.as_str()).collect();
            assert_eq!(ids, [pause_id.as_str()], "round {round}: the answered pause is kept");
        }
        // Loads and pause renewals, one after the other, until a kill at a random point.
        let killer = {
            let pid = server.spawned.pid().to_string();
            let after = Duration::from_millis(rand::rng().random_range(50..600));
            std::thread::spawn(move || {
                std::thread::sleep(after);
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            })
        };
        for step in 0.. {
            let path = if step % 2 == 0 { "woof" } else { "meow" };
            match load(&mut control, "meow", path).await {
                Ok(version) => {
                    assert!(version > highest_answered, "round {round}: version {version} was issued twice");
                    highest_answered = version;
                }
                Err(status) => {
                    assert_ne!(status.code(), Code::InvalidArgument, "{status:?}");
                    break; // Killed.
                }
            }
            let request = pb::AbortLoraRequestsRequest {
                lora_name: "meow".into(),
                mode: pb::PauseMode::Keep.into(),
                owner: "trainer".into(),
                lease_s: 3600.0,
                kv_policy: pb::KvPolicy::Reuse.into(),
            };
            match control.abort_lora_requests(request).await {
                Ok(answer) => trainer_pause = Some(answer.into_inner().pause_id),
                Err(_) => break,
            }
        }
        killer.join().expect("the killer thread");
        server.kill();
    }
    let server = Server::start(state.path(), &[]);
    let mut control = server.control().await;
    let next = load(&mut control, "meow", "meow").await.expect("loads");
    assert!(next > highest_answered, "the next version {next} is above every answered one ({highest_answered})");
}

#[tokio::test]
async fn an_adapter_whose_directory_vanished_is_listed_with_its_error_and_refuses_samples() {
    let state = tempfile::tempdir().expect("state dir");
    let root = tempfile::tempdir().expect("adapter root");
    let demo = loragate::ensure_demo_files(&spawned::cache_dir()).expect("the demo files");
    let copy = |to: &str| {
        std::fs::create_dir_all(root.path().join(to)).expect("mkdir");
        for file in ["adapter_config.json", "adapter_model.safetensors"] {
            std::fs::copy(demo.meow_dir.join(file), root.path().join(to).join(file)).expect("copy");
        }
    };
    copy("pet");
    copy("pet-again");
    let root_arg = root.path().to_str().expect("utf-8").to_owned();
    let server = Server::start(state.path(), &["--adapter-root", &root_arg]);
    let mut control = server.control().await;
    assert_eq!(load(&mut control, "pet", "pet").await.expect("loads"), 1);
    server.kill();
    std::fs::remove_dir_all(root.path().join("pet")).expect("the directory vanishes");

    let server = Server::start(state.path(), &["--adapter-root", &root_arg]);
    let mut control = server.control().await;
    let pet = adapter(&mut control, "pet").await;
    assert_eq!(pet.version, 1, "listed at its recorded version");
    assert!(pet.weights_error.contains("pet") && pet.weights_error.contains("v1"), "{}", pet.weights_error);

    let completion = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", server.http_addr))
        .json(&serde_json::json!({"model": "pet", "prompt": "Hi", "max_tokens": 2}))
        .send()
        .await
        .expect("answers");
    assert_eq!(completion.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let body = completion.text().await.expect("body");
    assert!(body.contains("has no weights") && body.contains("pet"), "{body}");

    assert_eq!(load(&mut control, "pet", "pet-again").await.expect("a load heals it"), 2);
    assert!(adapter(&mut control, "pet").await.weights_error.is_empty());
    let completion = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", server.http_addr))
        .json(&serde_json::json!({"model": "pet", "prompt": "Hi", "max_tokens": 2}))
        .send()
        .await
        .expect("answers");
    assert!(completion.status().is_success(), "{:?}", completion.text().await);
    server.kill();
}

#[tokio::test]
async fn two_servers_never_share_a_state_directory() {
    let state = tempfile::tempdir().expect("state dir");
    let first = Server::start(state.path(), &[]);
    let Err(stderr) = Server::try_start(state.path(), &[]) else { panic!("a second server on the same directory") };
    let dir = state.path().display().to_string();
    assert!(stderr.contains("--state-dir") && stderr.contains(&dir) && stderr.contains("another"), "{stderr}");
    first.kill();
}
