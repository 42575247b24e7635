//! vLLM's OpenAI-compatible HTTP server (`vllm serve MODEL --enable-lora`, runtime LoRA updates on).
//!
//! - Sampling by token ids, streamed: `POST /inference/v1/generate` (`token_ids`, `sampling_params`, our
//!   `request_id`) where the server has it and `/inference/v1/abort_requests` too (vLLM ≥ 0.32 with
//!   `--enable-scale-out`); else `POST /v1/completions` with `prompt` as token ids, `return_token_ids` and
//!   `return_tokens_as_token_ids`. Both are probed whenever the worker joins: a route serves where it answers the
//!   probe with a success or a 400/422 (vLLM 0.32 without `--enable-scale-out` answers them 403).
//! - Every request carries its real budget (`max_tokens`) and `logprobs` (0, or the candidates asked for).
//! - The prompt's logprobs come from a separate, unstreamed `/v1/completions` scoring request (`max_tokens` 1,
//!   `prompt_logprobs`) before the sequence's stream: every vLLM version answers it alike, with each prompt token's
//!   rank.
//! - Abort: `POST /inference/v1/abort_requests {"request_ids": [...]}` with the id the server reported in the
//!   stream (the abort finish, or the stream's end, acknowledges it); over `/v1/completions`, closing the stream
//!   (vLLM aborts a request whose client went away), with no acknowledgement.
//! - Adapters: `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`, `/v1/unload_lora_adapter`; listed (with
//!   their paths) by `GET /v1/models`, which also gives `max_model_len`. Health: `GET /health`. vLLM's global
//!   `/pause` is never used.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use loragate_core::{FinishReason, SampleRequest, TopLogprobs};
use serde_json::{Map, Value, json};

use super::http::{
    Events, HttpEndpoint, Refusal, SCORING_TIMEOUT, SamplingNames, logprob, sampling_fields, scored_then_opened,
    stream_error, streamed_events, token_id, token_ids,
};
use super::{
    AbortBy, ClientSettings, OpenedSequence, SequenceEvent, SequenceRequest, WorkerClient, WorkerError, WorkerFacts,
    most_likely, rank_among,
};
use crate::address::WorkerAddress;
use crate::delivery::Delivery;

/// A vLLM HTTP worker.
pub(crate) struct VllmHttpWorker {
    http: HttpEndpoint,
    /// The server has `/inference/v1/generate` and `/inference/v1/abort_requests` (probed by `describe`).
    token_api: AtomicBool,
}

impl VllmHttpWorker {
    /// A client of the worker at `address`.
    pub(crate) fn new(address: &WorkerAddress, settings: ClientSettings) -> Result<Self, WorkerError> {
        Ok(Self { http: HttpEndpoint::new(address, settings)?, token_api: AtomicBool::new(false) })
    }

    /// Whether `path` serves on this server: a success or a refusal of the probe's body (400/422) says it does.
    /// Anything else says it does not: 404/405 (no such route: vLLM before 0.32), 403 (vLLM 0.32 registers the token
    /// API's routes without `--enable-scale-out` but answers them "Scale-out endpoints are disabled"), 401, 5xx.
    async fn serves(&self, path: &str, body: &Value, timeout: Duration) -> Result<bool, WorkerError> {
        Ok(match self.http.post(path, body, timeout).await? {
            Ok(_) => true,
            Err(refusal) => {
                let serves = matches!(refusal.status.as_u16(), 400 | 422);
                if !serves {
                    tracing::debug!(path, status = %refusal.status, message = %refusal.message, "vLLM's token API is off");
                }
                serves
            }
        })
    }

    async fn score_prompt(&self, sequence: &SequenceRequest<'_>) -> Result<SequenceEvent, WorkerError> {
        let request = sequence.request;
        let top = request.prompt_top_logprobs();
        let mut body = json!({
            "prompt": request.prompt().to_vec(),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": top.unwrap_or(0),
        });
        if !sequence.engine_name.is_empty() {
            body["model"] = json!(sequence.engine_name);
        }
        let answer = self.http.post("/v1/completions", &body, SCORING_TIMEOUT).await?.map_err(Refusal::into_error)?;
        prompt_logprobs(&answer["choices"][0]["prompt_logprobs"], request.prompt(), top)
    }

