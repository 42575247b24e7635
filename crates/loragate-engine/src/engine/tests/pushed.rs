//! Pushed adapters read as they arrive (issue 31): the engine's preparation of a push, received through the core's
//! adapter store in small chunks, gives exactly the weights a load of the same files gives, and a hostile push is
//! refused as its files would be.

use loragate_core::adapter_store::{LayoutCheck, Preparation};
use loragate_core::{AdapterStore, CoreError, PushHeader};

use super::*;

/// Receives `dir`'s adapter as a push into a temporary store, in chunks of `chunk` bytes, with the engine checking its
/// layout and reading it as it arrives; the stored version.
async fn push_through_store(
    engine: &Arc<CandleEngine>,
    store: &AdapterStore,
    dir: &std::path::Path,
    chunk: usize,
) -> Result<loragate_core::adapter_store::StoredAdapter, CoreError> {
    let config = std::fs::read(dir.join("adapter_config.json")).expect("config");
    let weights = std::fs::read(dir.join("adapter_model.safetensors")).expect("weights");
    let check: LayoutCheck = {
        let engine = Arc::clone(engine);
        Arc::new(move |layout| engine.check_adapter_layout(layout).map_err(CoreError::from))
    };
    let preparation: Preparation = {
        let engine = Arc::clone(engine);
        Arc::new(move |layout, file| engine.prepare_pushed_adapter(layout, file))
    };
    let header = PushHeader::parse(config, "", None).expect("header");
    let mut receiver = store.receive(header, check).await?.prepared_by(preparation);
    for part in weights.chunks(chunk) {
        receiver.write(part).await?;
    }
    receiver.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_read_as_it_arrives_samples_exactly_as_its_files_loaded_from_disk() {
    let engine = Arc::new(engine());
    let dir = TempDir::new("pushed-prepared");
    let files = dir.path().join("files");
    write_good_adapter(&files, 3);
    let store = AdapterStore::temporary(u64::MAX).expect("store");
    for chunk in [997, 1 << 20] {
        let stored = push_through_store(&engine, &store, &files, chunk).await.expect("pushed");
        assert!(stored.source.is_prepared(), "the engine began reading the push as it arrived");
        engine.load_adapter(&name("pushed"), AdapterVersion(1), &stored.source).await.expect("pushed load");
        assert!(!stored.source.is_prepared(), "the load took the prepared weights");
        engine.load_adapter(&name("files"), AdapterVersion(1), &AdapterSource::trusted(&files)).await.expect("load");
        let prompt = [3, 1, 4, 1, 5, 9];
        let pushed = sample(&engine, greedy("pushed", &prompt, 8)).await;
        let from_files = sample(&engine, greedy("files", &prompt, 8)).await;
        let base = sample(&engine, greedy("", &prompt, 8)).await;
        let pushed = pushed.single();
        assert_eq!(pushed.token_ids, from_files.single().token_ids, "chunks of {chunk} bytes");
        assert_eq!(pushed.logprobs, from_files.single().logprobs, "chunks of {chunk} bytes: the same weights");
        assert_ne!(pushed.logprobs, base.single().logprobs, "the adapter changes the output");
        engine.unload_adapter(&name("pushed"), AdapterVersion(1)).await.expect("unloaded");
        engine.unload_adapter(&name("files"), AdapterVersion(1)).await.expect("unloaded");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_push_read_as_it_arrives_is_refused_as_its_files_are() {
    let engine = Arc::new(engine());
    let dir = TempDir::new("pushed-hostile");
    let files = dir.path().join("nan");
    let mut tensors = peft_tensors(&tiny_config(vec![]), 4, &LoraTarget::ALL, 5);
    let b = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight".to_owned();
    let shape = tensors[&b].dims().to_vec();
    tensors.insert(b, candle_core::Tensor::full(f32::NAN, shape, &candle_core::Device::Cpu).expect("B"));
    write_peft(&files, &good_config(), &tensors);
    let store = AdapterStore::temporary(u64::MAX).expect("store");
    let stored = push_through_store(&engine, &store, &files, 4096).await.expect("the layout is fine: stored");
    let pushed = engine.load_adapter(&name("nan"), AdapterVersion(1), &stored.source).await.expect_err("refused");
    let from_files =
        engine.load_adapter(&name("nan"), AdapterVersion(1), &AdapterSource::trusted(&files)).await.expect_err("too");
    assert_eq!(pushed.to_string(), from_files.to_string());
    assert!(pushed.to_string().contains("NaN"), "{pushed}");
    assert!(engine.adapters().is_empty(), "nothing was installed");
}
