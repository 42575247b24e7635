//! The engine through its public trait, with its step thread, on a tiny random model.

use std::time::{Duration, Instant};

use futures::StreamExt;
use loragate_core::{EngineEvent, FinishReason, RawSampleRequest};
use serde_json::json;

use super::*;
use crate::lora::LoraTarget;
use crate::test_support::{
    Collected, TempDir, collect, greedy, peft_tensors, request, tiny_config, tiny_model, write_peft,
};

mod adapter_files;
mod kv_cache;
mod pushed;
mod races;

fn engine() -> CandleEngine {
    CandleEngine::start(tiny_model(tiny_config(vec![])), None, &EngineConfig::default()).expect("engine")
}

fn name(raw: &str) -> AdapterName {
    AdapterName::parse(raw).expect("adapter name")
}

fn good_config() -> serde_json::Value {
    json!({
        "peft_type": "LORA", "r": 4, "lora_alpha": 8, "base_model_name_or_path": "ignored",
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    })
}

/// Writes a valid adapter of seed `seed` into `dir`.
fn write_good_adapter(dir: &std::path::Path, seed: u64) {
    write_peft(dir, &good_config(), &peft_tensors(&tiny_config(vec![]), 4, &LoraTarget::ALL, seed));
}

async fn sample(engine: &CandleEngine, raw: RawSampleRequest) -> Collected {
    let request = request(&tiny_config(vec![]), raw);
    collect(engine.generate(request, CancellationToken::new()).await.expect("generate")).await
}

#[tokio::test]
async fn unknown_adapters_are_not_loaded_and_unloading_is_idempotent() {
    let engine = engine();
    let request = request(&tiny_config(vec![]), greedy("ghost", &[1], 3));
    assert!(matches!(
        engine.generate(request, CancellationToken::new()).await,
        Err(EngineError::AdapterNotLoaded(adapter)) if adapter.as_str() == "ghost"
    ));
    engine.unload_adapter(&name("ghost"), AdapterVersion(1)).await.expect("unloading an unknown adapter is fine");
}

#[tokio::test]
async fn peft_adapters_load_in_every_accepted_form_and_change_the_output() {
    let engine = engine();
    let dir = TempDir::new("peft-good");
    let config = tiny_config(vec![]);
    let base = sample(&engine, greedy("", &[1, 2, 3], 8)).await;
    let forms = [
        ("list", good_config(), false),
        ("all-linear", json!({ "r": 4, "lora_alpha": 8, "target_modules": "all-linear", "use_rslora": true }), false),
        ("default-names", good_config(), true),
    ];
    for (label, adapter_config, default_names) in forms {
        let mut tensors = peft_tensors(&config, 4, &LoraTarget::ALL, 9);
        if default_names {
            tensors = tensors.into_iter().map(|(k, v)| (k.replace(".weight", ".default.weight"), v)).collect();
        }
        let adapter_dir = dir.path().join(label);
        write_peft(&adapter_dir, &adapter_config, &tensors);
        engine.load_adapter(&name(label), AdapterVersion(1), &AdapterSource::trusted(&adapter_dir)).await.expect(label);
        let adapted = sample(&engine, greedy(label, &[1, 2, 3], 8)).await;
        assert_ne!(adapted.single().logprobs, base.single().logprobs, "{label} changes the distribution");
    }
    let q_only = dir.path().join("q-only");
    write_peft(
        &q_only,
        &json!({ "r": 2, "lora_alpha": 2, "target_modules": "q_proj" }),
        &peft_tensors(&config, 2, &[LoraTarget::Q], 3),
    );
    engine.load_adapter(&name("q"), AdapterVersion(1), &AdapterSource::trusted(&q_only)).await.expect("q only");
    assert_eq!(engine.adapters().len(), 4);
}

