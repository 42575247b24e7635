//! SGLang's HTTP server (`python -m sglang.launch_server --enable-lora`).
//!
//! - Sampling: `POST /generate` with `input_ids`, `sampling_params` (`max_new_tokens` always), `lora_path` = the
//!   adapter version's name, `return_logprob`, `top_logprobs_num`, our `rid`, `stream: true`. Chunks carry the
//!   output so far (SGLang's default) or only what is new (`--incremental-streaming-output`): `completion_tokens`
//!   tells which, so both are read right.
//! - The prompt's logprobs come from a separate, unstreamed scoring `/generate` (`max_new_tokens` 1,
//!   `logprob_start_len` 0) before the sequence's stream.
//! - Abort: `POST /abort_request {"rid"}`, one per sequence; the sequence's `abort` finish acknowledges it.
//! - Adapters: `POST /load_lora_adapter {"lora_name", "lora_path"}`, `/unload_lora_adapter {"lora_name"}`; listed by
//!   `GET /v1/models` where the server lists them, which also gives the context length. Health: `GET /health` (SGLang
//!   answers it by generating one token, so it is given at least 25 s).

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

/// SGLang's `/health` generates a token and waits up to 20 s for the scheduler: never bound it below this.
const MIN_HEALTH_TIMEOUT: Duration = Duration::from_secs(25);
/// How many `/abort_request` calls to one worker run at once (over every batch).
const ABORTS_AT_ONCE: usize = 256;

/// An SGLang HTTP worker.
pub(crate) struct SglangHttpWorker {
    http: HttpEndpoint,
    /// One place per `/abort_request` call in flight.
    aborts_at_once: tokio::sync::Semaphore,
}

impl SglangHttpWorker {
    /// A client of the worker at `address`.
    pub(crate) fn new(address: &WorkerAddress, settings: ClientSettings) -> Result<Self, WorkerError> {
        Ok(Self {
            http: HttpEndpoint::new(address, settings)?,
            aborts_at_once: tokio::sync::Semaphore::new(ABORTS_AT_ONCE),
        })
    }

    async fn score_prompt(&self, sequence: &SequenceRequest<'_>) -> Result<SequenceEvent, WorkerError> {
        let request = sequence.request;
        let top = request.prompt_top_logprobs();
        let mut body = json!({
            "input_ids": request.prompt().to_vec(),
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": true,
            "logprob_start_len": 0,
            "top_logprobs_num": top.unwrap_or(0),
            "rid": format!("{}-prompt", sequence.request_id),
            "stream": false,
        });
        if !sequence.engine_name.is_empty() {
            body["lora_path"] = json!(sequence.engine_name);
        }
        let answer = self.http.post("/generate", &body, SCORING_TIMEOUT).await?.map_err(generate_refusal)?;
        let answer = if answer.is_array() { answer[0].clone() } else { answer };
        prompt_logprobs(&answer["meta_info"], request.prompt(), top)
    }

    /// Starts the generation of `sequence` (`/generate`, streamed), aborted by its `rid`.
    async fn open(&self, sequence: &SequenceRequest<'_>) -> Result<(Events, AbortBy), WorkerError> {
        let request = sequence.request;
        let candidates = request.params().top_logprobs();
        let mut body = json!({
            "input_ids": request.prompt().to_vec(),
            "sampling_params": sampling_params(request, sequence.sequence),
            "return_logprob": true,
            "rid": sequence.request_id,
            "stream": true,
        });
        if candidates > 0 {
            body["top_logprobs_num"] = json!(candidates);
        }
        if !sequence.engine_name.is_empty() {
            body["lora_path"] = json!(sequence.engine_name);
        }
        let response = self.http.post_stream("/generate", &body).await.map_err(generate_error)?;
        let mut received = 0usize;
        let events = streamed_events(response, move |chunk| chunk_events(chunk, candidates, &mut received));
        Ok((events, AbortBy::call(sequence.request_id.clone())))
    }

    /// Asks the server to load `engine_name` from `path`.
    async fn load_path(&self, engine_name: &str, path: String, timeout: Duration) -> Result<(), WorkerError> {
        let body = json!({"lora_name": engine_name, "lora_path": path});
        match self.http.post("/load_lora_adapter", &body, timeout).await? {
            Ok(answer) if answer["success"] == false => Err(WorkerError::InvalidArgument(
                super::http::error_message(&answer).unwrap_or_else(|| answer.to_string()),
            )),
            Ok(_) => Ok(()),
            Err(refusal) if refusal.says_already_loaded() => Err(WorkerError::AlreadyExists(refusal.message)),
            Err(refusal) if refusal.status.as_u16() == 400 => Err(WorkerError::InvalidArgument(refusal.message)),
            Err(refusal) => Err(refusal.into_error()),
        }
    }

