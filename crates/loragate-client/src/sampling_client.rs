//! [`SamplingClient`]: samples through loragate's `Sampler` and turns aborted samples into finished ones.
//!
//! The algorithm (the contract's "retry client"): send the request; every sequence that comes back with
//! `FINISH_REASON_ABORT` keeps its partial tokens, logprobs and version segments, waits (`WaitLoraUnpaused`) until
//! its adapter reopens, and is resubmitted on its own with `prompt + accumulated tokens` and the remaining budget,
//! until it finishes for another reason. When the budget is used up it finishes with `LENGTH` without a request.
//! Sequences that finished are never redone. Prompt logprobs come from the first attempt, for the original prompt.

use futures::future::join_all;
use loragate_proto::v1::lora_control_client::LoraControlClient;
use loragate_proto::v1::sampler_client::SamplerClient;
use loragate_proto::v1::{
    FinishReason, SampleRequest, SampleResponse, SampledSequence, SamplingParams, WaitLoraUnpausedRequest,
};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::accumulate::SequenceAccumulator;
use crate::channel::{BearerKey, KeyedChannel, connect};
use crate::error::ClientError;
use crate::policy::RetryPolicy;

/// Samples from one adapter (or the base model), continuing aborted samples until they finish.
#[derive(Clone, Debug)]
pub struct SamplingClient {
    sampler: SamplerClient<KeyedChannel>,
    control: LoraControlClient<KeyedChannel>,
    lora_name: String,
    min_lora_version: u64,
    policy: RetryPolicy,
}

impl SamplingClient {
    /// Connects to a loragate gRPC endpoint (`http://host:port`); `lora_name` empty samples the base model.
    pub async fn connect(endpoint: impl Into<String>, lora_name: impl Into<String>) -> Result<Self, ClientError> {
        Ok(Self::new(connect(endpoint).await?, lora_name))
    }

    /// A client over an existing channel.
    pub fn new(channel: Channel, lora_name: impl Into<String>) -> Self {
        Self::with_key(channel, lora_name, BearerKey::none())
    }

    /// A client over an existing channel whose calls present `key` (a server started with `--api-key` or
    /// `--tenant-keys`).
    pub fn with_key(channel: Channel, lora_name: impl Into<String>, key: BearerKey) -> Self {
        Self {
            sampler: SamplerClient::with_interceptor(channel.clone(), key.clone()),
            control: LoraControlClient::with_interceptor(channel, key),
            lora_name: lora_name.into(),
            min_lora_version: 0,
            policy: RetryPolicy::default(),
        }
    }

    /// Replaces the retry policy.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Samples of [`SamplingClient::sample`] are served by version `min_lora_version` of the adapter or a later one
    /// (0: any): the server holds them at the gate until that version is installed, bounded by the deadline, and
    /// continuations of aborted sequences ask for the same minimum.
    pub fn with_min_lora_version(mut self, min_lora_version: u64) -> Self {
        self.min_lora_version = min_lora_version;
        self
    }

    /// The adapter this client samples from (empty: the base model).
    pub fn lora_name(&self) -> &str {
        &self.lora_name
    }

    /// The retry policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Samples `num_samples` sequences (0 means 1) from `prompt_token_ids`; every returned sequence is finished
    /// (`STOP` or `LENGTH`), whatever aborts happened on the way.
    pub async fn sample(
        &self,
        prompt_token_ids: Vec<u32>,
        params: SamplingParams,
        num_samples: u32,
    ) -> Result<SampleResponse, ClientError> {
        let request = SampleRequest {
            lora_name: self.lora_name.clone(),
            prompt_token_ids,
            sampling_params: Some(params),
            num_samples,
            min_lora_version: self.min_lora_version,
            ..SampleRequest::default()
        };
        self.sample_request(request).await
    }

    /// Like [`SamplingClient::sample`], for a full request (its own `lora_name`, `request_id`, prompt logprobs,
    /// `min_lora_version`, `cache_salt`; every continuation carries the same `min_lora_version` and `cache_salt`).
    pub async fn sample_request(&self, request: SampleRequest) -> Result<SampleResponse, ClientError> {
        let deadline = Instant::now() + self.policy.deadline;
        SampleRun { client: self, original: request, deadline }.run().await
    }
}

