//! The body of `POST /api/v1/asample` as the SDK sends it, and its translation into the core's request plus what this
//! front does itself (stop strings, the prompt-logprob suffix). The core validates every sampling value; this module
//! checks only what the Tinker API adds, naming each field by its Tinker path.

use std::sync::Arc;

use loragate_core::{AdapterKey, Coordinator, MAX_NUM_SAMPLES, RawSampleRequest, SampleRequest};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::TinkerError;
use crate::ids::FutureId;
use crate::proto::{Ending, FinishedSequence};
use crate::store::Produced;
use crate::store::record::ProducedSequence;

/// The SDK's `SampleRequest`, as JSON (fields the user left unset are absent). Written back as JSON into the
/// future's record (a restart reads it again through [`AsampleBody::into_plan`]).
#[derive(Debug, Default, Deserialize, Serialize)]
pub(crate) struct AsampleBody {
    /// The sampling session (names the target; see `ids::sampling_session_target`).
    pub(crate) sampling_session_id: Option<String>,
    /// Per sampling client: 0, 1, 2… (with the session, the key of transport-level resubmissions).
    pub(crate) seq_id: Option<i64>,
    /// The target, instead of a session.
    pub(crate) base_model: Option<String>,
    /// The target, instead of a session.
    pub(crate) model_path: Option<String>,
    num_samples: Option<u32>,
    prompt: Option<PromptBody>,
    sampling_params: Option<SamplingParamsBody>,
    prompt_logprobs: Option<bool>,
    prompt_logprobs_last_n: Option<u32>,
    topk_prompt_logprobs: Option<i64>,
    topk_sample_logprobs: Option<i64>,
    prompt_alt_tokens_k: Option<i64>,
    target_prompt_logprobs: Option<Value>,
    record_stability_info: Option<bool>,
}

/// `ModelInput`: chunks, of which loragate takes `encoded_text` only.
#[derive(Debug, Default, Deserialize, Serialize)]
struct PromptBody {
    chunks: Vec<Value>,
}

/// The SDK's `SamplingParams`.
#[derive(Debug, Default, Deserialize, Serialize)]
struct SamplingParamsBody {
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    top_k: Option<i32>,
    top_p: Option<f32>,
    seed: Option<serde_json::Number>,
    stop: Option<Value>,
}

/// A validated sample: the core's request plus what this front watches itself.
#[derive(Debug)]
pub(crate) struct SamplePlan {
    /// The core's request (its id is the future's request id; the core continues it through every pause).
    pub(crate) request: SampleRequest,
    /// Stop strings, watched in each sequence's decoded text.
    pub(crate) stop_strings: Arc<[String]>,
    /// With `prompt_logprobs_last_n`: entries before the last N are sent as NaN.
    pub(crate) prompt_logprobs_last_n: Option<usize>,
    /// A sample continued after a restart from what its record says it had produced: what is sampled instead of
    /// `request`.
    pub(crate) resumed: Option<Resumed>,
}

impl SamplePlan {
    /// Confines the cached prefixes of every request of the plan to `scope` (see
    /// [`SampleRequest::scope_cache_to`]).
    pub(crate) fn scope_cache_to(mut self, scope: Option<Arc<str>>) -> Self {
        self.request = self.request.scope_cache_to(scope.clone());
        if let Some(resumed) = &mut self.resumed {
            for (_, request) in &mut resumed.requests {
                *request = request.clone().scope_cache_to(scope.clone());
            }
        }
        self
    }
}

/// How a sample continues after a restart from what it had produced.
#[derive(Debug)]
pub(crate) struct Resumed {
    /// Each sequence as recorded (a finished one with its ending).
    pub(crate) sequences: Vec<FinishedSequence>,
    /// The prompt's logprobs as recorded, when they are wanted.
    pub(crate) prompt_logprobs: Option<Vec<f32>>,
    /// One request per sequence still to sample, with the sequence's index: `prompt + its tokens`, the rest of its
    /// budget, one sequence, seeded as that sequence was (`seed + index`), no prompt logprobs; under the future's id.
    pub(crate) requests: Vec<(u32, SampleRequest)>,
}

