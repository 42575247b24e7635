//! How a future is recorded in the coordinator's state store, so that it survives a restart: one
//! [`FrontRecord`] per future in the table [`TABLE`], keyed by its request id, its value a JSON document. The store
//! knows nothing of it (it is opaque there); this module alone writes and reads it.
//!
//! - **Pending**: the `asample` body as received (it passed validation; at start it is validated again by the same
//!   code, consuming it, under the same request id), the target, the creator's kind and the resubmission key; once
//!   its sample produced tokens, what it had produced when last recorded ([`Produced`]: rewritten as the sample runs,
//!   at most every few hundred milliseconds or tokens, see `sample_task/progress.rs`), from which a restart continues.
//! - **Finished** / **failed**: what `retrieve_future` answers (the `SampleResponse` bytes, or the failure) and when
//!   it settled, as wall-clock time: the result is kept after a restart until its retention ends.
//!
//! Keys are not recorded, only their kind ([`CreatorKind`]): a future restored after a restart is readable by a key of
//! the same kind that may sample its target (see [`Creator::may_read`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use loragate_core::state::{FrontRecord, StateChange};
use loragate_core::{Action, AdapterKey, Principal};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{DedupKey, Failure, FailureCategory, FutureState};
use crate::ids::FutureId;
use crate::proto::{Ending, FinishedSequence};

/// The front's table in the state store.
pub(crate) const TABLE: &str = "tinker/samples";

/// Who created a future: only that caller may read it.
#[derive(Clone, Debug)]
pub(crate) enum Creator {
    /// The caller of this process's `asample`: the same key reads it.
    Caller(Principal),
    /// A future recorded before a restart: a key of the same kind that may sample its target reads it.
    Restored(CreatorKind),
}

impl Creator {
    /// Whether `caller` may read a future of `target` this creator made.
    pub(crate) fn may_read(&self, caller: &Principal, target: &AdapterKey) -> bool {
        match self {
            Self::Caller(creator) => caller.is_same_key(creator),
            Self::Restored(kind) => {
                CreatorKind::of(caller) == *kind && caller.authorize(Action::Sample, target).is_ok()
            }
        }
    }

    fn kind(&self) -> CreatorKind {
        match self {
            Self::Caller(principal) => CreatorKind::of(principal),
            Self::Restored(kind) => *kind,
        }
    }
}

/// The kind of key that created a future, as recorded (keys themselves are never written down).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CreatorKind {
    /// Authentication off.
    Anyone,
    /// The admin key.
    Admin,
    /// The API key.
    Sampler,
    /// A tenant key.
    Tenant,
}

impl CreatorKind {
    fn of(principal: &Principal) -> Self {
        match principal {
            Principal::Anyone => Self::Anyone,
            Principal::Admin => Self::Admin,
            Principal::Sampler => Self::Sampler,
            Principal::Tenant(_) => Self::Tenant,
        }
    }
}

/// One future's record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SampleRecord {
    /// The adapter's name, or `""` for the base model.
    pub(crate) target: String,
    /// Who created it.
    pub(crate) creator: CreatorKind,
    /// Its resubmission key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) dedup: Option<DedupKey>,
    /// What it is now.
    #[serde(flatten)]
    pub(crate) state: RecordedState,
}

/// A recorded future's state.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum RecordedState {
    /// Its sample runs: the `asample` body, to be continued after a restart.
    Pending {
        /// The body as received.
        request: Value,
        /// What the sample had produced when last recorded (absent until its first tokens, and in records written
        /// before this was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        produced: Option<Produced>,
    },
    /// Its `SampleResponse`.
    Finished {
        /// The encoded response, in hex.
        response_hex: String,
        /// When it settled (ms since the Unix epoch).
        settled_at_ms: u64,
    },
    /// Its failure.
    Failed {
        /// The message.
        error: String,
        /// `user` or `server`.
        category: String,
        /// When it settled (ms since the Unix epoch).
        settled_at_ms: u64,
    },
}

/// What a pending sample had produced when it was last recorded: a restart continues each sequence from there.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Produced {
    /// Each sequence, in order.
    pub(crate) sequences: Vec<ProducedSequence>,
    /// The prompt's logprobs, when they were asked for and had come (as `f32` bit patterns: the first is NaN, which
    /// JSON has no number for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) prompt_logprob_bits: Option<Vec<u32>>,
}

