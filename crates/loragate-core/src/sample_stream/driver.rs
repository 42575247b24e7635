//! The task that drives one sampling request: it reads the engine's events as soon as they come, checks them,
//! records each token's provenance, forwards them to the request's [`SampleStream`](super::SampleStream), and hands
//! the request back when the engine has stopped it.
//!
//! A sequence the engine stopped for a keep-mode pause (or for an abort-mode pause, if the request asked the core
//! to continue it) is not forwarded as aborted: the driver hands the request back as *kept*, waits for the adapter
//! to reopen (counted as kept, bounded by the request's deadline), registers the request again and samples
//! `prompt + tokens so far` with the remaining budget for each such sequence, on the weights current then. If the
//! adapter is unloaded, the server stops, an abort-mode pause comes (for a request that does not continue through
//! them) or the deadline passes first, the sequence ends with `FINISH_REASON_ABORT` and every token it produced.
//!
//! Under [`KvPolicy::Reuse`](crate::KvPolicy::Reuse) the engine parks each kept decoding sequence
//! ([`EngineEvent::Parked`]): the driver keeps the handle with the sequence (dropping it, and so freeing the keys
//! and values, when the sequence ends any other way) and hands it to the continuation; when the engine reports
//! [`EngineEvent::Resumed`], the continuation's tokens are recorded with the parked keys' KV version.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use futures::StreamExt;
use futures::stream::select_all;
use tokio::sync::mpsc;

use super::{LiveRequest, unfinished_error};
use crate::adapter::{AdapterHandle, Admission, Counted, StalenessTicket, VersionPin};
use crate::contract::{
    AdapterName, AdapterVersion, CoreError, Ending, EngineError, FinishReason, SegmentsBuilder, StopCause,
};
use crate::engine::{Engine, EngineEvent, EngineStream, ParkedKv, Parking};
use crate::finished::{FinishedRequest, FinishedRequests, FinishedSequence};
use crate::gate_deadline::GateDeadline;
use crate::request_facts::RequestFacts;
use crate::sample_stream::SampleEvent;
use crate::sampling::{Continuation, SampleRequest};

type Output = mpsc::UnboundedSender<Result<SampleEvent, CoreError>>;

/// Where one sequence of the request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Progress {
    /// An engine request is producing it.
    Running,
    /// A pause stopped it; the driver continues it when the adapter reopens.
    Stopped,
    /// It ended; its `Finished` event was forwarded.
    Finished,
}

struct Sequence {
    /// Every token produced so far, across attempts (a continuation's prompt is the request's plus these).
    token_ids: Vec<u32>,
    segments: SegmentsBuilder,
    progress: Progress,
    /// The oldest adapter version in the keys and values the current engine run attends to: unknown (`None`) when
    /// a run starts with a prefill, the version of its first tokens from then on, and the parked keys and values'
    /// when the run resumed from them.
    kv_version: Option<AdapterVersion>,
    /// The keys and values the engine parked when a pause kept the sequence (KV_POLICY_REUSE), with their KV
    /// version, until the continuation takes them. Dropped (freed) when the sequence ends.
    parked: Option<(ParkedKv, Option<AdapterVersion>)>,
    /// The KV version of the parked keys and values the current run was started with, until it says it resumed.
    resuming_from: Option<AdapterVersion>,
    /// When its latest tokens came (for the inter-token latency).
    last_tokens_at: Option<Instant>,
    /// Why it ended, once it did.
    finish_reason: Option<FinishReason>,
}

/// One engine request of this request, and which of the request's sequences its sequences are.
struct EngineRun {
    events: EngineStream,
    sequences: Arc<[usize]>,
}

/// Drives one sampling request. Built by the coordinator once the first attempt is admitted and started.
pub(crate) struct Driver {
    engine: Arc<dyn Engine>,
    adapter: AdapterHandle,
    request: SampleRequest,
    deadline: GateDeadline,
    sequences: Vec<Sequence>,
    attempts: u32,
    aborted: bool,
    /// The adapter's count of abort-mode pauses when the current attempt was admitted: one after it ends the
    /// request while kept (unless it continues through abort pauses).
    abort_pauses_at_admission: u64,
    /// When the request reached the coordinator (before its gate): the start of its time to first token and its
    /// end-to-end latency, as vLLM counts them from its arrival.
    arrived: Instant,
    /// Whether a token came yet (time to first token is recorded once per request).
    produced: bool,
    /// The front request's facts for its access log, if its front keeps any.
    facts: Option<RequestFacts>,
    /// The pin on the exact version the request asked for (`NAME@V`), held until it ends.
    _pin: Option<VersionPin>,
    /// Its places under the staleness bound: given back for sequences that end aborted.
    staleness: Option<StalenessTicket>,
    /// How many of the prompt's tokens the engine found in its prefix cache (the first attempt's), which the
    /// request's [`SampleStream`](super::SampleStream) reads.
    cached_prompt_tokens: Arc<AtomicU32>,
    /// Where the request is recorded once it ends (`GET /v1/requests/{id}`).
    finished: Arc<FinishedRequests>,
    _live: LiveRequest,
}