/// How a `stop` value translates.
#[derive(Debug, Default, PartialEq)]
struct Stops {
    token_ids: Vec<u32>,
    strings: Vec<String>,
    ignore_eos: bool,
}

impl AsampleBody {
    /// Validates the body for `target` under the future id `id`; with what an earlier process recorded the sample had
    /// `produced`, plans its continuation from there ([`SamplePlan::resumed`]).
    pub(crate) fn into_plan(
        self,
        id: FutureId,
        target: &AdapterKey,
        coordinator: &Coordinator,
        produced: Option<Produced>,
    ) -> Result<SamplePlan, TinkerError> {
        refuse_unsupported(&self)?;
        let prompt = prompt_tokens(self.prompt.ok_or_else(|| TinkerError::invalid("prompt", "is required"))?)?;
        let params = self.sampling_params.ok_or_else(|| TinkerError::invalid("sampling_params", "is required"))?;
        let num_samples = match self.num_samples.unwrap_or(1) {
            0 => return Err(TinkerError::invalid("num_samples", format!("must be 1 to {MAX_NUM_SAMPLES}, got 0"))),
            n => n,
        };
        let wants_prompt_logprobs = self.prompt_logprobs.unwrap_or(false);
        let prompt_logprobs_last_n = match self.prompt_logprobs_last_n {
            None => None,
            Some(_) if !wants_prompt_logprobs => {
                return Err(TinkerError::invalid("prompt_logprobs_last_n", "needs prompt_logprobs=true"));
            }
            Some(n) if n == 0 || n as usize >= prompt.len() => {
                return Err(TinkerError::invalid(
                    "prompt_logprobs_last_n",
                    format!("must be 1 to {} (the prompt's length - 1), got {n}", prompt.len().saturating_sub(1)),
                ));
            }
            Some(n) => Some(n as usize),
        };
        let stops = parse_stop(params.stop)?;
        let raw = RawSampleRequest {
            request_id: id.to_wire(),
            lora_name: target.as_wire_str().to_owned(),
            prompt_token_ids: prompt,
            max_tokens: params.max_tokens,
            temperature: params.temperature.unwrap_or(1.0),
            top_p: Some(params.top_p.unwrap_or(1.0)),
            top_k: params.top_k.unwrap_or(-1),
            seed: params.seed.map(parse_seed).transpose()?,
            stop_token_ids: stops.token_ids,
            ignore_eos: stops.ignore_eos,
            num_samples,
            include_prompt_logprobs: wants_prompt_logprobs,
            ..RawSampleRequest::default()
        };
        let continued_from = produced.map(|produced| (raw.clone(), produced));
        // The SDK cannot express an abort: the core continues this request's sequences after abort-mode pauses too.
        let request = coordinator.parse_sample(raw).map_err(TinkerError::Core)?.continue_through_abort_pauses();
        let resumed = match continued_from {
            Some((raw, produced)) => resume(&request, raw, produced, coordinator)?,
            None => None,
        };
        Ok(SamplePlan { request, stop_strings: stops.strings.into(), prompt_logprobs_last_n, resumed })
    }
}

