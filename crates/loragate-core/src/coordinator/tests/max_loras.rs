//! `--max-loras`: loads under new names past the cap are refused (racing or not), reloads of a loaded name are not,
//! an unload frees a place, and `vllm:lora_requests_info` reports the cap as `max_lora`.

use super::*;
use crate::contract::ErrorClass;

async fn capped(max_loras: usize, adapters: &[&str]) -> Coordinator {
    let config = CoordinatorConfig { max_loras: Some(max_loras), ..CoordinatorConfig::default() };
    coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), config, adapters).await
}

#[tokio::test]
async fn a_new_name_past_the_cap_is_refused_a_reload_is_not_and_an_unload_frees_a_place() {
    let coordinator = capped(2, &["meow", "woof"]).await;
    let err = coordinator.load_adapter(&name("purr"), AdapterSource::trusted("/a/purr")).await.expect_err("capped");
    assert!(matches!(err, CoreError::TooManyAdapters { max_loras: 2 }), "{err:?}");
    assert_eq!(err.class(), ErrorClass::Overloaded);
    assert!(err.to_string().contains("--max-loras 2"), "{err}");
    let listed: Vec<AdapterKey> = coordinator.statuses().await.into_iter().map(|status| status.key).collect();
    assert!(!listed.contains(&AdapterKey::Lora(name("purr"))), "nothing kept of the refused load: {listed:?}");
    coordinator.load_adapter(&name("meow"), AdapterSource::trusted("/a/meow-2")).await.expect("a reload swaps");
    coordinator.unload_adapter(&name("woof")).await.expect("unload");
    coordinator.load_adapter(&name("purr"), AdapterSource::trusted("/a/purr")).await.expect("a place is free");
}

#[tokio::test]
async fn racing_loads_of_new_names_never_pass_the_cap() {
    let coordinator = capped(3, &[]).await;
    let loads = (0..12).map(|index| {
        let coordinator = coordinator.clone();
        tokio::spawn(async move {
            coordinator.load_adapter(&name(&format!("a{index}")), AdapterSource::trusted(format!("/a/{index}"))).await
        })
    });
    let mut loaded = 0;
    for load in loads.collect::<Vec<_>>() {
        match load.await.expect("the load task") {
            Ok(_) => loaded += 1,
            Err(err) => assert!(matches!(err, CoreError::TooManyAdapters { max_loras: 3 }), "{err:?}"),
        }
    }
    assert_eq!(loaded, 3, "exactly --max-loras loads succeed, however they race");
}

#[tokio::test]
async fn the_endpoint_pickers_max_lora_is_the_cap() {
    let coordinator = capped(4, &["meow"]).await;
    coordinator.metrics().set_adapter_gauges(&coordinator.statuses().await);
    let mut registry = prometheus_client::registry::Registry::default();
    coordinator.metrics().register_vllm(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoded");
    assert!(text.contains("max_lora=\"4\""), "{text}");
}