/// Why a sequence stopped being worked on without finishing.
enum Failure {
    Deadline,
    NoProgress(u32),
    Rejected(Status),
    Protocol(String),
}

/// How one sequence ended: finished, or given up with what it had.
struct SequenceEnd {
    sequence: SampledSequence,
    failure: Option<Failure>,
}

/// One `sample` call in progress.
struct SampleRun<'a> {
    client: &'a SamplingClient,
    original: SampleRequest,
    deadline: Instant,
}

impl SampleRun<'_> {
    async fn run(&self) -> Result<SampleResponse, ClientError> {
        let wanted = self.original.num_samples.max(1) as usize;
        let first = self.submit(self.original.clone()).await.map_err(|failure| self.error(failure, Vec::new()))?;
        if first.sequences.len() != wanted {
            return Err(ClientError::Protocol(format!("asked for {wanted} sequences, got {}", first.sequences.len())));
        }
        let mut prompt_logprobs = first.prompt_logprobs;
        prompt_logprobs.truncate(self.original.prompt_token_ids.len());

        let ends = join_all(first.sequences.into_iter().enumerate().map(|(index, attempt)| async move {
            let mut accumulated = SequenceAccumulator::default();
            if let Err(err) = accumulated.append(&attempt) {
                return SequenceEnd { sequence: accumulated.finish(FinishReason::Abort), failure: Some(protocol(err)) };
            }
            let no_progress = u32::from(attempt.token_ids.is_empty());
            match attempt.finish_reason() {
                FinishReason::Abort => self.continue_sequence(index as u32, accumulated, no_progress).await,
                FinishReason::Unspecified => SequenceEnd {
                    sequence: accumulated.finish(FinishReason::Abort),
                    failure: Some(Failure::Protocol("a sequence came back without a finish reason".into())),
                },
                finished => SequenceEnd { sequence: accumulated.finish(finished), failure: None },
            }
        }))
        .await;

        let mut failure = None;
        let mut sequences = Vec::with_capacity(ends.len());
        for end in ends {
            failure = failure.or(end.failure);
            sequences.push(end.sequence);
        }
        let response = SampleResponse { request_id: first.request_id, sequences, prompt_logprobs };
        match failure {
            None => Ok(response),
            Some(failure) => Err(self.error(failure, response.sequences).with_request_id(response.request_id)),
        }
    }

    /// Continues sequence `index` (aborted, with `accumulated` so far) until it finishes or must be given up.
    async fn continue_sequence(
        &self,
        index: u32,
        mut accumulated: SequenceAccumulator,
        mut no_progress: u32,
    ) -> SequenceEnd {
        let params = self.original.sampling_params.clone().unwrap_or_default();
        let give_up = |accumulated: SequenceAccumulator, failure| SequenceEnd {
            sequence: accumulated.finish(FinishReason::Abort),
            failure: Some(failure),
        };
        loop {
            if no_progress >= self.client.policy.max_attempts_without_progress {
                return give_up(accumulated, Failure::NoProgress(no_progress));
            }
            let remaining = match params.max_tokens {
                Some(budget) if accumulated.len() >= budget => {
                    return SequenceEnd { sequence: accumulated.finish(FinishReason::Length), failure: None };
                }
                budget => budget.map(|budget| budget - accumulated.len()),
            };
            if let Err(failure) = self.wait_until_open().await {
                return give_up(accumulated, failure);
            }
            let mut prompt = self.original.prompt_token_ids.clone();
            prompt.extend_from_slice(accumulated.token_ids());
            let continuation = SampleRequest {
                request_id: continuation_id(&self.original.request_id, index),
                lora_name: self.original.lora_name.clone(),
                prompt_token_ids: prompt,
                sampling_params: Some(SamplingParams {
                    max_tokens: remaining,
                    seed: params.seed.map(|seed| seed.wrapping_add(u64::from(index))),
                    ..params.clone()
                }),
                num_samples: 1,
                include_prompt_logprobs: false,
                min_lora_version: self.original.min_lora_version,
                cache_salt: self.original.cache_salt.clone(),
            };
            let attempt = match self.submit(continuation).await {
                Ok(mut response) if response.sequences.len() == 1 => response.sequences.remove(0),
                Ok(response) => {
                    let got = response.sequences.len();
                    return give_up(accumulated, Failure::Protocol(format!("asked for 1 sequence, got {got}")));
                }
                Err(failure) => return give_up(accumulated, failure),
            };
            if let Err(err) = accumulated.append(&attempt) {
                return give_up(accumulated, protocol(err));
            }
            match attempt.finish_reason() {
                FinishReason::Abort if attempt.token_ids.is_empty() => no_progress += 1,
                FinishReason::Abort => no_progress = 0,
                FinishReason::Unspecified => {
                    let failure = Failure::Protocol("a sequence came back without a finish reason".into());
                    return give_up(accumulated, failure);
                }
                finished => return SequenceEnd { sequence: accumulated.finish(finished), failure: None },
            }
        }
    }

    /// Sends one request, retrying transport failures with backoff until the deadline.
    async fn submit(&self, request: SampleRequest) -> Result<SampleResponse, Failure> {
        let mut retries = 0;
        loop {
            let remaining = self.remaining().ok_or(Failure::Deadline)?;
            let mut call = tonic::Request::new(request.clone());
            call.set_timeout(remaining);
            match self.client.sampler.clone().sample(call).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) if is_transient(&status) => {
                    tracing::debug!(%status, retries, "sample attempt failed; retrying");
                    self.back_off(retries).await?;
                    retries += 1;
                }
                Err(status) => return Err(Failure::Rejected(status)),
            }
        }
    }

    /// Long-polls until the adapter is open (the base model cannot be paused by the control RPCs).
    async fn wait_until_open(&self) -> Result<(), Failure> {
        if self.original.lora_name.is_empty() {
            return Ok(());
        }
        let mut retries = 0;
        loop {
            let remaining = self.remaining().ok_or(Failure::Deadline)?;
            let poll = remaining.min(self.client.policy.wait_poll);
            let mut call = tonic::Request::new(WaitLoraUnpausedRequest {
                lora_name: self.original.lora_name.clone(),
                timeout_s: poll.as_secs_f64(),
            });
            call.set_timeout(remaining);
            match self.client.control.clone().wait_lora_unpaused(call).await {
                Ok(answer) if !answer.get_ref().paused => return Ok(()),
                Ok(_still_paused) => {}
                Err(status) if is_transient(&status) => {
                    self.back_off(retries).await?;
                    retries += 1;
                }
                Err(status) => return Err(Failure::Rejected(status)),
            }
        }
    }

    async fn back_off(&self, retries: u32) -> Result<(), Failure> {
        let remaining = self.remaining().ok_or(Failure::Deadline)?;
        tokio::time::sleep(self.client.policy.backoff(retries).min(remaining)).await;
        Ok(())
    }

    fn remaining(&self) -> Option<std::time::Duration> {
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        (!remaining.is_zero()).then_some(remaining)
    }

    fn error(&self, failure: Failure, sequences: Vec<SampledSequence>) -> ClientError {
        let partial = || {
            Box::new(SampleResponse {
                request_id: self.original.request_id.clone(),
                sequences,
                prompt_logprobs: Vec::new(),
            })
        };
        match failure {
            Failure::Deadline => ClientError::DeadlineExceeded { partial: partial() },
            Failure::NoProgress(attempts) => ClientError::NoProgress { attempts, partial: partial() },
            Failure::Rejected(status) => ClientError::Rejected(status),
            Failure::Protocol(message) => ClientError::Protocol(message),
        }
    }
}

impl ClientError {
    fn with_request_id(mut self, request_id: String) -> Self {
        if let Self::DeadlineExceeded { partial } | Self::NoProgress { partial, .. } = &mut self {
            partial.request_id = request_id;
        }
        self
    }
}

fn protocol(err: ClientError) -> Failure {
    Failure::Protocol(err.to_string())
}

/// A continuation's request id: traceable to the original, unique per sequence (empty stays empty: the server
/// makes one).
fn continuation_id(original: &str, sequence: u32) -> String {
    if original.is_empty() { String::new() } else { format!("{original}/seq{sequence}") }
}

/// Failures of the transport or the server's capacity, which a later attempt may not meet.
fn is_transient(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::Unknown
            | Code::Cancelled
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Aborted
    )
}

#[cfg(test)]
mod tests;
