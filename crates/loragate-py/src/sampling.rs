//! `loragate.SamplingClient`: the retry client of `loragate-client` (aborted sequences continued token-exact, the
//! accumulators, the deadline, the back-off), for Python: `sample` blocks with the GIL released, `sample_async` is an
//! asyncio awaitable.

use std::time::{Duration, Instant};

use loragate_client::{BearerKey, ClientError, RetryPolicy, SamplingClient as RetryClient, connect};
use loragate_proto::v1::{SampleRequest, SamplingParams};
use pyo3::prelude::*;

use crate::errors::to_py_err;
use crate::results::SampleResult;
use crate::runtime::block_on;

/// Samples from a loragate server and turns aborted samples into finished ones.
#[pyclass(frozen, module = "loragate")]
pub(crate) struct SamplingClient {
    client: RetryClient,
    url: String,
}

/// One `sample` call's arguments, as Python passed them.
struct SampleArgs {
    lora_name: String,
    prompt_token_ids: Vec<u32>,
    max_tokens: Option<u32>,
    num_samples: u32,
    params: SamplingParams,
    include_prompt_logprobs: bool,
    min_lora_version: u64,
    request_id: Option<String>,
    cache_salt: Option<String>,
    timeout_s: Option<f64>,
}

impl SampleArgs {
    /// The request and the retry client that runs it (with the call's deadline).
    fn into_call(self, client: &RetryClient) -> Result<(RetryClient, SampleRequest), ClientError> {
        if self.num_samples == 0 {
            return Err(ClientError::InvalidArgument {
                field: "num_samples".into(),
                reason: "must be at least 1".into(),
            });
        }
        let client = match self.timeout_s {
            None => client.clone(),
            Some(timeout_s) => {
                let deadline = seconds("timeout_s", timeout_s)?;
                client.clone().with_policy(RetryPolicy { deadline, ..client.policy().clone() })
            }
        };
        let request = SampleRequest {
            request_id: self.request_id.unwrap_or_default(),
            lora_name: self.lora_name,
            prompt_token_ids: self.prompt_token_ids,
            sampling_params: Some(SamplingParams { max_tokens: self.max_tokens, ..self.params }),
            num_samples: self.num_samples,
            include_prompt_logprobs: self.include_prompt_logprobs,
            min_lora_version: self.min_lora_version,
            cache_salt: self.cache_salt.unwrap_or_default(),
        };
        Ok((client, request))
    }
}

/// A positive, finite number of seconds, refused naming `field` otherwise.
pub(crate) fn seconds(field: &str, value: f64) -> Result<Duration, ClientError> {
    if value.is_finite() && value > 0.0 {
        Duration::try_from_secs_f64(value)
            .map_err(|err| ClientError::InvalidArgument { field: field.into(), reason: err.to_string() })
    } else {
        Err(ClientError::InvalidArgument {
            field: field.into(),
            reason: format!("{value} is not a positive number of seconds"),
        })
    }
}

#[pymethods]
impl SamplingClient {
    /// Connects to `url` (`host:port` or `http://host:port`, the server's gRPC address); `api_key` is presented on
    /// every call. `timeout_s` bounds each `sample` (waits and retries included) unless the call says otherwise;
    /// `max_attempts_without_progress` bounds aborted attempts in a row that produced no token.
    #[new]
    #[pyo3(signature = (url, api_key=None, *, timeout_s=600.0, max_attempts_without_progress=8))]
    fn new(
        py: Python<'_>,
        url: String,
        api_key: Option<String>,
        timeout_s: f64,
        max_attempts_without_progress: u32,
    ) -> PyResult<Self> {
        let connected = block_on(py, async {
            let key = BearerKey::optional(api_key.as_deref(), "api_key")?;
            let deadline = seconds("timeout_s", timeout_s)?;
            let channel = connect(url.clone()).await?;
            let policy = RetryPolicy { deadline, max_attempts_without_progress, ..RetryPolicy::default() };
            Ok::<_, ClientError>(RetryClient::with_key(channel, "", key).with_policy(policy))
        })?;
        let client = connected.map_err(|err| to_py_err(py, err))?;
        Ok(Self { client, url })
    }