/// How `whole` (validated from `raw`) continues from what it had `produced`; `None` (it is sampled again from its
/// prompt) when the record does not fit the request. A sequence whose recorded tokens spent its budget, or end with
/// a token that stops it, is finished as the core would have finished it.
fn resume(
    whole: &SampleRequest,
    raw: RawSampleRequest,
    produced: Produced,
    coordinator: &Coordinator,
) -> Result<Option<Resumed>, TinkerError> {
    let params = whole.params();
    let prompt_logprobs = produced.prompt_logprobs();
    let fits = produced.sequences.len() == whole.num_samples() as usize
        && (prompt_logprobs.is_some() || !whole.include_prompt_logprobs());
    let recorded: Option<Vec<FinishedSequence>> =
        produced.sequences.iter().map(ProducedSequence::to_sequence).collect();
    let Some(mut sequences) = recorded.filter(|_| fits) else {
        tracing::warn!(request_id = %whole.id(), "a Tinker sample's record of its tokens does not fit its request: \
            sampling it again from its prompt");
        return Ok(None);
    };
    let eos = &coordinator.model_info().eos_token_ids;
    let stops = |token: &u32| (!params.ignore_eos() && eos.contains(token)) || params.stop_token_ids().contains(token);
    let mut requests = Vec::new();
    for (index, sequence) in (0u32..).zip(&mut sequences) {
        if sequence.ending.is_some() {
            continue;
        }
        let made = u32::try_from(sequence.tokens.len()).unwrap_or(u32::MAX);
        if made >= params.max_tokens() {
            sequence.ending = Some(Ending::Length);
        } else if sequence.tokens.last().is_some_and(stops) {
            sequence.ending = Some(Ending::Stop);
        } else {
            let rest = RawSampleRequest {
                prompt_token_ids: whole.prompt().iter().chain(&sequence.tokens).copied().collect(),
                max_tokens: Some(params.max_tokens() - made),
                seed: params.seed().map(|seed| seed.wrapping_add(u64::from(index))),
                num_samples: 1,
                include_prompt_logprobs: false,
                ..raw.clone()
            };
            let request = coordinator.parse_sample(rest).map_err(TinkerError::Core)?.continue_through_abort_pauses();
            requests.push((index, request));
        }
    }
    let prompt_logprobs = prompt_logprobs.filter(|_| whole.include_prompt_logprobs());
    Ok(Some(Resumed { sequences, prompt_logprobs, requests }))
}

fn refuse_unsupported(body: &AsampleBody) -> Result<(), TinkerError> {
    let only_sampled =
        "is not supported by loragate's Tinker front: it returns the sampled token's logprob only (send 0)";
    for (field, value) in [
        ("topk_prompt_logprobs", body.topk_prompt_logprobs),
        ("topk_sample_logprobs", body.topk_sample_logprobs),
        ("prompt_alt_tokens_k", body.prompt_alt_tokens_k),
    ] {
        if value.unwrap_or(0) != 0 {
            return Err(TinkerError::invalid(field, only_sampled));
        }
    }
    if body.target_prompt_logprobs.as_ref().is_some_and(|value| !value.is_null()) {
        return Err(TinkerError::invalid("target_prompt_logprobs", only_sampled));
    }
    if body.record_stability_info == Some(true) {
        return Err(TinkerError::invalid(
            "record_stability_info",
            "is not supported: it is a training feature, and loragate's Tinker front serves sampling only",
        ));
    }
    Ok(())
}

/// Concatenates the `encoded_text` chunks.
fn prompt_tokens(prompt: PromptBody) -> Result<Vec<u32>, TinkerError> {
    let mut tokens = Vec::new();
    for (index, chunk) in prompt.chunks.into_iter().enumerate() {
        let kind = chunk.get("type").and_then(Value::as_str).unwrap_or("encoded_text");
        if kind != "encoded_text" {
            return Err(TinkerError::invalid(
                format!("prompt.chunks[{index}].type"),
                format!("'{kind}' is not supported: loragate samples token prompts ('encoded_text' chunks) only"),
            ));
        }
        let ids = chunk.get("tokens").and_then(Value::as_array).ok_or_else(|| {
            TinkerError::invalid(format!("prompt.chunks[{index}].tokens"), "must be a list of token ids")
        })?;
        for (at, id) in ids.iter().enumerate() {
            let token = id.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(|| {
                TinkerError::invalid(format!("prompt.chunks[{index}].tokens[{at}]"), format!("{id} is not a token id"))
            })?;
            tokens.push(token);
        }
    }
    Ok(tokens)
}