impl Driver {
    pub(crate) fn new(
        engine: Arc<dyn Engine>,
        adapter: AdapterHandle,
        request: SampleRequest,
        deadline: GateDeadline,
        live: LiveRequest,
        arrived: Instant,
        finished: Arc<FinishedRequests>,
    ) -> Self {
        let sequences = (0..request.num_samples())
            .map(|_| Sequence {
                token_ids: Vec::new(),
                segments: SegmentsBuilder::default(),
                progress: Progress::Running,
                kv_version: None,
                parked: None,
                resuming_from: None,
                last_tokens_at: None,
                finish_reason: None,
            })
            .collect();
        let abort_pauses_at_admission = adapter.cell().gate_state().abort_pauses;
        let cell = adapter.cell();
        cell.metrics.requests().record_prompt(&cell.labels, request.prompt().len());
        let facts = RequestFacts::current();
        if let Some(facts) = &facts {
            // The base model is `""`, as its key's wire form and the metrics' `adapter` label spell it.
            let adapter = request.adapter().adapter_name().map_or("", AdapterName::as_str);
            facts.record_prompt(adapter, request.prompt().len());
        }
        Self {
            engine,
            adapter,
            request,
            deadline,
            sequences,
            attempts: 0,
            aborted: false,
            abort_pauses_at_admission,
            arrived,
            produced: false,
            facts,
            _pin: None,
            staleness: None,
            cached_prompt_tokens: Arc::default(),
            finished,
            _live: live,
        }
    }

    /// Holds the request's version pin and staleness places until it ends.
    pub(crate) fn holding(self, pin: Option<VersionPin>, staleness: Option<StalenessTicket>) -> Self {
        Self { _pin: pin, staleness, ..self }
    }

    /// Where the number of prompt tokens found in the engine's prefix cache is kept (see [`SampleStream`]).
    ///
    /// [`SampleStream`]: super::SampleStream
    pub(crate) fn cached_prompt_tokens(&self) -> Arc<AtomicU32> {
        Arc::clone(&self.cached_prompt_tokens)
    }

    pub(crate) fn num_samples(&self) -> usize {
        self.sequences.len()
    }

    /// Runs the request to its end: the first attempt (`admission`, `events`), then a continuation after each pause
    /// that stopped some of its sequences for keeping.
    pub(crate) async fn run(mut self, mut admission: Admission, events: EngineStream, out: Output) {
        let mut runs = vec![EngineRun { events, sequences: (0..self.sequences.len()).collect() }];
        loop {
            let stopped = match self.forward(&admission, runs, &out).await {
                Ok(stopped) => stopped,
                Err(err) => {
                    let _ = out.send(Err(err));
                    admission.hand_back(Ending::Failed);
                    return;
                }
            };
            if stopped.is_empty() {
                self.record_end();
                admission.hand_back(if self.aborted { Ending::Aborted } else { Ending::Completed });
                return;
            }
            // Counted as kept from the moment the pause has it until it is registered again.
            let adapter = self.adapter.clone();
            let kept = Counted::new(&adapter.cell().kept);
            admission.hand_back(Ending::Kept);
            let Some((next, next_runs)) = self.continue_stopped(&stopped, &out).await else {
                self.record_end();
                return;
            };
            drop(kept);
            (admission, runs) = (next, next_runs);
        }
    }

