//! Hostile adapter files and values (issue 13, findings 2 and 5): refused at load with an error that says why,
//! quickly, without reading more than the limits allow, and with the weights already served left in service.

use loragate_core::AdapterRoot;

use super::*;

/// An engine accepting adapter weight files of at most `max_adapter_bytes`.
fn engine_with_max_bytes(max_adapter_bytes: u64) -> CandleEngine {
    let config = EngineConfig { max_adapter_bytes, ..EngineConfig::default() };
    CandleEngine::start(tiny_model(tiny_config(vec![])), None, &config).expect("engine")
}

/// Loads `source` as meow v2 over a served v1 and returns the error, checking that v1 is still served unchanged.
async fn refused(engine: &CandleEngine, source: &AdapterSource, label: &str) -> EngineError {
    let before = sample(engine, greedy("meow", &[4, 5, 6], 6)).await;
    let meow = name("meow");
    let loaded = tokio::time::timeout(Duration::from_secs(30), engine.load_adapter(&meow, AdapterVersion(2), source));
    let err = loaded.await.unwrap_or_else(|_| panic!("{label}: the load hung")).expect_err(label);
    let after = sample(engine, greedy("meow", &[4, 5, 6], 6)).await;
    assert_eq!(after.single(), before.single(), "{label}: v1 is still served, unchanged");
    assert_eq!(engine.adapters(), vec![(name("meow"), AdapterVersion(1))], "{label}");
    err
}

async fn with_meow(engine: &CandleEngine, dir: &std::path::Path) {
    let good = dir.join("good");
    write_good_adapter(&good, 1);
    engine.load_adapter(&name("meow"), AdapterVersion(1), &AdapterSource::trusted(&good)).await.expect("v1");
}

#[tokio::test]
async fn hostile_scales_ranks_and_values_are_refused() {
    let engine = engine();
    let dir = TempDir::new("hostile-values");
    with_meow(&engine, dir.path()).await;
    let config = tiny_config(vec![]);
    let config_with = |key: &str, value: serde_json::Value| {
        let mut adapter_config = good_config();
        adapter_config[key] = value;
        adapter_config
    };
    let scaled = |value: f32| {
        let mut tensors = peft_tensors(&config, 4, &LoraTarget::ALL, 5);
        let b = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight".to_owned();
        let shape = tensors[&b].dims().to_vec();
        tensors.insert(b, candle_core::Tensor::full(value, shape, &candle_core::Device::Cpu).expect("B"));
        tensors
    };
    let wide = peft_tensors(&config, 65, &LoraTarget::ALL, 6);
    let cases = [
        (
            "alpha-1e40",
            config_with("lora_alpha", json!(1e40)),
            peft_tensors(&config, 4, &LoraTarget::ALL, 5),
            "adapter_incompatible",
            "lora_alpha / r",
        ),
        (
            "alpha-1e25",
            config_with("lora_alpha", json!(1e25)),
            peft_tensors(&config, 4, &LoraTarget::ALL, 5),
            "adapter_incompatible",
            "lora_alpha / r",
        ),
        ("rank-65", config_with("r", json!(65)), wide, "adapter_incompatible", "--max-lora-rank"),
        ("nan-weights", good_config(), scaled(f32::NAN), "adapter_files", "NaN or infinite"),
        ("overflow-when-scaled", good_config(), scaled(3e38), "adapter_files", "after scaling"),
    ];
    for (label, adapter_config, tensors, kind, mentions) in cases {
        let adapter_dir = dir.path().join(label);
        write_peft(&adapter_dir, &adapter_config, &tensors);
        let err = refused(&engine, &AdapterSource::trusted(&adapter_dir), label).await;
        assert_eq!(err.kind(), kind, "{label}: {err}");
        assert!(err.to_string().contains(mentions), "{label}: {err}");
    }
}