/// `stop`: absent keeps end-of-sequence stopping; a given list is the complete stop set (`[]` disables EOS too).
/// Strings are checked against the caps every front's stop strings pass ([`loragate_text::check_stop_strings`]), token ids against the
/// core's ([`loragate_core::MAX_STOP_TOKEN_IDS`]).
fn parse_stop(stop: Option<Value>) -> Result<Stops, TinkerError> {
    let field = "sampling_params.stop";
    let items = match stop {
        None | Some(Value::Null) => return Ok(Stops::default()),
        Some(Value::String(text)) => vec![Value::String(text)],
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(TinkerError::invalid(field, format!("must be a string or a list, got {other}")));
        }
    };
    let mut stops = Stops { ignore_eos: true, ..Stops::default() };
    for item in items {
        match item {
            Value::String(text) if text.is_empty() => {
                return Err(TinkerError::invalid(field, "stop strings must not be empty"));
            }
            Value::String(text) if stops.token_ids.is_empty() => stops.strings.push(text),
            Value::Number(number) if stops.strings.is_empty() => {
                let token = number
                    .as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| TinkerError::invalid(field, format!("{number} is not a token id")))?;
                stops.token_ids.push(token);
            }
            other => {
                return Err(TinkerError::invalid(
                    field,
                    format!("must be all strings or all token ids, found {other}"),
                ));
            }
        }
    }
    // The same caps as every front's stop strings; stop token ids are capped by the core, as everywhere.
    loragate_text::check_stop_strings(&stops.strings).map_err(|reason| TinkerError::invalid(field, reason))?;
    Ok(stops)
}