    /// Starts the generation of `sequence`: on the token API (`/inference/v1/generate`, aborted by the id the server
    /// names in its first chunk) where the server has it, else on `/v1/completions` (aborted by disconnecting).
    async fn open(&self, sequence: &SequenceRequest<'_>) -> Result<(Events, AbortBy), WorkerError> {
        let request = sequence.request;
        let candidates = request.params().top_logprobs();
        let sampling = sampling_params(request, sequence.sequence);
        let model = (!sequence.engine_name.is_empty()).then(|| sequence.engine_name.to_owned());
        if self.token_api.load(Ordering::Acquire) {
            let mut body = json!({
                "request_id": sequence.request_id,
                "token_ids": request.prompt().to_vec(),
                "sampling_params": sampling,
                "stream": true,
            });
            if let Some(model) = model {
                body["model"] = json!(model);
            }
            let response = self.http.post_stream("/inference/v1/generate", &body).await?;
            let server_id = Arc::new(OnceLock::new());
            let events = token_stream(response, candidates, server_id.clone(), generate_chunk);
            Ok((events, AbortBy::Call(server_id)))
        } else {
            let mut body = Value::Object(sampling);
            body["prompt"] = json!(request.prompt().to_vec());
            body["stream"] = json!(true);
            body["return_token_ids"] = json!(true);
            body["return_tokens_as_token_ids"] = json!(true);
            if let Some(model) = model {
                body["model"] = json!(model);
            }
            let response = self.http.post_stream("/v1/completions", &body).await?;
            Ok((token_stream(response, candidates, Arc::new(OnceLock::new()), completion_chunk), AbortBy::Disconnect))
        }
    }

    /// Asks the server to load `engine_name` from `path`.
    async fn load_path(&self, engine_name: &str, path: String, timeout: Duration) -> Result<(), WorkerError> {
        let body = json!({"lora_name": engine_name, "lora_path": path});
        match self.http.post("/v1/load_lora_adapter", &body, timeout).await? {
            Ok(_) => Ok(()),
            Err(refusal) if refusal.no_such_route => Err(WorkerError::FailedPrecondition(
                "the server loads no adapters at run time: start vLLM with --enable-lora and \
                 VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
                    .into(),
            )),
            Err(refusal) if refusal.says_already_loaded() => Err(WorkerError::AlreadyExists(refusal.message)),
            // vLLM answers a path without an adapter 404 ("No adapter found"): the files are the problem.
            Err(refusal) if refusal.status.as_u16() == 404 => {
                Err(WorkerError::InvalidArgument(format!("{} {}", refusal.status.as_u16(), refusal.message)))
            }
            Err(refusal) => Err(refusal.into_error()),
        }
    }

    /// Asks the server to unload `engine_name`.
    async fn unload_only(&self, engine_name: &str, timeout: Duration) -> Result<(), WorkerError> {
        match self.http.post("/v1/unload_lora_adapter", &json!({"lora_name": engine_name}), timeout).await? {
            Ok(_) => Ok(()),
            Err(refusal) if refusal.no_such_route => {
                Err(WorkerError::FailedPrecondition("the server unloads no adapters at run time".into()))
            }
            Err(refusal) if refusal.message.to_ascii_lowercase().contains("not be found") => {
                Err(WorkerError::NotFound(refusal.message))
            }
            Err(refusal) => Err(refusal.into_error()),
        }
    }
}

#[async_trait::async_trait]
impl WorkerClient for VllmHttpWorker {
    async fn check_health(&self, timeout: Duration) -> Result<(), WorkerError> {
        self.http.health(timeout).await
    }