    /// Asks the server to unload `engine_name`.
    async fn unload_only(&self, engine_name: &str, timeout: Duration) -> Result<(), WorkerError> {
        match self.http.post("/unload_lora_adapter", &json!({"lora_name": engine_name}), timeout).await? {
            Ok(_) => Ok(()),
            Err(refusal) if says_not_loaded(&refusal.message) => Err(WorkerError::NotFound(refusal.message)),
            Err(refusal) => Err(refusal.into_error()),
        }
    }
}

#[async_trait::async_trait]
impl WorkerClient for SglangHttpWorker {
    async fn check_health(&self, timeout: Duration) -> Result<(), WorkerError> {
        self.http.health(timeout.max(MIN_HEALTH_TIMEOUT)).await
    }

    async fn describe(&self, timeout: Duration) -> Result<WorkerFacts, WorkerError> {
        self.http.models(timeout).await
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
        let calls = ids.into_iter().map(|rid| async move {
            // The semaphore is never closed.
            let Ok(_place) = self.aborts_at_once.acquire().await else { return Ok(()) };
            // An empty rid aborts nothing; `abort_all` is never sent.
            let body = json!({"rid": rid});
            self.http.post("/abort_request", &body, timeout).await?.map(drop).map_err(Refusal::into_error)
        });
        let outcomes = futures::future::join_all(calls).await;
        outcomes.into_iter().find(Result::is_err).unwrap_or(Ok(()))
    }
}

/// SGLang's sampling fields for sequence `sequence` of `request`.
fn sampling_params(request: &SampleRequest, sequence: u32) -> Map<String, Value> {
    let names = SamplingNames { max_tokens: "max_new_tokens", seed: "sampling_seed", min_tokens: "min_new_tokens" };
    sampling_fields(request, sequence, &names)
}

/// Whether an SGLang message says a LoRA name is not loaded.
fn says_not_loaded(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    ["not loaded", "not found", "does not exist", "cannot be found"].iter().any(|phrase| message.contains(phrase))
}

/// A refused `/generate`: SGLang answers an adapter it does not hold 400 ("… not loaded"), which means the worker
/// lacks what the fleet thought it held.
fn generate_refusal(refusal: Refusal) -> WorkerError {
    match refusal.status.as_u16() {
        400 if says_not_loaded(&refusal.message) => WorkerError::NotFound(refusal.message),
        _ => refusal.into_error(),
    }
}

fn generate_error(err: WorkerError) -> WorkerError {
    match err {
        WorkerError::InvalidArgument(message) if says_not_loaded(&message) => WorkerError::NotFound(message),
        other => other,
    }
}