#[tokio::test]
async fn bad_adapters_are_refused_with_the_right_error_and_the_old_weights_stay_served() {
    let engine = engine();
    let dir = TempDir::new("peft-bad");
    let meow = name("meow");
    let good = dir.path().join("good");
    write_good_adapter(&good, 1);
    engine.load_adapter(&meow, AdapterVersion(1), &AdapterSource::trusted(&good)).await.expect("good adapter");
    let before = sample(&engine, greedy("meow", &[4, 5, 6], 8)).await;

    let config = tiny_config(vec![]);
    let all = || peft_tensors(&config, 4, &LoraTarget::ALL, 2);
    let with = |edit: &dyn Fn(&mut crate::model::WeightMap)| {
        let mut tensors = all();
        edit(&mut tensors);
        tensors
    };
    let a_name = |layer: usize, module: &str| format!("base_model.model.model.layers.{layer}.{module}.lora_A.weight");
    let cpu = &candle_core::Device::Cpu;
    let zeros = |shape: (usize, usize)| candle_core::Tensor::zeros(shape, candle_core::DType::F32, cpu).expect("zeros");
    let config_with = |key: &str, value: serde_json::Value| {
        let mut adapter_config = good_config();
        adapter_config[key] = value;
        adapter_config
    };
    type Case = (&'static str, Option<(serde_json::Value, crate::model::WeightMap)>, &'static str);
    let cases: Vec<Case> = vec![
        ("missing-dir", None, "adapter_files"),
        (
            "unknown-module",
            Some((config_with("target_modules", json!(["q_proj", "lm_head"])), all())),
            "adapter_incompatible",
        ),
        ("regex-modules", Some((config_with("target_modules", json!(".*proj")), all())), "adapter_incompatible"),
        ("rank-mismatch", Some((config_with("r", json!(8)), all())), "adapter_incompatible"),
        (
            "wrong-shape",
            Some((
                good_config(),
                with(&|t| {
                    t.insert(a_name(0, "mlp.up_proj"), zeros((4, 31)));
                }),
            )),
            "adapter_incompatible",
        ),
        (
            "missing-b",
            Some((
                good_config(),
                with(&|t| {
                    t.remove(&a_name(1, "self_attn.v_proj").replace("lora_A", "lora_B"));
                }),
            )),
            "adapter_incompatible",
        ),
        (
            "extra-layer",
            Some((
                good_config(),
                with(&|t| {
                    t.insert(a_name(7, "self_attn.q_proj"), zeros((4, 32)));
                }),
            )),
            "adapter_incompatible",
        ),
        ("undeclared", Some((config_with("target_modules", json!(["q_proj"])), all())), "adapter_incompatible"),
        (
            "not-lora",
            Some((
                good_config(),
                with(&|t| {
                    t.insert("base_model.model.lm_head.weight".into(), zeros((64, 32)));
                }),
            )),
            "adapter_incompatible",
        ),
        ("dora", Some((config_with("use_dora", json!(true)), all())), "adapter_incompatible"),
        ("no-rank", Some((json!({ "lora_alpha": 8, "target_modules": ["q_proj"] }), all())), "adapter_files"),
    ];
    for (label, files, kind) in cases {
        let adapter_dir = dir.path().join(label);
        if let Some((adapter_config, tensors)) = files {
            write_peft(&adapter_dir, &adapter_config, &tensors);
        }
        let err = engine.load_adapter(&meow, AdapterVersion(2), &AdapterSource::trusted(&adapter_dir)).await;
        let err = err.expect_err(label);
        assert_eq!(err.kind(), kind, "{label}: {err}");
    }
    for (label, file, contents) in [
        ("malformed-json", "adapter_config.json", &b"{ not json"[..]),
        ("malformed-safetensors", "adapter_model.safetensors", &b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!"[..]),
    ] {
        let adapter_dir = dir.path().join(label);
        write_good_adapter(&adapter_dir, 3);
        std::fs::write(adapter_dir.join(file), contents).expect("corrupt");
        let err = engine.load_adapter(&meow, AdapterVersion(2), &AdapterSource::trusted(&adapter_dir)).await;
        assert_eq!(err.expect_err(label).kind(), "adapter_files", "{label}");
    }

    let after = sample(&engine, greedy("meow", &[4, 5, 6], 8)).await;
    assert_eq!(after.single(), before.single(), "version 1 is still served, unchanged");
    assert_eq!(engine.adapters(), vec![(meow, AdapterVersion(1))]);
}

#[tokio::test]
async fn weights_belong_to_their_version_and_older_loads_or_unloads_never_touch_newer_ones() {
    let engine = engine();
    let dir = TempDir::new("peft-owned");
    let (v1, v2) = (dir.path().join("v1"), dir.path().join("v2"));
    write_good_adapter(&v1, 1);
    write_good_adapter(&v2, 2);
    let meow = name("meow");
    engine.load_adapter(&meow, AdapterVersion(2), &AdapterSource::trusted(&v2)).await.expect("v2");
    engine.load_adapter(&meow, AdapterVersion(1), &AdapterSource::trusted(&v1)).await.expect("a late v1 succeeds");
    assert_eq!(engine.adapters(), vec![(meow.clone(), AdapterVersion(2))], "v1 was not installed over v2");
    assert_eq!(sample(&engine, greedy("meow", &[1, 2], 4)).await.single().versions, vec![2; 4]);

    engine.unload_adapter(&meow, AdapterVersion(1)).await.expect("unload v1");
    assert_eq!(engine.adapters(), vec![(meow.clone(), AdapterVersion(2))], "unloading v1 leaves v2");
    engine.unload_adapter(&meow, AdapterVersion(2)).await.expect("unload v2");
    assert!(engine.adapters().is_empty());
    engine.load_adapter(&meow, AdapterVersion(3), &AdapterSource::trusted(&v1)).await.expect("v3");
    engine.unload_adapter(&meow, AdapterVersion(7)).await.expect("unload up to v7");
    assert!(engine.adapters().is_empty(), "an unload removes older versions too");
}

/// Reads events until `count` tokens arrived (failing after 30 s).
async fn read_tokens(stream: &mut loragate_core::EngineStream, collected: &mut Collected, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while collected.sequences.first().map_or(0, |s| s.token_ids.len()) < count {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = tokio::time::timeout(left, stream.next()).await.expect("tokens in time").expect("stream open");
        collected.record(event);
    }
}

#[tokio::test]
async fn running_sequences_keep_the_weights_and_version_they_started_with() {
    let engine = engine();
    let dir = TempDir::new("peft-versions");
    let (v1, v2) = (dir.path().join("v1"), dir.path().join("v2"));
    write_good_adapter(&v1, 1);
    write_good_adapter(&v2, 2);
    let meow = name("meow");
    engine.load_adapter(&meow, AdapterVersion(1), &AdapterSource::trusted(&v1)).await.expect("v1");
    let reference = sample(&engine, greedy("meow", &[1, 2], 40)).await;

    let cancel = CancellationToken::new();
    let long = request(&tiny_config(vec![]), greedy("meow", &[1, 2], 4000 - 2));
    let mut stream = engine.generate(long, cancel.clone()).await.expect("generate");
    let mut running = Collected::default();
    read_tokens(&mut stream, &mut running, 3).await;
    engine.load_adapter(&meow, AdapterVersion(2), &AdapterSource::trusted(&v2)).await.expect("v2");
    let fresh = sample(&engine, greedy("meow", &[1, 2], 40)).await;
    assert_eq!(fresh.single().versions, vec![2; 40]);
    assert_ne!(fresh.single().token_ids, reference.single().token_ids, "v2 has other weights");

    engine.unload_adapter(&meow, AdapterVersion(2)).await.expect("unload");
    read_tokens(&mut stream, &mut running, 40).await;
    cancel.cancel();
    while let Some(event) = stream.next().await {
        running.record(event);
    }
    let running = running.single();
    assert_eq!(running.finish, Some(FinishReason::Abort));
    assert!(running.versions.iter().all(|version| *version == 1), "pinned to v1 through the reload and unload");
    assert_eq!(running.token_ids[..40], reference.single().token_ids[..], "computed with v1's weights");
    let gone = request(&tiny_config(vec![]), greedy("meow", &[1], 2));
    assert!(matches!(engine.generate(gone, CancellationToken::new()).await, Err(EngineError::AdapterNotLoaded(_))));
}

#[tokio::test]
async fn cancelling_through_the_engine_hands_back_every_emitted_token_then_abort() {
    let engine = engine();
    let cancel = CancellationToken::new();
    let mut stream = engine
        .generate(request(&tiny_config(vec![]), greedy("", &[1, 2], 4000)), cancel.clone())
        .await
        .expect("generate");
    let mut collected = Collected::default();
    read_tokens(&mut stream, &mut collected, 5).await;
    cancel.cancel();
    while let Some(event) = stream.next().await {
        collected.record(event);
    }
    let last = collected.events.last().expect("events");
    assert_eq!(last, &EngineEvent::Finished { sequence: 0, reason: FinishReason::Abort });
    let tokens_in_events: usize = collected
        .events
        .iter()
        .map(|event| match event {
            EngineEvent::Tokens { token_ids, .. } => token_ids.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(tokens_in_events, collected.single().token_ids.len());
    assert!(tokens_in_events < 4000);
}

#[tokio::test]
async fn dropping_the_engine_ends_running_requests() {
    let engine = engine();
    let mut stream = engine
        .generate(request(&tiny_config(vec![]), greedy("", &[1, 2], 4000)), CancellationToken::new())
        .await
        .expect("generate");
    let mut collected = Collected::default();
    read_tokens(&mut stream, &mut collected, 2).await;
    drop(engine);
    while let Some(event) = stream.next().await {
        collected.record(event);
    }
    assert_eq!(collected.errors, vec![EngineError::Stopped.to_string()]);
    assert_eq!(collected.single().finish, None);
}