    async fn describe(&self, timeout: Duration) -> Result<WorkerFacts, WorkerError> {
        let facts = self.http.models(timeout).await?;
        // An empty body: refused (400) where the route serves, without starting anything.
        let generate = self.serves("/inference/v1/generate", &json!({}), timeout).await?;
        // An id nothing runs under, never an empty list (see `abort`).
        let probe = json!({"request_ids": ["loragate-probe"]});
        let abort = generate && self.serves("/inference/v1/abort_requests", &probe, timeout).await?;
        self.token_api.store(abort, Ordering::Release);
        Ok(facts)
    }

    async fn load_adapter(&self, engine_name: &str, delivery: &Delivery, timeout: Duration) -> Result<(), WorkerError> {
        self.http.load_from(engine_name, delivery, timeout, |path| self.load_path(engine_name, path, timeout)).await
    }

    async fn unload_adapter(&self, engine_name: &str, timeout: Duration) -> Result<(), WorkerError> {
        self.http.unload_with(engine_name, timeout, || self.unload_only(engine_name, timeout)).await
    }

    async fn generate(&self, sequence: SequenceRequest<'_>) -> Result<OpenedSequence, WorkerError> {
        scored_then_opened(&sequence, self.score_prompt(&sequence), self.open(&sequence)).await
    }

    async fn abort(&self, ids: Vec<String>, timeout: Duration) -> Result<(), WorkerError> {
        // Never an empty list: some vLLM versions read `/abort_requests` without ids as "abort everything".
        if ids.is_empty() {
            return Ok(());
        }
        let body = json!({"request_ids": ids});
        self.http.post("/inference/v1/abort_requests", &body, timeout).await?.map(drop).map_err(Refusal::into_error)
    }
}

/// vLLM's sampling fields for sequence `sequence` of `request` (flat in `/v1/completions`, `sampling_params` in
/// `/inference/v1/generate`), with `logprobs` always (0: the sampled token's own).
fn sampling_params(request: &SampleRequest, sequence: u32) -> Map<String, Value> {
    let names = SamplingNames { max_tokens: "max_tokens", seed: "seed", min_tokens: "min_tokens" };
    let mut fields = sampling_fields(request, sequence, &names);
    fields.insert("logprobs".into(), json!(request.params().top_logprobs()));
    fields
}

/// A parser of one streamed chunk into events (given the candidates asked for).
type ChunkParser = fn(&Value, u32) -> Result<Vec<SequenceEvent>, WorkerError>;

/// The events of a streamed answer, until `[DONE]`; the first chunk naming a `request_id` sets `server_id`.
fn token_stream(
    response: reqwest::Response,
    candidates: u32,
    server_id: Arc<OnceLock<String>>,
    parse: ChunkParser,
) -> Events {
    streamed_events(response, move |chunk| {
        if let Some(id) = chunk["request_id"].as_str() {
            let _ = server_id.set(id.to_owned());
        }
        parse(chunk, candidates)
    })
}

/// One `/v1/completions` chunk: `choices[0]` with `token_ids` (or `logprobs.tokens` as `token_id:N`),
/// `logprobs.token_logprobs`, `logprobs.top_logprobs` (`{"token_id:N": logprob}` per token) and `finish_reason`.
fn completion_chunk(chunk: &Value, candidates: u32) -> Result<Vec<SequenceEvent>, WorkerError> {
    if let Some(err) = stream_error(chunk) {
        return Err(err);
    }
    let Some(choice) = chunk["choices"].get(0) else { return Ok(Vec::new()) };
    let logprobs = &choice["logprobs"];
    let ids = token_ids(&choice["token_ids"])
        .or_else(|| token_ids(&logprobs["tokens"]))
        .ok_or_else(|| WorkerError::Malformed("a chunk without token ids".into()))?;
    let values: Option<Vec<f32>> = match &logprobs["token_logprobs"] {
        Value::Null if ids.is_empty() => Some(Vec::new()),
        list => list.as_array().and_then(|list| list.iter().map(logprob).collect()),
    };
    let values = values.ok_or_else(|| WorkerError::Malformed("tokens without their logprobs".into()))?;
    let top = match candidates {
        0 => Vec::new(),
        k => {
            let entries = logprobs["top_logprobs"].as_array().map(Vec::as_slice).unwrap_or_default();
            let top: Option<Vec<TopLogprobs>> = ids
                .iter()
                .zip(entries)
                .map(|(&token, entry)| {
                    let listed: Option<Vec<(u32, f32)>> = entry
                        .as_object()?
                        .iter()
                        .map(|(key, value)| {
                            Some((token_id(&json!(key)).or_else(|| key.parse().ok())?, logprob(value)?))
                        })
                        .collect();
                    Some(ranked(token, listed?, k))
                })
                .collect();
            top.filter(|top| top.len() == ids.len())
                .ok_or_else(|| WorkerError::Malformed("tokens without their top logprobs".into()))?
        }
    };
    tokens_and_finish(ids, values, top, &choice["finish_reason"])
}

