//! An engine layer that stalls requests mid-sample on demand. The next requests of a stalled adapter deliver a set
//! number of tokens per sequence and then nothing more until they are cancelled (a pause), when each stalled
//! sequence ends with `Abort` after the tokens it delivered, as the engine contract says of a cancellation. A test
//! that pauses "mid-sample" is so certain that the pause finds its requests running, however slow or loaded the
//! machine: nothing depends on the pause landing before the engine would have finished.
//!
//! The layer wraps the real engine of a [`crate::DemoServer`]; requests of adapters that are not stalled pass through
//! untouched.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use futures::StreamExt;
use loragate_core::{
    AdapterKey, AdapterLayout, AdapterName, AdapterSource, AdapterVersion, Engine, EngineError, EngineEvent,
    EngineStream, FinishReason, ModelInfo, Parking, SampleRequest,
};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Which requests stall, and how many sequences are stalled now.
#[derive(Debug)]
pub struct Stalls {
    /// Per adapter: how many of its next requests stall, and after how many tokens per sequence.
    armed: Mutex<HashMap<AdapterKey, Arming>>,
    /// The number of sequences stalled now (delivered their tokens and wait for their request's cancellation).
    stalled: watch::Sender<usize>,
}

#[derive(Clone, Copy, Debug)]
struct Arming {
    requests: u32,
    after_tokens: u32,
}

impl Stalls {
    /// Nothing stalls.
    pub fn new() -> Arc<Self> {
        Arc::new(Self { armed: Mutex::default(), stalled: watch::Sender::new(0) })
    }

    /// The next `requests` requests of `adapter` stall after `after_tokens` tokens per sequence (at least 1); the
    /// requests after them run freely (a kept request's continuation, say).
    pub fn stall_next(&self, adapter: AdapterKey, requests: u32, after_tokens: u32) {
        assert!(after_tokens > 0, "a stalled sequence delivers at least one token");
        let arming = Arming { requests, after_tokens };
        self.armed.lock().unwrap_or_else(PoisonError::into_inner).insert(adapter, arming);
    }

    /// The number of sequences stalled now.
    pub fn stalled(&self) -> usize {
        *self.stalled.borrow()
    }

    /// Waits until at least `sequences` sequences are stalled (none of them can end before its request is
    /// cancelled, so the count cannot pass by unseen).
    pub async fn wait_stalled(&self, sequences: usize) {
        let mut stalled = self.stalled.subscribe();
        let reached = stalled.wait_for(|now| *now >= sequences);
        let waited = tokio::time::timeout(crate::PATIENCE, reached).await;
        waited.expect("the sequences stalled in time").expect("the stalls live as long as the server");
    }

    /// How many tokens per sequence `request` delivers before it stalls, if it is one of its adapter's stalled
    /// requests (counted off).
    fn take(&self, request: &SampleRequest) -> Option<u32> {
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        let arming = armed.get_mut(request.adapter())?;
        arming.requests = arming.requests.checked_sub(1)?;
        let after_tokens = arming.after_tokens;
        if arming.requests == 0 {
            armed.remove(request.adapter());
        }
        Some(after_tokens)
    }

    fn add_stalled(&self, sequences: usize) {
        self.stalled.send_modify(|stalled| *stalled += sequences);
    }
}

/// The engine layer: `inner`, with [`Stalls`] applied to each request.
pub struct StallingEngine {
    inner: Arc<dyn Engine>,
    stalls: Arc<Stalls>,
}

impl StallingEngine {
    /// `inner` with `stalls` applied.
    pub fn new(inner: Arc<dyn Engine>, stalls: Arc<Stalls>) -> Self {
        Self { inner, stalls }
    }
}

#[async_trait]
impl Engine for StallingEngine {
    fn model_info(&self) -> &ModelInfo {
        self.inner.model_info()
    }

    fn can_park(&self) -> bool {
        self.inner.can_park()
    }

    fn check_adapter_layout(&self, layout: &AdapterLayout) -> Result<(), EngineError> {
        self.inner.check_adapter_layout(layout)
    }

    async fn generate(&self, request: SampleRequest, cancel: CancellationToken) -> Result<EngineStream, EngineError> {
        self.generate_parking(request, cancel, Parking::default()).await
    }