/// One streamed chunk (`output_ids`, `meta_info.output_token_logprobs` `[logprob, id, text]`,
/// `meta_info.output_top_logprobs`, `meta_info.completion_tokens`, `meta_info.finish_reason.type`): the tokens not
/// seen yet (`received` counts them), and the finish.
fn chunk_events(chunk: &Value, candidates: u32, received: &mut usize) -> Result<Vec<SequenceEvent>, WorkerError> {
    if let Some(err) = stream_error(chunk) {
        return Err(generate_error(err));
    }
    let chunk = if chunk.is_array() { &chunk[0] } else { chunk };
    let meta = &chunk["meta_info"];
    let ids =
        token_ids(&chunk["output_ids"]).ok_or_else(|| WorkerError::Malformed("a chunk without output_ids".into()))?;
    let total = meta["completion_tokens"].as_u64().map_or(ids.len(), |total| total as usize);
    // The output so far (SGLang's default), or only what is new (incremental streaming).
    let cumulative = ids.len() == total && total >= *received;
    let new_ids: Vec<u32> = if cumulative {
        ids[*received..].to_vec()
    } else if *received + ids.len() == total {
        ids.clone()
    } else {
        return Err(WorkerError::Malformed(format!(
            "{} output ids with {total} completion tokens after {} received",
            ids.len(),
            *received
        )));
    };
    // Lists as long as the output so far are cumulative too: skip what was received.
    let skip = |len: usize| if cumulative && len == total { *received } else { 0 };
    let triples = meta["output_token_logprobs"].as_array().map(Vec::as_slice).unwrap_or_default();
    let triples = &triples[skip(triples.len())..];
    if triples.len() != new_ids.len() {
        return Err(WorkerError::Malformed(format!("{} tokens with {} logprobs", new_ids.len(), triples.len())));
    }
    let mut values = Vec::with_capacity(new_ids.len());
    for (triple, &token) in triples.iter().zip(&new_ids) {
        let (Some(value), Some(id)) = (logprob(&triple[0]), token_id(&triple[1])) else {
            return Err(WorkerError::Malformed("a logprob triple without its logprob and token".into()));
        };
        if id != token {
            return Err(WorkerError::Malformed(format!("logprobs of token {id} for token {token}")));
        }
        values.push(value);
    }
    let top = match candidates {
        0 => Vec::new(),
        k => {
            let lists = meta["output_top_logprobs"].as_array().map(Vec::as_slice).unwrap_or_default();
            let lists = &lists[skip(lists.len())..];
            if lists.len() != new_ids.len() {
                return Err(WorkerError::Malformed("tokens without their top logprobs".into()));
            }
            lists.iter().zip(&new_ids).map(|(list, &token)| ranked(token, list, k)).collect::<Result<_, _>>()?
        }
    };
    *received += new_ids.len();
    let mut events = Vec::new();
    if !new_ids.is_empty() {
        events.push(SequenceEvent::Tokens { token_ids: new_ids, logprobs: values, top });
    }
    if let Some(kind) = meta["finish_reason"]["type"].as_str() {
        events.push(SequenceEvent::Finished(match kind {
            "length" => FinishReason::Length,
            "stop" => FinishReason::Stop,
            _ => FinishReason::Abort,
        }));
    }
    Ok(events)
}

/// The `k` most likely of a position's `[logprob, id, text]` candidates, with `token`'s rank where they decide it.
fn ranked(token: u32, list: &Value, k: u32) -> Result<TopLogprobs, WorkerError> {
    let malformed = || WorkerError::Malformed("top logprobs that are not [logprob, id, text] triples".into());
    let listed: Option<Vec<(u32, f32)>> = match list {
        Value::Null => Some(Vec::new()),
        list => list.as_array().map(|triples| {
            triples.iter().filter_map(|triple| Some((token_id(&triple[1])?, logprob(&triple[0])?))).collect()
        }),
    };
    let top = most_likely(listed.ok_or_else(malformed)?, k as usize);
    Ok(TopLogprobs { rank: rank_among(token, &top), top })
}

/// `meta_info.input_token_logprobs` (from position 0: the first logprob `null`) and `input_top_logprobs` in the
/// core's terms.
fn prompt_logprobs(meta: &Value, prompt: &[u32], top: Option<u32>) -> Result<SequenceEvent, WorkerError> {
    let malformed = || WorkerError::Malformed("prompt logprobs that do not match the prompt".into());
    let triples =
        meta["input_token_logprobs"].as_array().filter(|list| list.len() == prompt.len()).ok_or_else(malformed)?;
    let mut logprobs = Vec::with_capacity(prompt.len());
    for (position, triple) in triples.iter().enumerate() {
        logprobs.push(match position {
            0 => f32::NAN,
            _ => logprob(&triple[0]).ok_or_else(malformed)?,
        });
    }
    let top = match top {
        None => None,
        Some(k) => {
            let lists = meta["input_top_logprobs"]
                .as_array()
                .filter(|list| list.len() == prompt.len())
                .ok_or_else(malformed)?;
            let mut tops = Vec::with_capacity(prompt.len());
            for (position, (list, &token)) in lists.iter().zip(prompt).enumerate() {
                tops.push(if position == 0 { TopLogprobs::default() } else { ranked(token, list, k)? });
            }
            Some(tops)
        }
    };
    Ok(SequenceEvent::PromptLogprobs { logprobs, top })
}

#[cfg(test)]
mod tests {
    use loragate_core::{ModelInfo, RawSampleRequest};

    use super::*;