/// One sequence's tokens so far.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ProducedSequence {
    /// The tokens.
    pub(crate) tokens: Vec<u32>,
    /// One logprob per token, as `f32` bit patterns (exact; `-inf` survives JSON).
    pub(crate) logprob_bits: Vec<u32>,
    /// How it ended, once it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ending: Option<RecordedEnding>,
}

/// A recorded sequence's ending.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RecordedEnding {
    /// [`Ending::Stop`].
    Stop,
    /// [`Ending::Length`].
    Length,
}

impl ProducedSequence {
    /// The record of `sequence` as collected so far.
    pub(crate) fn of(sequence: &FinishedSequence) -> Self {
        Self {
            tokens: sequence.tokens.clone(),
            logprob_bits: sequence.logprobs.iter().map(|logprob| logprob.to_bits()).collect(),
            ending: sequence.ending.map(|ending| match ending {
                Ending::Stop => RecordedEnding::Stop,
                Ending::Length => RecordedEnding::Length,
            }),
        }
    }

    /// The sequence as collected when it was recorded; `None` if its tokens and logprobs do not pair up.
    pub(crate) fn to_sequence(&self) -> Option<FinishedSequence> {
        (self.tokens.len() == self.logprob_bits.len()).then(|| FinishedSequence {
            tokens: self.tokens.clone(),
            logprobs: self.logprob_bits.iter().map(|&bits| f32::from_bits(bits)).collect(),
            ending: self.ending.map(|ending| match ending {
                RecordedEnding::Stop => Ending::Stop,
                RecordedEnding::Length => Ending::Length,
            }),
        })
    }
}

impl Produced {
    /// The prompt's logprobs, if recorded.
    pub(crate) fn prompt_logprobs(&self) -> Option<Vec<f32>> {
        self.prompt_logprob_bits.as_ref().map(|bits| bits.iter().map(|&bits| f32::from_bits(bits)).collect())
    }
}

impl SampleRecord {
    /// The record of a pending future.
    pub(crate) fn pending(target: &AdapterKey, creator: &Creator, dedup: Option<DedupKey>, request: Value) -> Self {
        Self {
            target: target.as_wire_str().to_owned(),
            creator: creator.kind(),
            dedup,
            state: RecordedState::Pending { request, produced: None },
        }
    }

    /// This pending record with what its sample has `produced` so far (a settled record is returned as it is).
    pub(crate) fn with_produced(&self, produced: Produced) -> Self {
        let mut record = self.clone();
        if let RecordedState::Pending { produced: recorded, .. } = &mut record.state {
            *recorded = Some(produced);
        }
        record
    }

    /// The record of a future settled at `settled_at` in state `state`; `None` if it is still pending.
    pub(crate) fn settled(
        target: &AdapterKey,
        creator: &Creator,
        dedup: Option<DedupKey>,
        state: &FutureState,
        settled_at: SystemTime,
    ) -> Option<Self> {
        let settled_at_ms = unix_ms(settled_at);
        let state = match state {
            FutureState::Pending => return None,
            FutureState::Finished(bytes) => RecordedState::Finished { response_hex: hex(bytes), settled_at_ms },
            FutureState::Failed(failure) => RecordedState::Failed {
                error: failure.message.clone(),
                category: failure.category.as_str().to_owned(),
                settled_at_ms,
            },
        };
        Some(Self { target: target.as_wire_str().to_owned(), creator: creator.kind(), dedup, state })
    }

    /// The change that writes this record for `id`.
    pub(crate) fn put(&self, id: FutureId) -> StateChange {
        let value = serde_json::to_string(self).unwrap_or_default();
        StateChange::FrontRecordPut(FrontRecord { table: TABLE.to_owned(), key: id.to_wire(), value })
    }

    /// Reads a record's value.
    pub(crate) fn parse(value: &str) -> Result<Self, String> {
        serde_json::from_str(value).map_err(|err| err.to_string())
    }

    /// The settled state this record holds and when it settled; `None` for a pending one (or unreadable bytes).
    pub(crate) fn settled_state(&self) -> Option<(FutureState, SystemTime)> {
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        match &self.state {
            RecordedState::Pending { .. } => None,
            RecordedState::Finished { response_hex, settled_at_ms } => {
                Some((FutureState::Finished(Bytes::from(unhex(response_hex)?)), at(*settled_at_ms)))
            }
            RecordedState::Failed { error, category, settled_at_ms } => {
                let category = if category == "user" { FailureCategory::User } else { FailureCategory::Server };
                let failure = Failure { message: error.clone(), category };
                Some((FutureState::Failed(failure), at(*settled_at_ms)))
            }
        }
    }
}

