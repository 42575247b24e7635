//! The adapters `serve` loads at start: the demo's (unless an `--adapter` of the same name replaces one) and the
//! `--adapter` ones, squared with what the state recorded.

use std::path::PathBuf;

use loragate_core::{AdapterRoot, AdapterSource, Coordinator, Reconciled};

use crate::error::ServeError;
use crate::model::{InitialAdapter, ResolvedModel};

/// The adapters to load at start: the demo's first, then `given`. For a fleet's workers (`root` then being the
/// workers' tree, if any), their paths as the workers see them: absolute, inside the adapter root if there is one
/// (the demo's adapters are its `meow` and `woof`).
pub(super) async fn initial_adapters(
    model: &ResolvedModel,
    given: &[InitialAdapter],
    for_workers: bool,
    root: Option<&AdapterRoot>,
) -> Result<Vec<InitialAdapter>, ServeError> {
    let demo = model.demo_adapters.iter().filter(|demo| !given.iter().any(|adapter| adapter.name == demo.name));
    if !for_workers {
        return Ok(demo.chain(given).cloned().collect());
    }
    let mut adapters = Vec::with_capacity(model.demo_adapters.len() + given.len());
    for demo in demo {
        adapters.push(as_workers_see_it(demo.clone(), true, root).await?);
    }
    for adapter in given {
        adapters.push(as_workers_see_it(adapter.clone(), false, root).await?);
    }
    Ok(adapters)
}

/// Loads each adapter, or keeps it as the state recorded it.
pub(super) async fn load_initial_adapters(
    coordinator: &Coordinator,
    adapters: Vec<InitialAdapter>,
) -> Result<(), ServeError> {
    for InitialAdapter { name, dir } in adapters {
        let reconciled = coordinator.reconcile_adapter(&name, AdapterSource::trusted(&dir)).await;
        match reconciled.map_err(|source| ServeError::Adapter { name: name.clone(), dir, source })? {
            // The coordinator logs the load.
            Reconciled::Loaded(_) => {}
            Reconciled::Kept(version) => tracing::info!(adapter = %name, %version, "adapter kept as recorded"),
        }
    }
    Ok(())
}

/// An adapter loaded at start as a fleet's workers are sent it, without touching the filesystem (the path is the
/// workers'): inside the adapter root if there is one (relative paths taken from it, no `..`, an absolute path under
/// it; the demo's adapters are the root's `meow` and `woof`), else absolute (relative to the current directory).
async fn as_workers_see_it(
    adapter: InitialAdapter,
    is_demo: bool,
    root: Option<&AdapterRoot>,
) -> Result<InitialAdapter, ServeError> {
    let InitialAdapter { name, dir } = adapter;
    let Some(root) = root else {
        let absolute = std::path::absolute(&dir).map_err(|source| ServeError::AdapterRoot { path: dir, source })?;
        return Ok(InitialAdapter { name, dir: absolute });
    };
    let requested = if is_demo { PathBuf::from(name.as_str()) } else { dir.clone() };
    match root.resolve(&requested.to_string_lossy()).await {
        Ok(source) => Ok(InitialAdapter { name, dir: source.dir().to_owned() }),
        Err(_) => Err(ServeError::AdapterOutsideRoot { name, dir, root: root.path().to_owned() }),
    }
}