/// One `/inference/v1/generate` chunk: `choices[0]` with `token_ids`, `logprobs.content[]` (`logprob`, the token as
/// `token_id` or `"token_id:N"`, optional `rank`, `top_logprobs[]`) and `finish_reason`.
fn generate_chunk(chunk: &Value, candidates: u32) -> Result<Vec<SequenceEvent>, WorkerError> {
    if let Some(err) = stream_error(chunk) {
        return Err(err);
    }
    let Some(choice) = chunk["choices"].get(0) else { return Ok(Vec::new()) };
    let ids =
        token_ids(&choice["token_ids"]).ok_or_else(|| WorkerError::Malformed("a chunk without token ids".into()))?;
    let content = choice["logprobs"]["content"].as_array().map(Vec::as_slice).unwrap_or_default();
    if content.len() != ids.len() {
        return Err(WorkerError::Malformed(format!("{} tokens with {} logprobs", ids.len(), content.len())));
    }
    let values: Option<Vec<f32>> = content.iter().map(|entry| logprob(&entry["logprob"])).collect();
    let values = values.ok_or_else(|| WorkerError::Malformed("a token without its logprob".into()))?;
    let top = match candidates {
        0 => Vec::new(),
        k => {
            let top: Option<Vec<TopLogprobs>> = ids
                .iter()
                .zip(content)
                .map(|(&token, entry)| {
                    let listed: Option<Vec<(u32, f32)>> = entry["top_logprobs"]
                        .as_array()?
                        .iter()
                        .map(|other| {
                            let id = token_id(&other["token_id"]).or_else(|| token_id(&other["token"]))?;
                            Some((id, logprob(&other["logprob"])?))
                        })
                        .collect();
                    let mut ranked = ranked(token, listed?, k);
                    if let Some(rank) = entry["rank"].as_u64().and_then(|rank| u32::try_from(rank).ok()) {
                        ranked.rank = rank;
                    }
                    Some(ranked)
                })
                .collect();
            top.ok_or_else(|| WorkerError::Malformed("tokens without their top logprobs".into()))?
        }
    };
    tokens_and_finish(ids, values, top, &choice["finish_reason"])
}

/// The `k` most likely of a position's listed candidates, with `token`'s rank where they decide it.
fn ranked(token: u32, listed: Vec<(u32, f32)>, k: u32) -> TopLogprobs {
    let top = most_likely(listed, k as usize);
    TopLogprobs { rank: rank_among(token, &top), top }
}

fn tokens_and_finish(
    token_ids: Vec<u32>,
    logprobs: Vec<f32>,
    top: Vec<TopLogprobs>,
    finish: &Value,
) -> Result<Vec<SequenceEvent>, WorkerError> {
    if logprobs.len() != token_ids.len() {
        return Err(WorkerError::Malformed(format!("{} tokens with {} logprobs", token_ids.len(), logprobs.len())));
    }
    let mut events = Vec::new();
    if !token_ids.is_empty() {
        events.push(SequenceEvent::Tokens { token_ids, logprobs, top });
    }
    if let Some(reason) = finish.as_str() {
        events.push(SequenceEvent::Finished(match reason {
            "length" => FinishReason::Length,
            "stop" => FinishReason::Stop,
            _ => FinishReason::Abort,
        }));
    }
    Ok(events)
}