/// The seed modulo 2⁶³ (non-negative), as the SDK allows any Python int.
fn parse_seed(seed: serde_json::Number) -> Result<u64, TinkerError> {
    const MODULUS: i128 = 1 << 63;
    let exact = seed.as_u64().map(i128::from).or_else(|| seed.as_i64().map(i128::from));
    match exact {
        Some(seed) => Ok(seed.rem_euclid(MODULUS) as u64),
        None => {
            Err(TinkerError::invalid("sampling_params.seed", format!("must be an integer within 64 bits, got {seed}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use loragate_core::CoordinatorConfig;
    use loragate_core::testing::{ScriptedEngine, coordinator_with_adapters};
    use serde_json::json;

    use super::*;
    use crate::ids::{Epoch, IdMaker};
    use crate::json_body::parse_json;
    use crate::store::record::RecordedEnding;

    fn body(overrides: Value) -> AsampleBody {
        let mut body = json!({
            "num_samples": 2,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}, {"tokens": [3]}]},
            "sampling_params": {"max_tokens": 5, "temperature": 1.0, "top_k": -1, "top_p": 1.0},
            "prompt_logprobs": false, "topk_prompt_logprobs": 0, "topk_sample_logprobs": 0,
            "prompt_alt_tokens_k": 0, "record_stability_info": false, "type": "sample"
        });
        for (key, value) in overrides.as_object().expect("object") {
            body[key] = value.clone();
        }
        parse_json(body.to_string().as_bytes()).expect("parses")
    }

    async fn coordinator() -> Coordinator {
        coordinator_with_adapters(ScriptedEngine::new(1), CoordinatorConfig::default(), &[]).await
    }

    fn plan(coordinator: &Coordinator, overrides: Value) -> Result<SamplePlan, TinkerError> {
        let id = IdMaker::new(Epoch::random()).future_id();
        body(overrides).into_plan(id, &AdapterKey::Base, coordinator, None)
    }

    fn refused_field(coordinator: &Coordinator, overrides: Value) -> String {
        let err = plan(coordinator, overrides.clone()).expect_err("refused");
        assert_eq!(err.status().as_u16(), 400, "{overrides}: {err}");
        err.to_string().split(':').next().expect("field").to_owned()
    }

    #[tokio::test]
    async fn the_sdks_body_becomes_the_core_request() {
        let coordinator = coordinator().await;
        let valid = plan(&coordinator, json!({})).expect("valid");
        assert_eq!(&*valid.request.prompt().to_vec(), &[1, 2, 3], "chunks are concatenated");
        assert_eq!(valid.request.num_samples(), 2);
        assert_eq!(valid.request.params().max_tokens(), 5);
        assert!(!valid.request.params().ignore_eos() && valid.stop_strings.is_empty());
        assert!(valid.request.id().as_str().starts_with("tk-"), "the future's id is the core request id");
        assert!(valid.request.continues_through_abort_pauses(), "the SDK never sees an abort from a pause");

        let seeded = |seed: Value| {
            let params = json!({"max_tokens": 5, "seed": seed});
            plan(&coordinator, json!({"sampling_params": params})).map(|p| p.request.params().seed())
        };
        assert_eq!(seeded(json!(7)).ok(), Some(Some(7)));
        assert_eq!(seeded(json!(-1)).ok(), Some(Some((1u64 << 63) - 1)), "negative seeds wrap modulo 2^63");
        assert_eq!(seeded(json!(u64::MAX)).ok(), Some(Some((1u64 << 63) - 1)));
        assert!(seeded(json!(1.5)).is_err());
    }

    #[tokio::test]
    async fn a_recorded_sample_continues_each_unfinished_sequence_from_its_tokens() {
        let coordinator = coordinator().await;
        let id = IdMaker::new(Epoch::random()).future_id();
        let sequence = |tokens: &[u32]| ProducedSequence {
            tokens: tokens.to_vec(),
            logprob_bits: vec![0; tokens.len()],
            ending: None,
        };
        let produced = Produced {
            sequences: vec![
                ProducedSequence { ending: Some(RecordedEnding::Stop), ..sequence(&[7]) },
                sequence(&[9, 9]),
                sequence(&[9, 257]),
                sequence(&[1, 2, 3, 4, 5]),
            ],
            prompt_logprob_bits: None,
        };
        let seeded = json!({"num_samples": 4, "sampling_params": {"max_tokens": 5, "seed": 3}});
        let plan = body(seeded).into_plan(id, &AdapterKey::Base, &coordinator, Some(produced)).expect("valid");
        let resumed = plan.resumed.expect("continued");
        let endings: Vec<Option<Ending>> = resumed.sequences.iter().map(|sequence| sequence.ending).collect();
        assert_eq!(
            endings,
            [Some(Ending::Stop), None, Some(Ending::Stop), Some(Ending::Length)],
            "recorded; going on; ended by end-of-sequence (257); its budget spent"
        );
        let [(index, request)] = &resumed.requests[..] else { panic!("one request: {:?}", resumed.requests) };
        assert_eq!(*index, 1);
        assert_eq!(&*request.prompt().to_vec(), &[1, 2, 3, 9, 9], "prompt + its tokens");
        let params = request.params();
        assert_eq!((request.num_samples(), params.max_tokens(), params.seed()), (1, 3, Some(4)), "the rest, seed + 1");
        assert_eq!(request.id().as_str(), plan.request.id().as_str(), "under the future's id");
        assert!(request.continues_through_abort_pauses() && !request.include_prompt_logprobs());

        // A record that does not fit its request is not continued: the sample starts again from its prompt.
        let two = || Produced { sequences: vec![sequence(&[9]), sequence(&[9])], prompt_logprob_bits: None };
        let continued = |overrides: Value, produced: Produced| {
            body(overrides).into_plan(id, &AdapterKey::Base, &coordinator, Some(produced)).expect("valid").resumed
        };
        assert!(continued(json!({"num_samples": 3}), two()).is_none(), "another number of sequences");
        assert!(continued(json!({"prompt_logprobs": true}), two()).is_none(), "no prompt logprobs when wanted");
        assert!(continued(json!({}), two()).is_some());
    }

    #[tokio::test]
    async fn stop_is_the_complete_stop_set() {
        let coordinator = coordinator().await;
        let with_stop = |stop: Value| {
            let p = plan(&coordinator, json!({"sampling_params": {"max_tokens": 5, "stop": stop}})).expect("valid");
            let params = p.request.params();
            (params.stop_token_ids().to_vec(), p.stop_strings.to_vec(), params.ignore_eos())
        };
        assert_eq!(with_stop(Value::Null), (vec![], vec![], false), "absent: EOS stops");
        assert_eq!(with_stop(json!([])), (vec![], vec![], true), "[] disables EOS too");
        assert_eq!(with_stop(json!([10, 3])), (vec![3, 10], vec![], true));
        assert_eq!(with_stop(json!("\n")), (vec![], vec!["\n".to_owned()], true));
        assert_eq!(with_stop(json!(["a", "b"])), (vec![], vec!["a".to_owned(), "b".to_owned()], true));
        for bad in [json!([""]), json!(["a", 1]), json!([1, "a"]), json!([-1]), json!(3)] {
            let field = refused_field(&coordinator, json!({"sampling_params": {"max_tokens": 5, "stop": bad}}));
            assert_eq!(field, "sampling_params.stop", "{bad}");
        }
    }

    #[tokio::test]
    async fn stops_pass_the_same_caps_as_every_fronts() {
        let coordinator = coordinator().await;
        let many_strings: Vec<String> = (0..=loragate_text::MAX_STOP_STRINGS).map(|i| format!("s{i}")).collect();
        let long_string = "x".repeat(loragate_text::MAX_STOP_STRING_BYTES + 1);
        let many_tokens = vec![1; loragate_core::MAX_STOP_TOKEN_IDS + 1];
        for bad in [json!(many_strings), json!([long_string]), json!(many_tokens)] {
            let field = refused_field(&coordinator, json!({"sampling_params": {"max_tokens": 5, "stop": bad}}));
            assert_eq!(field, "sampling_params.stop");
        }
        let at_the_caps: Vec<String> = (0..loragate_text::MAX_STOP_STRINGS).map(|i| format!("s{i}")).collect();
        let stop = json!({"sampling_params": {"max_tokens": 5, "stop": at_the_caps}});
        assert!(plan(&coordinator, stop).is_ok(), "the caps themselves are accepted");
    }

    #[tokio::test]
    async fn each_unusable_field_is_refused_by_its_tinker_name() {
        let coordinator = coordinator().await;
        let cases = [
            (json!({"num_samples": 0}), "num_samples"),
            (json!({"num_samples": 65}), "num_samples"),
            (json!({"prompt": {"chunks": []}}), "prompt"),
            (json!({"prompt": {"chunks": [{"type": "image", "data": "x"}]}}), "prompt.chunks[0].type"),
            (json!({"prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 999]}]}}), "prompt"),
            (json!({"sampling_params": {"max_tokens": 0}}), "sampling_params.max_tokens"),
            (json!({"sampling_params": {"max_tokens": 5, "top_p": 0.0}}), "sampling_params.top_p"),
            (json!({"sampling_params": {"max_tokens": 5, "temperature": -1.0}}), "sampling_params.temperature"),
            (json!({"topk_prompt_logprobs": 2}), "topk_prompt_logprobs"),
            (json!({"topk_sample_logprobs": 1}), "topk_sample_logprobs"),
            (json!({"prompt_alt_tokens_k": 1}), "prompt_alt_tokens_k"),
            (json!({"target_prompt_logprobs": {"data": []}}), "target_prompt_logprobs"),
            (json!({"record_stability_info": true}), "record_stability_info"),
            (json!({"prompt_logprobs_last_n": 1}), "prompt_logprobs_last_n"),
            (json!({"prompt_logprobs": true, "prompt_logprobs_last_n": 3}), "prompt_logprobs_last_n"),
            (json!({"prompt_logprobs": true, "prompt_logprobs_last_n": 0}), "prompt_logprobs_last_n"),
        ];
        for (overrides, field) in cases {
            assert_eq!(refused_field(&coordinator, overrides.clone()), field, "{overrides}");
        }
        let last_two = plan(&coordinator, json!({"prompt_logprobs": true, "prompt_logprobs_last_n": 2})).expect("ok");
        assert_eq!(last_two.prompt_logprobs_last_n, Some(2));
        assert!(last_two.request.include_prompt_logprobs());
    }
}