    /// Forwards the events of `runs` until none of their sequences is running; returns the sequences stopped for
    /// keeping. It returns right after the event that ended the last one (without waiting for the engine's streams
    /// to close), so the caller hands the request back with no await in between: a consumer that drops the stream
    /// as soon as it read the last event cannot turn a hand-back into an abandonment.
    async fn forward(
        &mut self,
        admission: &Admission,
        runs: Vec<EngineRun>,
        out: &Output,
    ) -> Result<Vec<usize>, CoreError> {
        let mut events = select_all(runs.into_iter().map(|run| {
            let sequences = run.sequences;
            run.events.map(move |event| (sequences.clone(), event))
        }));
        let mut stopped = Vec::new();
        // Counted as running from its first token until this attempt ends.
        let adapter = self.adapter.clone();
        let mut running = None;
        while self.sequences.iter().any(|sequence| sequence.progress == Progress::Running) {
            let Some((sequences, event)) = events.next().await else {
                let unfinished = self.sequences.iter().filter(|s| s.progress == Progress::Running).count();
                return Err(unfinished_error(unfinished, self.sequences.len()));
            };
            match event? {
                EngineEvent::PromptLogprobs(logprobs) => {
                    let _ = out.send(Ok(SampleEvent::PromptLogprobs(logprobs)));
                }
                EngineEvent::PromptTopLogprobs(top) => {
                    let _ = out.send(Ok(SampleEvent::PromptTopLogprobs(top)));
                }
                // A continuation's own cache hits (its prompt holds the tokens produced so far) are not the request's.
                EngineEvent::PromptCached { tokens } if self.attempts == 0 => {
                    self.cached_prompt_tokens.store(tokens, Ordering::Relaxed);
                }
                EngineEvent::PromptCached { .. } => {}
                EngineEvent::Tokens { sequence, version, token_ids, logprobs, top_logprobs } => {
                    if token_ids.len() != logprobs.len()
                        || !(top_logprobs.is_empty() || top_logprobs.len() == logprobs.len())
                    {
                        return Err(engine_bug(format!(
                            "engine sent {} tokens with {} logprobs and {} top-logprob entries",
                            token_ids.len(),
                            logprobs.len(),
                            top_logprobs.len()
                        )));
                    }
                    let index = self.running(&sequences, sequence)?;
                    let progress = &mut self.sequences[index];
                    let kv_version = *progress.kv_version.get_or_insert(version);
                    let count = u32::try_from(token_ids.len()).unwrap_or(u32::MAX);
                    progress.segments.push(version, kv_version, count);
                    progress.token_ids.extend_from_slice(&token_ids);
                    let cell = adapter.cell();
                    cell.metrics.record_tokens(&cell.labels, version, token_ids.len());
                    if let Some(facts) = &self.facts {
                        facts.record_generated(token_ids.len());
                    }
                    running.get_or_insert_with(|| Counted::new(&cell.running));
                    let now = Instant::now();
                    if let Some(previous) = progress.last_tokens_at.replace(now) {
                        cell.metrics.requests().record_inter_token(&cell.labels, now - previous, token_ids.len());
                    }
                    if !std::mem::replace(&mut self.produced, true) {
                        cell.metrics.requests().record_first_token(&cell.labels, now - self.arrived);
                    }
                    let sequence = index as u32;
                    let tokens =
                        SampleEvent::Tokens { sequence, version, kv_version, token_ids, logprobs, top_logprobs };
                    let _ = out.send(Ok(tokens));
                }
                EngineEvent::Parked { sequence, kv } => {
                    let index = self.running(&sequences, sequence)?;
                    let progress = &mut self.sequences[index];
                    progress.parked = Some((kv, progress.kv_version));
                }
                EngineEvent::Resumed { sequence } => {
                    let index = self.running(&sequences, sequence)?;
                    let progress = &mut self.sequences[index];
                    progress.kv_version = progress.resuming_from.take();
                }
                EngineEvent::Finished { sequence, reason } => {
                    let index = self.running(&sequences, sequence)?;
                    if reason == FinishReason::Abort && self.keeps(admission.stop_cause()) {
                        self.sequences[index].progress = Progress::Stopped;
                        stopped.push(index);
                    } else {
                        self.finish(index, reason, out);
                    }
                }
            }
        }
        Ok(stopped)
    }