/// vLLM's `prompt_logprobs` (entry 0 `null`, then per position `{"ID": {"logprob", "rank"}, ...}` with the prompt
/// token's own entry and the top candidates) in the core's terms.
fn prompt_logprobs(value: &Value, prompt: &[u32], top: Option<u32>) -> Result<SequenceEvent, WorkerError> {
    let malformed = || WorkerError::Malformed("prompt logprobs that do not match the prompt".into());
    let entries = value.as_array().filter(|entries| entries.len() == prompt.len()).ok_or_else(malformed)?;
    let mut logprobs = Vec::with_capacity(prompt.len());
    let mut tops = Vec::with_capacity(prompt.len());
    for (position, (entry, &token)) in entries.iter().zip(prompt).enumerate() {
        if position == 0 {
            logprobs.push(f32::NAN);
            tops.push(TopLogprobs::default());
            continue;
        }
        let listed = entry.as_object().ok_or_else(malformed)?;
        let own = &listed.get(&token.to_string()).ok_or_else(malformed)?;
        logprobs.push(logprob(&own["logprob"]).ok_or_else(malformed)?);
        if let Some(k) = top {
            let candidates: Option<Vec<(u32, f32)>> =
                listed.iter().map(|(id, entry)| Some((id.parse().ok()?, logprob(&entry["logprob"])?))).collect();
            let mut ranked = ranked(token, candidates.ok_or_else(malformed)?, k);
            if let Some(rank) = own["rank"].as_u64().and_then(|rank| u32::try_from(rank).ok()) {
                ranked.rank = rank;
            }
            tops.push(ranked);
        }
    }
    Ok(SequenceEvent::PromptLogprobs { logprobs, top: top.map(|_| tops) })
}

#[cfg(test)]
mod tests {
    use loragate_core::{ModelInfo, RawSampleRequest};

    use super::*;

    fn parse(raw: RawSampleRequest) -> SampleRequest {
        let model = ModelInfo { vocab_size: 260, context_length: 4096, eos_token_ids: vec![257] };
        SampleRequest::parse(raw, &model).expect("valid")
    }

    #[test]
    fn the_budget_and_logprobs_are_always_sent_and_defaults_left_out() {
        let greedy =
            sampling_params(&parse(RawSampleRequest { prompt_token_ids: vec![1, 2], ..Default::default() }), 0);
        assert_eq!(Value::Object(greedy), json!({"max_tokens": 4094, "temperature": 0.0, "top_p": 1.0, "logprobs": 0}));
        let seeded = parse(RawSampleRequest {
            prompt_token_ids: vec![1],
            max_tokens: Some(5),
            temperature: 0.5,
            top_k: 7,
            seed: Some(10),
            stop_token_ids: vec![9],
            ignore_eos: true,
            min_p: 0.25,
            repetition_penalty: Some(1.5),
            presence_penalty: 0.5,
            frequency_penalty: -0.5,
            min_tokens: 2,
            top_logprobs: 3,
            ..Default::default()
        });
        let fields = Value::Object(sampling_params(&seeded, 2));
        assert_eq!(fields["seed"], 12, "sequence 2 uses seed + 2");
        assert_eq!(
            (fields["max_tokens"].clone(), fields["top_k"].clone(), fields["logprobs"].clone()),
            (json!(5), json!(7), json!(3))
        );
        for key in [
            "stop_token_ids",
            "ignore_eos",
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
            "min_tokens",
        ] {
            assert!(!fields[key].is_null(), "{key}");
        }
    }

