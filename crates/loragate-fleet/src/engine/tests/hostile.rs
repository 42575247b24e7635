//! A gRPC worker (`loragate worker`) over an engine that misbehaves (test code only): its `GenerateStream` stays
//! silent, stalls after two tokens, runs past the budget or sends a token outside the vocabulary. The fleet keeps
//! each sequence within its bounds and counts a failure of the worker, as over HTTP.

use loragate_core::{AdapterVersion, EngineEvent, EngineStream, SampleRequest};

use super::*;

#[derive(Clone, Copy, Debug)]
enum Misbehaviour {
    Silent,
    StallAfterTwo,
    Overrun,
    BadToken,
}

struct HostileEngine {
    info: ModelInfo,
    misbehaviour: Misbehaviour,
}

#[async_trait::async_trait]
impl Engine for HostileEngine {
    fn model_info(&self) -> &ModelInfo {
        &self.info
    }

    async fn generate(&self, request: SampleRequest, _cancel: CancellationToken) -> Result<EngineStream, EngineError> {
        let tokens = |token_ids: Vec<u32>| {
            let logprobs = vec![-0.5; token_ids.len()];
            let version = AdapterVersion::BASE;
            Ok(EngineEvent::Tokens { sequence: 0, version, token_ids, logprobs, top_logprobs: Vec::new() })
        };
        let sent: Vec<Result<EngineEvent, EngineError>> = match self.misbehaviour {
            Misbehaviour::Silent => Vec::new(),
            Misbehaviour::StallAfterTwo => vec![tokens(vec![11, 12])],
            Misbehaviour::Overrun => (1..=request.params().max_tokens() + 5).map(|n| tokens(vec![10 + n])).collect(),
            Misbehaviour::BadToken => vec![tokens(vec![11]), tokens(vec![999_999])],
        };
        // Never finished: what follows is silence.
        Ok(futures::stream::iter(sent).chain(futures::stream::pending()).boxed())
    }

    async fn load_adapter(&self, _: &AdapterName, _: AdapterVersion, _: &AdapterSource) -> Result<(), EngineError> {
        Ok(())
    }

    async fn unload_adapter(&self, _: &AdapterName, _: AdapterVersion) -> Result<(), EngineError> {
        Ok(())
    }

    async fn release_version(&self, _: &AdapterName, _: AdapterVersion) -> Result<(), EngineError> {
        Ok(())
    }
}

/// A fleet of one worker over an engine misbehaving so, with short timeouts and a failure record that no test
/// lasts long enough to clear.
async fn hostile_fleet(root: &Path, misbehaviour: Misbehaviour) -> (TestWorker, Arc<FleetEngine>, Coordinator) {
    let engine = Arc::new(HostileEngine { info: model(), misbehaviour });
    let worker = TestWorker::serving(engine, root, 0);
    let config = FleetConfig {
        first_byte_timeout: Duration::from_secs(1),
        inter_chunk_timeout: Duration::from_secs(1),
        failure_threshold: 1000,
        ..config()
    };
    let address = WorkerAddress::parse(&worker.address).expect("address");
    let fleet = Arc::new(FleetEngine::start(model(), vec![address], config).await.expect("fleet"));
    fleet.wait_ready().await.expect("the worker becomes ready");
    let coordinator = Coordinator::start(fleet.clone(), CoordinatorConfig::default()).await.expect("coordinator");
    (worker, fleet, coordinator)
}

async fn counted_failing(fleet: &FleetEngine) {
    eventually("the worker counted a failure", || async {
        fleet.snapshot().workers.first().is_some_and(|worker| worker.consecutive_failures >= 1)
    })
    .await;
}

#[tokio::test]
async fn a_grpc_worker_silent_or_stalled_hands_the_sequence_back_aborted_with_its_tokens() {
    let root = adapter_root(true);
    for (misbehaviour, tokens) in [(Misbehaviour::Silent, 0), (Misbehaviour::StallAfterTwo, 2)] {
        let (_worker, fleet, coordinator) = hostile_fleet(root.path(), misbehaviour).await;
        let finished = finish(sample(&coordinator, "", 100, 1).await).await;
        assert_eq!(finished, vec![(FinishReason::Abort, tokens)], "{misbehaviour:?}");
        counted_failing(&fleet).await;
    }
}

#[tokio::test]
async fn a_grpc_worker_past_the_budget_is_cut_at_it_and_a_token_outside_the_vocabulary_is_a_protocol_error() {
    let root = adapter_root(true);
    let (_worker, fleet, coordinator) = hostile_fleet(root.path(), Misbehaviour::Overrun).await;
    let output = sample(&coordinator, "", 8, 1).await.collect_output().await.expect("a whole sample");
    let sequence = &output.sequences[0];
    assert_eq!((sequence.finish_reason, sequence.token_ids.clone()), (FinishReason::Length, (11..=18).collect()));
    counted_failing(&fleet).await;

    let (_worker, fleet, coordinator) = hostile_fleet(root.path(), Misbehaviour::BadToken).await;
    let err = sample(&coordinator, "", 8, 1).await.collect_output().await.expect_err("a protocol error").to_string();
    assert!(err.contains("999999") && err.contains("outside the vocabulary"), "{err}");
    counted_failing(&fleet).await;
}
