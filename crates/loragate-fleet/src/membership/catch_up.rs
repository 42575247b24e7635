//! Bringing one worker to the fleet's adapter set, whatever its protocol: check that it serves enough context, load
//! every `NAME@V` it lacks (delivered as staging delivers it: pushed versions streamed, others by path), replace
//! copies loaded from elsewhere (or from a source the worker does not report), unload the `NAME@V` copies the fleet no longer wants (left
//! from before a restart of the coordinator, or retired while the worker was unreachable). Adapters not named like
//! the fleet's are someone else's and stay.

use std::collections::{BTreeMap, BTreeSet};

use super::MembershipSettings;
use crate::address::is_versioned_name;
use crate::delivery::Delivery;
use crate::link::WorkerLink;

/// Catches `link`'s worker up with `desired` (engine-side name → how it is delivered). Answers the `NAME@V` adapters it
/// holds after.
pub(super) async fn catch_up(
    link: &WorkerLink,
    desired: &BTreeMap<String, Delivery>,
    settings: &MembershipSettings,
) -> Result<BTreeSet<String>, String> {
    let timeout = settings.adapter_timeout;
    let facts = link.client().describe(timeout).await.map_err(|err| format!("describing itself: {err}"))?;
    if let Some(served) = facts.context_length
        && served < settings.context_length
    {
        return Err(format!(
            "it serves {served} tokens of context; the fleet's model needs {}",
            settings.context_length
        ));
    }
    let mut held: BTreeSet<String> = facts.adapters.keys().cloned().collect();
    for (engine_name, delivery) in desired {
        if facts.adapters.get(engine_name).is_some_and(|held_from| delivery.is_held_as(held_from.as_deref())) {
            continue;
        }
        // Missing, or a copy from elsewhere (or from a path it does not say) under the same name (a rolled-back
        // staging of a reused version number): load it from the fleet's source.
        if held.contains(engine_name) {
            link.unload_adapter(engine_name, timeout).await.map_err(|err| format!("unloading {engine_name}: {err}"))?;
        }
        link.replace_adapter(engine_name, delivery, timeout)
            .await
            .map_err(|err| format!("loading {engine_name}: {err}"))?;
        held.insert(engine_name.clone());
    }
    // Adapters not named like the fleet's are someone else's: they stay, and are not the fleet's account.
    held.retain(|name| is_versioned_name(name));
    let stale: Vec<String> = held.iter().filter(|name| !desired.contains_key(*name)).cloned().collect();
    for engine_name in stale {
        link.unload_adapter(&engine_name, timeout).await.map_err(|err| format!("unloading {engine_name}: {err}"))?;
        held.remove(&engine_name);
    }
    Ok(held)
}