    /// Samples `num_samples` sequences of `lora_name` (empty: the base model) from `prompt_token_ids`, each
    /// continued through aborts until it finishes (`"stop"` or `"length"`). Blocks with the GIL released.
    #[pyo3(signature = (
        lora_name, prompt_token_ids, max_tokens=None, num_samples=1, *, temperature=1.0, top_p=None, top_k=0,
        seed=None, stop_token_ids=None, ignore_eos=false, min_p=0.0, repetition_penalty=None, presence_penalty=0.0,
        frequency_penalty=0.0, min_tokens=0, include_prompt_logprobs=false, min_lora_version=0, request_id=None,
        cache_salt=None, timeout_s=None
    ))]
    #[allow(clippy::too_many_arguments, reason = "the Python signature: keyword arguments with defaults")]
    fn sample(
        &self,
        py: Python<'_>,
        lora_name: String,
        prompt_token_ids: Vec<u32>,
        max_tokens: Option<u32>,
        num_samples: u32,
        temperature: f32,
        top_p: Option<f32>,
        top_k: i32,
        seed: Option<u64>,
        stop_token_ids: Option<Vec<u32>>,
        ignore_eos: bool,
        min_p: f32,
        repetition_penalty: Option<f32>,
        presence_penalty: f32,
        frequency_penalty: f32,
        min_tokens: u32,
        include_prompt_logprobs: bool,
        min_lora_version: u64,
        request_id: Option<String>,
        cache_salt: Option<String>,
        timeout_s: Option<f64>,
    ) -> PyResult<SampleResult> {
        let args = SampleArgs {
            lora_name,
            prompt_token_ids,
            max_tokens,
            num_samples,
            params: SamplingParams {
                temperature,
                top_p,
                top_k,
                seed,
                stop_token_ids: stop_token_ids.unwrap_or_default(),
                ignore_eos,
                min_p,
                repetition_penalty,
                presence_penalty,
                frequency_penalty,
                min_tokens,
                max_tokens: None,
            },
            include_prompt_logprobs,
            min_lora_version,
            request_id,
            cache_salt,
            timeout_s,
        };
        let (client, request) = args.into_call(&self.client).map_err(|err| to_py_err(py, err))?;
        let sampled = block_on(py, async move { client.sample_request(request).await })?;
        let response = sampled.map_err(|err| to_py_err(py, err))?;
        Ok(SampleResult::from_response(response, include_prompt_logprobs))
    }

    /// `sample` as an asyncio awaitable: the sample runs on the module's tokio runtime, the event loop stays free.
    /// Cancelling the awaiting task cancels the sample.
    #[pyo3(signature = (
        lora_name, prompt_token_ids, max_tokens=None, num_samples=1, *, temperature=1.0, top_p=None, top_k=0,
        seed=None, stop_token_ids=None, ignore_eos=false, min_p=0.0, repetition_penalty=None, presence_penalty=0.0,
        frequency_penalty=0.0, min_tokens=0, include_prompt_logprobs=false, min_lora_version=0, request_id=None,
        cache_salt=None, timeout_s=None
    ))]
    #[allow(clippy::too_many_arguments, reason = "the Python signature: keyword arguments with defaults")]
    fn sample_async<'py>(
        &self,
        py: Python<'py>,
        lora_name: String,
        prompt_token_ids: Vec<u32>,
        max_tokens: Option<u32>,
        num_samples: u32,
        temperature: f32,
        top_p: Option<f32>,
        top_k: i32,
        seed: Option<u64>,
        stop_token_ids: Option<Vec<u32>>,
        ignore_eos: bool,
        min_p: f32,
        repetition_penalty: Option<f32>,
        presence_penalty: f32,
        frequency_penalty: f32,
        min_tokens: u32,
        include_prompt_logprobs: bool,
        min_lora_version: u64,
        request_id: Option<String>,
        cache_salt: Option<String>,
        timeout_s: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let args = SampleArgs {
            lora_name,
            prompt_token_ids,
            max_tokens,
            num_samples,
            params: SamplingParams {
                temperature,
                top_p,
                top_k,
                seed,
                stop_token_ids: stop_token_ids.unwrap_or_default(),
                ignore_eos,
                min_p,
                repetition_penalty,
                presence_penalty,
                frequency_penalty,
                min_tokens,
                max_tokens: None,
            },
            include_prompt_logprobs,
            min_lora_version,
            request_id,
            cache_salt,
            timeout_s,
        };
        let (client, request) = args.into_call(&self.client).map_err(|err| to_py_err(py, err))?;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            match client.sample_request(request).await {
                Ok(response) => Ok(SampleResult::from_response(response, include_prompt_logprobs)),
                Err(err) => Err(Python::attach(|py| to_py_err(py, err))),
            }
        })
    }

    /// The benchmark's peer (`scripts/bench-python-client.py`): `rounds` greedy samples of `max_tokens` tokens run
    /// one after another by the Rust client alone, over this client's connection, with no Python in between.
    /// Returns each one's latency in seconds.
    #[pyo3(signature = (lora_name, prompt_token_ids, max_tokens, rounds))]
    fn _rust_sample_latencies(
        &self,
        py: Python<'_>,
        lora_name: String,
        prompt_token_ids: Vec<u32>,
        max_tokens: u32,
        rounds: u32,
    ) -> PyResult<Vec<f64>> {
        let client = self.client.clone();
        let measured = block_on(py, async move {
            let mut latencies = Vec::with_capacity(rounds as usize);
            for _ in 0..rounds {
                let request = SampleRequest {
                    lora_name: lora_name.clone(),
                    prompt_token_ids: prompt_token_ids.clone(),
                    sampling_params: Some(SamplingParams { max_tokens: Some(max_tokens), ..Default::default() }),
                    num_samples: 1,
                    ..Default::default()
                };
                let started = Instant::now();
                client.sample_request(request).await?;
                latencies.push(started.elapsed().as_secs_f64());
            }
            Ok::<_, ClientError>(latencies)
        })?;
        measured.map_err(|err| to_py_err(py, err))
    }

    fn __repr__(&self) -> String {
        format!("SamplingClient({:?})", self.url)
    }
}