    /// A stalled request runs without parking: its sequences' keys and values would cover tokens it never
    /// delivered, so a kept one is prefilled on its continuation.
    async fn generate_parking(
        &self,
        request: SampleRequest,
        cancel: CancellationToken,
        parking: Parking,
    ) -> Result<EngineStream, EngineError> {
        let Some(after_tokens) = self.stalls.take(&request) else {
            return self.inner.generate_parking(request, cancel, parking).await;
        };
        let sequences = request.num_samples() as usize;
        let inner_cancel = cancel.child_token();
        let inner = self.inner.generate(request, inner_cancel.clone()).await?;
        let (out, events) = mpsc::unbounded_channel();
        let relay = StalledRelay {
            stalls: self.stalls.clone(),
            after_tokens,
            delivered: vec![0; sequences],
            stalled: vec![false; sequences],
            ended: vec![false; sequences],
            out,
        };
        tokio::spawn(relay.run(inner, cancel, inner_cancel));
        Ok(futures::stream::unfold(events, |mut events| async move { Some((events.recv().await?, events)) }).boxed())
    }

    async fn load_adapter(
        &self,
        name: &AdapterName,
        version: AdapterVersion,
        source: &AdapterSource,
    ) -> Result<(), EngineError> {
        self.inner.load_adapter(name, version, source).await
    }

    async fn unload_adapter(&self, name: &AdapterName, version: AdapterVersion) -> Result<(), EngineError> {
        self.inner.unload_adapter(name, version).await
    }

    async fn release_version(&self, name: &AdapterName, version: AdapterVersion) -> Result<(), EngineError> {
        self.inner.release_version(name, version).await
    }

    fn reset_prefix_cache(&self) -> usize {
        self.inner.reset_prefix_cache()
    }
}

/// Relays a stalled request's events: each sequence's first `after_tokens` tokens, then nothing until the request is
/// cancelled.
struct StalledRelay {
    stalls: Arc<Stalls>,
    after_tokens: u32,
    delivered: Vec<u32>,
    stalled: Vec<bool>,
    ended: Vec<bool>,
    out: mpsc::UnboundedSender<Result<EngineEvent, EngineError>>,
}

impl StalledRelay {
    async fn run(mut self, mut inner: EngineStream, cancel: CancellationToken, inner_cancel: CancellationToken) {
        loop {
            let event = tokio::select! {
                event = inner.next() => event,
                () = self.out.closed() => break,
            };
            let Some(event) = event else { break };
            let Some(event) = self.relayed(event) else { continue };
            if self.out.send(event).is_err() {
                break;
            }
            if self.stalled.iter().zip(&self.ended).all(|(stalled, ended)| *stalled || *ended) {
                // Every sequence delivered what it may: the engine's further work would be thrown away.
                inner_cancel.cancel();
            }
        }
        if self.stalled.contains(&true) && !self.out.is_closed() {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = self.out.closed() => {}
            }
        }
        // Counted off before the ends are sent: whoever sees them end sees the count without them.
        for sequence in self.unstall() {
            let _ = self.out.send(Ok(EngineEvent::Finished { sequence, reason: FinishReason::Abort }));
        }
    }

    /// What of `event` reaches the caller: a stalled sequence's later tokens and its end do not.
    fn relayed(&mut self, event: Result<EngineEvent, EngineError>) -> Option<Result<EngineEvent, EngineError>> {
        let event = match event {
            Ok(EngineEvent::Tokens { sequence, version, mut token_ids, mut logprobs, mut top_logprobs }) => {
                let index = sequence as usize;
                if self.stalled[index] {
                    return None;
                }
                let room = (self.after_tokens - self.delivered[index]) as usize;
                if token_ids.len() >= room {
                    token_ids.truncate(room);
                    logprobs.truncate(room);
                    top_logprobs.truncate(room);
                    self.stalled[index] = true;
                    self.stalls.add_stalled(1);
                }
                self.delivered[index] += u32::try_from(token_ids.len()).expect("a token count");
                EngineEvent::Tokens { sequence, version, token_ids, logprobs, top_logprobs }
            }
            Ok(EngineEvent::Finished { sequence, .. }) if self.stalled[sequence as usize] => return None,
            Ok(EngineEvent::Finished { sequence, reason }) => {
                self.ended[sequence as usize] = true;
                EngineEvent::Finished { sequence, reason }
            }
            other => return Some(other),
        };
        Some(Ok(event))
    }

    /// The request's stalled sequences are no longer stalled (they end, or their caller left): they are counted off
    /// and returned.
    fn unstall(&mut self) -> Vec<u32> {
        let stalled: Vec<u32> = (0..self.stalled.len())
            .filter(|&index| self.stalled[index])
            .map(|index| u32::try_from(index).expect("a sequence index"))
            .collect();
        self.stalled.fill(false);
        self.stalls.stalled.send_modify(|now| *now -= stalled.len());
        stalled
    }
}
