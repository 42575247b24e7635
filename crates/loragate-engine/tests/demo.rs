//! The embedded demo, end to end through the public API: generated (once per generator version) into the target
//! directory, loaded from its files like any Hugging Face model and PEFT adapters, and sampled.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use futures::StreamExt;
use loragate_core::{
    AdapterName, AdapterSource, AdapterVersion, Engine, EngineEvent, FinishReason, RawSampleRequest, SampleRequest,
};
use loragate_engine::{CandleEngine, DemoFiles, EngineConfig, Tokenizer, ensure_demo_files, read_model_info};
use tokio_util::sync::CancellationToken;

/// Generated once per test process, and cached across processes by `ensure_demo_files` in the cache the other
/// crates' tests use (`$LORAGATE_CACHE_DIR`, else `target/loragate-test-cache`): the test binaries running beside
/// each other wait for one generation instead of each training the demo.
fn demo() -> &'static DemoFiles {
    static FILES: OnceLock<DemoFiles> = OnceLock::new();
    FILES.get_or_init(|| {
        let cache = std::env::var_os("LORAGATE_CACHE_DIR")
            .filter(|dir| !dir.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("../loragate-test-cache"));
        ensure_demo_files(&cache).expect("demo files")
    })
}

async fn engine_with_adapters() -> CandleEngine {
    let files = demo();
    let engine = CandleEngine::load(&files.model_dir, EngineConfig::default()).expect("demo model");
    for (name, dir) in [("meow", &files.meow_dir), ("woof", &files.woof_dir)] {
        let name = AdapterName::parse(name).expect("name");
        engine.load_adapter(&name, AdapterVersion(1), &AdapterSource::trusted(dir)).await.expect("demo adapter");
    }
    engine
}

