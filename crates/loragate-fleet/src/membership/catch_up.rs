//! Bringing one worker to the fleet's adapter set: check that it serves enough context, load every `NAME@V` it
//! lacks, unload the `NAME@V` copies the fleet no longer wants (left from before a restart of the coordinator, or
//! retired while the worker was unreachable). Adapters not named like the fleet's are someone else's and stay.

use std::collections::{BTreeMap, BTreeSet};

use vllm_proto as pb;

use super::MembershipSettings;
use crate::address::is_versioned_name;
use crate::link::{WorkerLink, bounded};

/// Catches `link`'s worker up with `desired` (engine-side name → source path). Answers the adapters it holds after.
pub(super) async fn catch_up(
    link: &WorkerLink,
    desired: &BTreeMap<String, String>,
    settings: &MembershipSettings,
) -> Result<BTreeSet<String>, String> {
    let timeout = settings.adapter_timeout;
    let describe = |what: &str, status: tonic::Status| format!("{what}: {}: {}", status.code(), status.message());
    let info = bounded(timeout, link.control().get_server_info(pb::GetServerInfoRequest {}))
        .await
        .map_err(|status| describe("GetServerInfo", status))?;
    if info.max_model_len != 0 && info.max_model_len < settings.context_length {
        return Err(format!(
            "it serves {} tokens of context; the fleet's model needs {}",
            info.max_model_len, settings.context_length
        ));
    }
    let listed = bounded(timeout, link.control().list_loras(pb::ListLorasRequest {}))
        .await
        .map_err(|status| describe("ListLoras", status))?;
    let sources: BTreeMap<String, String> =
        listed.adapters.into_iter().map(|adapter| (adapter.lora_name, adapter.source_path)).collect();
    let mut held: BTreeSet<String> = sources.keys().cloned().collect();

    for (engine_name, source_path) in desired {
        if sources.get(engine_name) == Some(source_path) {
            continue;
        }
        // Missing, or a copy from elsewhere under the same name (a rolled-back staging of a reused version
        // number): load it from the fleet's source.
        link.replace_lora(engine_name, source_path, timeout)
            .await
            .map_err(|status| describe(&format!("loading {engine_name}"), status))?;
        held.insert(engine_name.clone());
    }
    let stale: Vec<String> =
        held.iter().filter(|name| is_versioned_name(name) && !desired.contains_key(*name)).cloned().collect();
    for engine_name in stale {
        link.unload_lora(&engine_name, timeout)
            .await
            .map_err(|status| describe(&format!("unloading {engine_name}"), status))?;
        held.remove(&engine_name);
    }
    Ok(held)
}
