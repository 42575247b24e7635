//! `loragate.TrainerClient`: the trainer's control calls of `loragate-client` for Python, each blocking with the
//! GIL released.

use std::path::PathBuf;

use loragate_client::{
    AdapterPayload, BearerKey, ClientError, PauseOptions, SwapOptions, TrainerClient as RustTrainer, connect,
};
use pyo3::prelude::*;

use crate::errors::to_py_err;
use crate::results::{AdapterStatus, PauseResult, ResumeResult, Staleness, SwapResult};
use crate::runtime::block_on;
use crate::sampling::seconds;
use crate::tensors::{config_json, tensors_of};
use crate::words::{kv_policy, pause_mode};

/// Controls the adapters of a loragate server, for trainers.
#[pyclass(frozen, module = "loragate")]
pub(crate) struct TrainerClient {
    client: RustTrainer,
    url: String,
}

impl TrainerClient {
    /// Runs a call of the Rust client with the GIL released and raises its failure.
    fn call<T, F>(&self, py: Python<'_>, call: impl FnOnce(RustTrainer) -> F) -> PyResult<T>
    where
        F: Future<Output = Result<T, ClientError>> + Send,
        T: Send,
    {
        block_on(py, call(self.client.clone()))?.map_err(|err| to_py_err(py, err))
    }
}

/// The swap options of `mode=` and `kv=`.
fn swap_options(mode: &str, kv: &str) -> Result<SwapOptions, ClientError> {
    Ok(SwapOptions { mode: pause_mode(mode)?, kv_policy: kv_policy(kv)? })
}

#[pymethods]
impl TrainerClient {
    /// Connects to `url` (`host:port` or `http://host:port`, the server's gRPC address); `admin_key` (or a tenant
    /// key that may control its adapters) is presented on every call.
    #[new]
    #[pyo3(signature = (url, admin_key=None))]
    fn new(py: Python<'_>, url: String, admin_key: Option<String>) -> PyResult<Self> {
        let connected = block_on(py, async {
            let key = BearerKey::optional(admin_key.as_deref(), "admin_key")?;
            Ok::<_, ClientError>(RustTrainer::with_key(connect(url.clone()).await?, key))
        })?;
        Ok(Self { client: connected.map_err(|err| to_py_err(py, err))?, url })
    }

    /// Pushes a new version of adapter `name` over the connection and has the server serve it (a name not loaded
    /// yet is loaded): from a PEFT directory on this machine (`path`), or from `tensors` (a dict of name to array:
    /// numpy, anything with `__array__` or DLPack, torch; float32, float16 or bfloat16 as they are) with their
    /// `config` (the `adapter_config.json` as a dict or a JSON string), serialized to safetensors in Rust. The
    /// server's pause while it installs the version is `mode` (`"keep"`, `"abort"` or `"wait"`) with `kv`
    /// (`"recompute"` or `"reuse"`).
    #[pyo3(signature = (name, path=None, tensors=None, config=None, mode="keep", kv="recompute"))]
    #[allow(clippy::too_many_arguments, reason = "the Python signature: keyword arguments with defaults")]
    fn push_adapter(
        &self,
        py: Python<'_>,
        name: String,
        path: Option<PathBuf>,
        tensors: Option<Bound<'_, PyAny>>,
        config: Option<Bound<'_, PyAny>>,
        mode: &str,
        kv: &str,
    ) -> PyResult<SwapResult> {
        let refuse = |field: &str, reason: &str| {
            to_py_err(py, ClientError::InvalidArgument { field: field.into(), reason: reason.into() })
        };
        let payload = match (path, tensors, config) {
            (Some(path), None, None) => AdapterPayload::Directory(path),
            (Some(_), None, Some(_)) => {
                return Err(refuse(
                    "config",
                    "a directory brings its own adapter_config.json; give config only with tensors",
                ));
            }
            (None, Some(tensors), Some(config)) => {
                AdapterPayload::Tensors { config_json: config_json(py, &config)?, tensors: tensors_of(py, &tensors)? }
            }
            (None, Some(_), None) => return Err(refuse("config", "tensors need their adapter_config.json as config")),
            (Some(_), Some(_), _) => return Err(refuse("tensors", "give either path or tensors, not both")),
            (None, None, _) => return Err(refuse("path", "give the adapter's directory as path, or its tensors")),
        };
        let options = swap_options(mode, kv).map_err(|err| to_py_err(py, err))?;
        self.call(py, |client| async move { client.push_adapter(&name, payload, options).await.map(SwapResult::from) })
    }