/// The change that removes the record of `id`.
pub(crate) fn removed(id: FutureId) -> StateChange {
    StateChange::FrontRecordRemoved { table: TABLE.to_owned(), key: id.to_wire() }
}

fn unix_ms(at: SystemTime) -> u64 {
    u64::try_from(at.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    text
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use loragate_core::AdapterName;

    use super::*;
    use crate::ids::{Epoch, IdMaker};

    #[test]
    fn settled_records_round_trip_their_answer_and_time() {
        let meow = AdapterKey::Lora(AdapterName::parse("meow").expect("name"));
        let creator = Creator::Caller(Principal::Sampler);
        let dedup = Some(DedupKey { sampling_session_id: "ss-1".into(), seq_id: 7 });
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let answer = FutureState::Finished(Bytes::from_static(&[0, 1, 0xab, 0xff]));
        let record = SampleRecord::settled(&meow, &creator, dedup.clone(), &answer, at).expect("settled");
        let read = SampleRecord::parse(&serde_json::to_string(&record).expect("json")).expect("parses");
        assert_eq!((read.target.as_str(), read.creator, read.dedup.clone()), ("meow", CreatorKind::Sampler, dedup));
        assert_eq!(read.settled_state(), Some((answer, at)));
        let failed = FutureState::Failed(Failure::user("gone"));
        let record = SampleRecord::settled(&AdapterKey::Base, &creator, None, &failed, at).expect("settled");
        assert_eq!(record.settled_state(), Some((failed, at)));
        assert!(SampleRecord::settled(&meow, &creator, None, &FutureState::Pending, at).is_none());
        assert_eq!(unhex("0g"), None, "damaged bytes are refused");
    }

    #[test]
    fn a_pending_record_keeps_what_its_sample_produced_exactly_and_older_records_without_it_still_read() {
        let meow = AdapterKey::Lora(AdapterName::parse("meow").expect("name"));
        let creator = Creator::Caller(Principal::Anyone);
        let body = serde_json::json!({"num_samples": 2});
        let pending = SampleRecord::pending(&meow, &creator, None, body.clone());
        let sequence = FinishedSequence {
            tokens: vec![7, 8, 9],
            logprobs: vec![-0.25, f32::NEG_INFINITY, -1e-30],
            ending: Some(Ending::Length),
        };
        let produced = Produced {
            sequences: vec![ProducedSequence::of(&sequence), ProducedSequence::default()],
            prompt_logprob_bits: Some(vec![f32::NAN.to_bits(), (-2.5f32).to_bits()]),
        };
        let StateChange::FrontRecordPut(written) =
            pending.with_produced(produced.clone()).put(IdMaker::new(Epoch::random()).future_id())
        else {
            unreachable!("a put")
        };
        let read = SampleRecord::parse(&written.value).expect("parses");
        let RecordedState::Pending { request, produced: Some(read_produced) } = read.state else {
            panic!("pending, with what it produced: {}", written.value)
        };
        assert_eq!((request, &read_produced), (body.clone(), &produced));
        assert_eq!(read_produced.sequences[0].to_sequence(), Some(sequence), "tokens, logprobs and ending, exactly");
        let prompt = read_produced.prompt_logprobs().expect("recorded");
        assert!(prompt[0].is_nan() && prompt[1] == -2.5);

        let older = r#"{"target":"meow","creator":"anyone","state":"pending","request":{"num_samples":2}}"#;
        let RecordedState::Pending { produced: None, .. } = SampleRecord::parse(older).expect("parses").state else {
            panic!("an older pending record reads, with nothing produced")
        };
        let damaged = ProducedSequence { tokens: vec![1, 2], logprob_bits: vec![0], ending: None };
        assert_eq!(damaged.to_sequence(), None, "tokens without their logprobs are refused");
    }

    #[test]
    fn a_restored_future_is_read_by_a_key_of_its_creators_kind_that_may_sample_it() {
        let meow = AdapterKey::Lora(AdapterName::parse("meow").expect("name"));
        let restored = Creator::Restored(CreatorKind::Sampler);
        assert!(restored.may_read(&Principal::Sampler, &meow));
        assert!(!restored.may_read(&Principal::Admin, &meow), "another kind of key");
        assert!(Creator::Restored(CreatorKind::Anyone).may_read(&Principal::Anyone, &AdapterKey::Base));
        assert!(Creator::Caller(Principal::Admin).may_read(&Principal::Admin, &meow));
    }
}