    /// Waits for the adapter to reopen and starts an engine request for each stopped sequence that has budget left
    /// (ending the others); returns the new admission and runs, or `None` once the request is over.
    async fn continue_stopped(&mut self, stopped: &[usize], out: &Output) -> Option<(Admission, Vec<EngineRun>)> {
        self.attempts += 1;
        let model = self.engine.model_info().clone();
        let mut continuations = Vec::new();
        for &index in stopped {
            match self.request.continuation(index as u32, self.attempts, &self.sequences[index].token_ids, &model) {
                Continuation::Request(request) => continuations.push((index, *request)),
                Continuation::Finished(reason) => self.finish(index, reason, out),
            }
        }
        if continuations.is_empty() {
            return None;
        }
        let gives_up_at = (!self.request.continues_through_abort_pauses()).then_some(self.abort_pauses_at_admission);
        let readmitted =
            self.adapter.readmit_kept(self.request.id().clone(), self.deadline.hold_from_now(), gives_up_at);
        let admission = match readmitted.await {
            Ok(admission) => {
                self.abort_pauses_at_admission = self.adapter.cell().gate_state().abort_pauses;
                admission
            }
            Err(why) => {
                tracing::debug!(request = %self.request.id(), %why, "a kept request ends without its continuation");
                for (index, _) in continuations {
                    self.finish(index, FinishReason::Abort, out);
                }
                return None;
            }
        };
        let mut runs = Vec::with_capacity(continuations.len());
        for (index, request) in continuations {
            let (resume_from, resuming_from) = self.sequences[index].parked.take().unzip();
            let parking = Parking { park_on_cancel: admission.park_signal().clone(), resume_from };
            match self.engine.generate_parking(request, admission.cancel_token().clone(), parking).await {
                Ok(events) => {
                    let sequence = &mut self.sequences[index];
                    sequence.progress = Progress::Running;
                    // Prefilled again unless the engine says it resumed: then its keys and values go back to the
                    // parked ones' version.
                    sequence.kv_version = None;
                    sequence.resuming_from = resuming_from.flatten();
                    runs.push(EngineRun { events, sequences: Arc::new([index]) });
                }
                Err(why) => {
                    tracing::warn!(request = %self.request.id(), %why, "the engine refused a kept request's continuation");
                    self.finish(index, FinishReason::Abort, out);
                }
            }
        }
        if runs.is_empty() {
            admission.hand_back(Ending::Aborted);
            return None;
        }
        Some((admission, runs))
    }

    /// Records the request's end-to-end latency (it ended, finished or aborted).
    fn record_end(&self) {
        let cell = self.adapter.cell();
        cell.metrics.requests().record_end(&cell.labels, self.arrived.elapsed());
    }

    /// Records the request in the window of finished requests, once its last sequence ended: before that sequence's
    /// end is forwarded, so a caller that read its whole output finds it there.
    fn record_finished(&self) {
        let sequences = self
            .sequences
            .iter()
            .map(|sequence| FinishedSequence {
                finish_reason: sequence.finish_reason.unwrap_or(FinishReason::Abort),
                token_count: u32::try_from(sequence.token_ids.len()).unwrap_or(u32::MAX),
                segments: sequence.segments.segments().to_vec(),
            })
            .collect();
        self.finished.record(FinishedRequest {
            request_id: self.request.id().clone(),
            adapter: self.request.adapter().clone(),
            owner: self.request.owner().cloned(),
            finished_at: std::time::SystemTime::now(),
            sequences,
        });
    }

    /// Whether a sequence the engine aborted is kept for continuing rather than handed back aborted.
    fn keeps(&self, cause: Option<StopCause>) -> bool {
        match cause {
            Some(StopCause::Kept) => true,
            Some(StopCause::Paused) => self.request.continues_through_abort_pauses(),
            Some(StopCause::Targeted | StopCause::Retired) | None => false,
        }
    }

    /// The request's index of sequence `sequence` of an engine run, which must be running.
    fn running(&self, sequences: &[usize], sequence: u32) -> Result<usize, CoreError> {
        match sequences.get(sequence as usize) {
            Some(&index) if self.sequences[index].progress == Progress::Running => Ok(index),
            _ => Err(engine_bug(format!("engine sent an event for sequence {sequence}, which is not running"))),
        }
    }

    /// Ends sequence `index` with `reason` and forwards its end with the segments of all its tokens.
    fn finish(&mut self, index: usize, reason: FinishReason, out: &Output) {
        let sequence = &mut self.sequences[index];
        sequence.progress = Progress::Finished;
        sequence.finish_reason = Some(reason);
        // Frees parked keys and values nobody will resume from.
        sequence.parked = None;
        self.aborted |= reason == FinishReason::Abort;
        if reason == FinishReason::Abort
            && let Some(staleness) = &self.staleness
        {
            // Its continuation, if the caller resubmits one, takes a place again.
            staleness.give_back(1);
        }
        let segments = sequence.segments.segments().to_vec();
        self.adapter.cell().metrics.requests().record_finish(reason);
        if self.sequences.iter().all(|sequence| sequence.progress == Progress::Finished) {
            self.record_finished();
        }
        let _ = out.send(Ok(SampleEvent::Finished { sequence: index as u32, reason, segments }));
    }
}

fn engine_bug(message: String) -> CoreError {
    CoreError::Engine(EngineError::Internal(message))
}