    /// The server's atomic swap: adapter `name` (loaded if it is not) gets the weights at `path`, a directory inside
    /// the server's adapter root, while its requests are paused as `mode` and `kv` say (keep: they continue on the
    /// new weights).
    #[pyo3(signature = (name, path, mode="keep", kv="recompute"))]
    fn swap_adapter(&self, py: Python<'_>, name: String, path: String, mode: &str, kv: &str) -> PyResult<SwapResult> {
        let options = swap_options(mode, kv).map_err(|err| to_py_err(py, err))?;
        self.call(
            py,
            |client| async move { client.swap_adapter_atomic(&name, &path, options).await.map(SwapResult::from) },
        )
    }

    /// Pauses adapter `name`: its new requests are held at the gate and its running ones aborted (handed back to
    /// their callers, who continue them), kept inside the server (`mode="keep"`) or waited for (`mode="wait"`).
    /// `owner` names the pause (the same owner renews it), `lease_s` ends it by itself.
    #[pyo3(signature = (name, mode="abort", owner="", lease_s=None, kv="recompute"))]
    fn pause(
        &self,
        py: Python<'_>,
        name: String,
        mode: &str,
        owner: &str,
        lease_s: Option<f64>,
        kv: &str,
    ) -> PyResult<PauseResult> {
        let options = (|| {
            Ok::<_, ClientError>(PauseOptions {
                mode: pause_mode(mode)?,
                owner: owner.to_owned(),
                lease: lease_s.map(|lease| seconds("lease_s", lease)).transpose()?,
                kv_policy: kv_policy(kv)?,
            })
        })()
        .map_err(|err| to_py_err(py, err))?;
        self.call(py, |client| async move { client.pause(&name, options).await.map(PauseResult::from) })
    }

    /// Releases the pause `pause_id`, or every pause of adapter `name`.
    #[pyo3(signature = (name, pause_id=None))]
    fn resume(&self, py: Python<'_>, name: String, pause_id: Option<String>) -> PyResult<ResumeResult> {
        self.call(py, |client| async move { client.resume(&name, pause_id.as_deref()).await.map(ResumeResult::from) })
    }

    /// Waits until adapter `name` is open: `True` as soon as it is, `False` if `timeout_s` passed first.
    #[pyo3(signature = (name, timeout_s=30.0))]
    fn wait_unpaused(&self, py: Python<'_>, name: String, timeout_s: f64) -> PyResult<bool> {
        if !(timeout_s.is_finite() && timeout_s >= 0.0) {
            let reason = format!("{timeout_s} is not a finite, non-negative number of seconds");
            return Err(to_py_err(py, ClientError::InvalidArgument { field: "timeout_s".into(), reason }));
        }
        let timeout = std::time::Duration::from_secs_f64(timeout_s);
        self.call(py, |client| async move { client.wait_unpaused(&name, timeout).await })
    }

    /// Bounds adapter `name`'s staleness at the server's gate: a trainer that consumes `batch_size` samples per
    /// version never receives one more than `max_staleness` versions old. `batch_size=0` clears it. Returns the
    /// policy in force, or `None`.
    #[pyo3(signature = (name, max_staleness, batch_size))]
    fn set_staleness(
        &self,
        py: Python<'_>,
        name: String,
        max_staleness: u32,
        batch_size: u32,
    ) -> PyResult<Option<Staleness>> {
        self.call(py, |client| async move {
            Ok(client.set_staleness(&name, max_staleness, batch_size).await?.map(Staleness::from))
        })
    }

    /// Every loaded adapter, by name.
    fn list_adapters(&self, py: Python<'_>) -> PyResult<Vec<AdapterStatus>> {
        self.call(py, |client| async move {
            Ok(client.list_adapters().await?.into_iter().map(AdapterStatus::from).collect())
        })
    }

    fn __repr__(&self) -> String {
        format!("TrainerClient({:?})", self.url)
    }
}