    #[test]
    fn the_budget_is_always_sent_and_a_seed_only_when_given() {
        let model = ModelInfo { vocab_size: 260, context_length: 4096, eos_token_ids: vec![257] };
        let raw = RawSampleRequest { prompt_token_ids: vec![1, 2], min_tokens: 1, ..Default::default() };
        let fields = Value::Object(sampling_params(&SampleRequest::parse(raw, &model).expect("valid"), 0));
        assert_eq!(fields, json!({"max_new_tokens": 4094, "temperature": 0.0, "top_p": 1.0, "min_new_tokens": 1}));
        let raw = RawSampleRequest { prompt_token_ids: vec![1], seed: Some(4), top_k: 3, ..Default::default() };
        let fields = Value::Object(sampling_params(&SampleRequest::parse(raw, &model).expect("valid"), 1));
        assert_eq!((fields["sampling_seed"].clone(), fields["top_k"].clone()), (json!(5), json!(3)));
    }

    fn chunk(ids: &[u32], total: usize, finish: Value) -> Value {
        let triples: Vec<Value> = ids.iter().map(|&id| json!([-(id as f32) / 10.0, id, null])).collect();
        json!({"text": "", "output_ids": ids,
               "meta_info": {"id": "r", "completion_tokens": total, "finish_reason": finish, "output_token_logprobs": triples}})
    }

    #[test]
    fn cumulative_and_incremental_chunks_give_each_token_once() {
        let mut received = 0;
        let first = chunk_events(&chunk(&[1, 2], 2, Value::Null), 0, &mut received).expect("valid");
        assert_eq!(
            first,
            [SequenceEvent::Tokens { token_ids: vec![1, 2], logprobs: vec![-0.1, -0.2], top: Vec::new() }]
        );
        let cumulative = chunk_events(&chunk(&[1, 2, 3], 3, Value::Null), 0, &mut received).expect("valid");
        assert_eq!(cumulative, [SequenceEvent::Tokens { token_ids: vec![3], logprobs: vec![-0.3], top: Vec::new() }]);
        let incremental = chunk_events(&chunk(&[4], 4, json!({"type": "abort", "message": "m"})), 0, &mut received);
        assert_eq!(
            incremental.expect("valid"),
            [
                SequenceEvent::Tokens { token_ids: vec![4], logprobs: vec![-0.4], top: Vec::new() },
                SequenceEvent::Finished(FinishReason::Abort)
            ]
        );
        assert_eq!(received, 4);
        let ended = chunk_events(&chunk(&[1, 2, 3, 4], 4, json!({"type": "length", "length": 4})), 0, &mut received);
        assert_eq!(ended.expect("valid"), [SequenceEvent::Finished(FinishReason::Length)]);
        let mut fresh = 0;
        assert!(matches!(
            chunk_events(&chunk(&[1, 2, 3], 7, Value::Null), 0, &mut fresh),
            Err(WorkerError::Malformed(_))
        ));
    }

    #[test]
    fn candidates_and_prompt_logprobs_come_back_in_the_cores_terms() {
        let mut received = 0;
        let mut with_top = chunk(&[5], 1, Value::Null);
        with_top["meta_info"]["output_top_logprobs"] = json!([[[-0.2, 9, null], [-0.5, 5, null]]]);
        let events = chunk_events(&with_top, 2, &mut received).expect("valid");
        let SequenceEvent::Tokens { top, .. } = &events[0] else { panic!("{events:?}") };
        assert_eq!(top[0], TopLogprobs { rank: 2, top: vec![(9, -0.2), (5, -0.5)] });

        let meta = json!({"input_token_logprobs": [[null, 7, null], [-1.0, 8, null]],
                          "input_top_logprobs": [null, [[-0.5, 3, null]]]});
        let SequenceEvent::PromptLogprobs { logprobs, top } = prompt_logprobs(&meta, &[7, 8], Some(1)).expect("valid")
        else {
            panic!("prompt logprobs")
        };
        assert!(logprobs[0].is_nan() && logprobs[1] == -1.0);
        assert_eq!(top.expect("asked")[1], TopLogprobs { rank: 0, top: vec![(3, -0.5)] });
        assert!(prompt_logprobs(&meta, &[7], None).is_err());
    }

    #[test]
    fn a_missing_adapter_is_out_of_sync_not_a_bad_request() {
        let refusal = Refusal {
            status: reqwest::StatusCode::BAD_REQUEST,
            message: "The following requested LoRA adapters are not loaded: meow@1".into(),
            no_such_route: false,
        };
        assert!(matches!(generate_refusal(refusal), WorkerError::NotFound(_)));
        assert!(matches!(
            generate_error(WorkerError::InvalidArgument("bad temperature".into())),
            WorkerError::InvalidArgument(_)
        ));
    }
}