#[cfg(unix)]
#[tokio::test]
async fn adapter_files_must_be_regular_files_inside_the_root_and_are_never_waited_on() {
    let engine = engine();
    let base = TempDir::new("adapter-files");
    with_meow(&engine, base.path()).await;
    let (root_dir, outside) = (base.path().join("root"), base.path().join("outside"));
    write_good_adapter(&outside, 2);
    std::fs::create_dir_all(&root_dir).expect("root");
    let root = AdapterRoot::new(&root_dir).expect("adapter root");
    let with_weights = |label: &str, place: &dyn Fn(&std::path::Path)| {
        let dir = root_dir.join(label);
        std::fs::create_dir_all(&dir).expect("adapter dir");
        std::fs::copy(outside.join("adapter_config.json"), dir.join("adapter_config.json")).expect("config");
        place(&dir.join("adapter_model.safetensors"));
    };
    let link =
        |target: std::path::PathBuf| move |at: &std::path::Path| std::os::unix::fs::symlink(&target, at).expect("link");
    with_weights("escape", &link(outside.join("adapter_model.safetensors")));
    with_weights("zero", &link("/dev/zero".into()));
    with_weights("fifo", &|at| {
        assert!(std::process::Command::new("mkfifo").arg(at).status().expect("mkfifo").success())
    });
    with_weights("directory", &|at| std::fs::create_dir(at).expect("mkdir"));

    for label in ["escape", "zero", "fifo", "directory"] {
        let source = root.resolve(label).await.expect("the directory is inside the root");
        let err = refused(&engine, &source, label).await;
        assert_eq!(err.kind(), "adapter_files", "{label}: {err}");
        assert!(
            err.to_string().contains("adapter_model.safetensors is not a regular file inside the adapter root"),
            "{label}: {err}"
        );
    }
    // The operator's own directories may link anywhere (a Hugging Face cache does).
    let trusted = AdapterSource::trusted(root_dir.join("escape"));
    engine.load_adapter(&name("meow"), AdapterVersion(2), &trusted).await.expect("a trusted link loads");
}

#[tokio::test]
async fn weights_files_are_sized_and_their_header_checked_before_any_tensor_is_read() {
    let dir = TempDir::new("adapter-sizes");
    let good = dir.path().join("good");
    write_good_adapter(&good, 1);
    let size = std::fs::metadata(good.join("adapter_model.safetensors")).expect("size").len();

    let engine = engine_with_max_bytes(size - 1);
    let loaded = engine.load_adapter(&name("meow"), AdapterVersion(1), &AdapterSource::trusted(&good)).await;
    let err = loaded.expect_err("one byte over the limit");
    assert_eq!(err.kind(), "adapter_files");
    assert!(err.to_string().contains("--max-adapter-bytes"), "{err}");

    let engine = engine_with_max_bytes(size + 1024);
    with_meow(&engine, dir.path()).await;
    let weights = std::fs::read(good.join("adapter_model.safetensors")).expect("weights");
    let header_len = u64::from_le_bytes(weights[..8].try_into().expect("8 bytes"));
    let data = &weights[8 + header_len as usize..];
    let header = &weights[8..8 + header_len as usize];
    let with_bytes = |label: &str, bytes: Vec<u8>| {
        let adapter_dir = dir.path().join(label);
        write_good_adapter(&adapter_dir, 1);
        std::fs::write(adapter_dir.join("adapter_model.safetensors"), bytes).expect("weights");
        AdapterSource::trusted(adapter_dir)
    };
    let cases = [
        // A header length of 1 TiB: refused without allocating it.
        ("huge-header", [&(1u64 << 40).to_le_bytes()[..], header, data].concat(), "header claims"),
        ("truncated", weights[..weights.len() - 4].to_vec(), "bytes of tensors"),
        ("trailing", [&weights[..], &[0u8; 4][..]].concat(), "bytes of tensors"),
        ("tiny", vec![1, 2, 3], "fewer than a header length"),
    ];
    for (label, bytes, mentions) in cases {
        let err = refused(&engine, &with_bytes(label, bytes), label).await;
        assert_eq!(err.kind(), "adapter_files", "{label}: {err}");
        assert!(err.to_string().contains(mentions), "{label}: {err}");
    }
}