    #[test]
    fn completion_chunks_give_ids_logprobs_candidates_and_the_finish() {
        let chunk = json!({"choices": [{"index": 0, "text": "", "token_ids": [5, 6],
            "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-0.5, -2.0],
                         "top_logprobs": [{"token_id:5": -0.5, "token_id:9": -1.5}, {"token_id:4": -0.1, "token_id:6": -2.0}]},
            "finish_reason": "length"}]});
        let events = completion_chunk(&chunk, 1).expect("valid");
        let SequenceEvent::Tokens { token_ids, logprobs, top } = &events[0] else { panic!("{events:?}") };
        assert_eq!((token_ids.as_slice(), logprobs.as_slice()), (&[5, 6][..], &[-0.5, -2.0][..]));
        assert_eq!(top[0], TopLogprobs { rank: 1, top: vec![(5, -0.5)] });
        assert_eq!(top[1], TopLogprobs { rank: 0, top: vec![(4, -0.1)] }, "outside the top 1: rank unknown");
        assert_eq!(events[1], SequenceEvent::Finished(FinishReason::Length));
        let ids_from_tokens = json!({"choices": [{"logprobs": {"tokens": ["token_id:7"], "token_logprobs": [-1.0]}, "finish_reason": null}]});
        assert_eq!(
            completion_chunk(&ids_from_tokens, 0).expect("valid"),
            [SequenceEvent::Tokens { token_ids: vec![7], logprobs: vec![-1.0], top: Vec::new() }]
        );
        let aborted = json!({"choices": [{"token_ids": [], "logprobs": null, "finish_reason": "abort"}]});
        assert_eq!(completion_chunk(&aborted, 0).expect("valid"), [SequenceEvent::Finished(FinishReason::Abort)]);
        let short = json!({"choices": [{"token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}}]});
        assert!(matches!(completion_chunk(&short, 0), Err(WorkerError::Malformed(_))));
        assert!(completion_chunk(&json!({"choices": [], "usage": {}}), 0).expect("usage chunk").is_empty());
        assert!(matches!(
            completion_chunk(&json!({"error": {"message": "x", "code": 404}}), 0),
            Err(WorkerError::NotFound(_))
        ));
    }

    #[test]
    fn generate_chunks_of_both_logprob_formats_parse() {
        let old = json!({"request_id": "generate-tokens-r1", "choices": [{"index": 0, "token_ids": [5],
            "logprobs": {"content": [{"token": "token_id:5", "logprob": -0.5, "top_logprobs": [{"token": "token_id:5", "logprob": -0.5}]}]},
            "finish_reason": null}]});
        let events = generate_chunk(&old, 1).expect("valid");
        assert_eq!(
            events,
            [SequenceEvent::Tokens {
                token_ids: vec![5],
                logprobs: vec![-0.5],
                top: vec![TopLogprobs { rank: 1, top: vec![(5, -0.5)] }]
            }]
        );
        let new = json!({"choices": [{"index": 0, "token_ids": [8],
            "logprobs": {"content": [{"token_id": 8, "logprob": -3.0, "rank": 4, "top_logprobs": [{"token_id": 2, "logprob": -0.2, "rank": 1}]}]},
            "finish_reason": "stop"}]});
        let events = generate_chunk(&new, 1).expect("valid");
        let SequenceEvent::Tokens { top, .. } = &events[0] else { panic!("{events:?}") };
        assert_eq!(top[0], TopLogprobs { rank: 4, top: vec![(2, -0.2)] }, "the server's own rank");
        assert_eq!(events[1], SequenceEvent::Finished(FinishReason::Stop));
    }

    #[test]
    fn prompt_logprobs_come_back_in_the_cores_terms_with_vllms_ranks() {
        let value = json!([null, {"3": {"logprob": -2.0, "rank": 5}, "1": {"logprob": -0.1, "rank": 1}}, {"4": {"logprob": -0.3, "rank": 1}}]);
        let SequenceEvent::PromptLogprobs { logprobs, top } =
            prompt_logprobs(&value, &[9, 3, 4], Some(1)).expect("valid")
        else {
            panic!("prompt logprobs")
        };
        assert!(logprobs[0].is_nan());
        assert_eq!(&logprobs[1..], &[-2.0, -0.3]);
        let top = top.expect("asked for");
        assert_eq!(top[1], TopLogprobs { rank: 5, top: vec![(1, -0.1)] });
        assert_eq!(top[2], TopLogprobs { rank: 1, top: vec![(4, -0.3)] });
        assert!(prompt_logprobs(&value, &[9, 3], None).is_err(), "a count that does not match the prompt");
    }
}