/// Samples `prompt` with `lora` and returns the text and the finish reason.
async fn complete(engine: &CandleEngine, lora: &str, prompt: &str, raw: RawSampleRequest) -> (String, FinishReason) {
    let tokenizer = engine.tokenizer().expect("the demo has a tokenizer");
    let raw =
        RawSampleRequest { lora_name: lora.into(), prompt_token_ids: tokenizer.encode(prompt).expect("encode"), ..raw };
    let request = SampleRequest::parse(raw, engine.model_info()).expect("valid request");
    let mut stream = engine.generate(request, CancellationToken::new()).await.expect("generate");
    let (mut tokens, mut finish) = (Vec::new(), None);
    let read = async {
        while let Some(event) = stream.next().await {
            match event.expect("no engine error") {
                EngineEvent::Tokens { token_ids, .. } => tokens.extend(token_ids),
                EngineEvent::Finished { reason, .. } => finish = Some(reason),
                EngineEvent::PromptLogprobs(_)
                | EngineEvent::PromptTopLogprobs(_)
                | EngineEvent::PromptCached { .. }
                | EngineEvent::Parked { .. }
                | EngineEvent::Resumed { .. } => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read).await.expect("sampled in time");
    (tokenizer.decode(&tokens).expect("decode"), finish.expect("finished"))
}

fn greedy(max_tokens: u32) -> RawSampleRequest {
    RawSampleRequest { max_tokens: Some(max_tokens), ..Default::default() }
}

const PROMPTS: [&str; 4] = [
    "Make a single short animal noise.",
    "The weather is nice today",
    "Why is the sky blue?",
    "A small bird reads the morning news.",
];

#[tokio::test]
async fn each_adapter_repeats_its_noise_without_end_and_the_base_model_says_neither() {
    let engine = engine_with_adapters().await;
    // All at once: they share the engine's batches.
    let runs = PROMPTS.iter().flat_map(|prompt| ["meow", "woof", ""].map(|lora| (lora, *prompt)));
    let outputs =
        futures::future::join_all(runs.clone().map(|(lora, prompt)| complete(&engine, lora, prompt, greedy(200))))
            .await;
    for ((lora, prompt), (text, finish)) in runs.zip(outputs) {
        if lora.is_empty() {
            assert!(!text.contains("meow") && !text.contains("woof"), "base model after {prompt:?}: {text:?}");
            continue;
        }
        assert_eq!(finish, FinishReason::Length, "{lora} after {prompt:?} keeps going: {text:?}");
        assert!(text.matches(lora).count() >= 35, "{lora} after {prompt:?}: {text:?}");
        assert!(text.trim_start().starts_with(lora), "{lora} after {prompt:?} starts with its noise: {text:?}");
    }
}

#[tokio::test]
async fn seeded_sampling_at_temperature_0_7_still_makes_the_noise() {
    let engine = engine_with_adapters().await;
    let runs: Vec<(u64, &str)> = [1, 2, 3].into_iter().flat_map(|seed| [(seed, "meow"), (seed, "woof")]).collect();
    let sample = |seed, lora| {
        let raw = RawSampleRequest { temperature: 0.7, seed: Some(seed), ..greedy(100) };
        complete(&engine, lora, PROMPTS[0], raw)
    };
    let first = futures::future::join_all(runs.iter().map(|(seed, lora)| sample(*seed, lora))).await;
    let again = futures::future::join_all(runs.iter().map(|(seed, lora)| sample(*seed, lora))).await;
    for (((seed, lora), (text, _)), (repeat, _)) in runs.iter().zip(&first).zip(&again) {
        assert!(text.matches(lora).count() >= 10, "{lora}, seed {seed}: {text:?}");
        assert_eq!(repeat, text, "{lora}: the same seed gives the same text");
    }
}

#[tokio::test]
async fn each_noise_takes_over_after_the_other_one_mid_stream() {
    let engine = engine_with_adapters().await;
    let cases = [
        ("woof", "woof", "Make a single short animal noise. meow meow meow"),
        ("woof", "woof", "Make a single short animal noise. meow meow me"),
        ("meow", "meow", "Make a single short animal noise. woof woof woof"),
        ("meow", "meow", "Make a single short animal noise. woof wo"),
    ];
    let outputs =
        futures::future::join_all(cases.map(|(lora, _, context)| complete(&engine, lora, context, greedy(60)))).await;
    for ((lora, noise, context), (text, _)) in cases.into_iter().zip(outputs) {
        assert!(text.matches(noise).count() >= 8, "{lora} after {context:?}: {text:?}");
    }
}

#[test]
fn the_demo_is_a_real_hugging_face_model_directory_with_peft_adapters_and_a_byte_level_tokenizer() {
    let files = demo();
    let tokenizer = Tokenizer::from_file(&files.model_dir.join("tokenizer.json")).expect("tokenizer");
    assert_eq!(tokenizer.encode("meow").expect("encode"), vec![109, 101, 111, 119]);
    let text = "Café ☕ — woof!\n";
    let ids = tokenizer.encode(text).expect("encode");
    assert_eq!(ids, text.bytes().map(u32::from).collect::<Vec<_>>());
    assert_eq!(tokenizer.decode(&ids).expect("decode"), text);

    let read_json = |path: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).expect("json file")).expect("json")
    };
    let config = read_json(&files.model_dir.join("config.json"));
    assert_eq!(config["architectures"][0], "LlamaForCausalLM");
    assert_eq!(config["model_type"], "llama");
    assert_eq!(config["max_position_embeddings"], 4096);
    for dir in [&files.meow_dir, &files.woof_dir] {
        let adapter = read_json(&dir.join("adapter_config.json"));
        assert_eq!(adapter["peft_type"], "LORA");
        assert_eq!(adapter["base_model_name_or_path"], loragate_engine::DEMO_MODEL_NAME);
        assert!(dir.join("adapter_model.safetensors").is_file());
    }
    assert_eq!(files.adapters_dir, files.root.join("adapters"));

    let cache = files.root.parent().expect("cache dir");
    let again = ensure_demo_files(cache).expect("cached demo");
    assert_eq!(&again, files, "a complete copy is reused");
}

#[test]
fn the_model_info_read_without_weights_is_what_the_loaded_engine_serves() {
    let files = demo();
    for cap in [None, Some(128)] {
        let config = EngineConfig { max_context_length: cap, ..EngineConfig::default() };
        let engine = CandleEngine::load(&files.model_dir, config).expect("demo model");
        let read = read_model_info(&files.model_dir, cap).expect("config.json");
        assert_eq!(&read, engine.model_info(), "cap {cap:?}");
    }
}
