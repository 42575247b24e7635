//! A request's output channel from the step thread to its caller: bounded, and the step thread never waits on it.
//!
//! The step thread only appends under a short lock; a caller that reads slowly (or not at all) never blocks a step.
//! The queue stays bounded because a sequence's new tokens are **coalesced** into its `Tokens` event still waiting
//! to be read: at most one `PromptLogprobs`, and per sequence one `Tokens` and one `Finished` (or error) are ever
//! queued, and the tokens queued never exceed the request's token budget. A reader catching up gets the same tokens,
//! logprobs and versions in the same order per sequence, in fewer events.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use futures::task::AtomicWaker;
use loragate_core::{EngineError, EngineEvent};
use parking_lot::Mutex;

type Item = Result<EngineEvent, EngineError>;

/// A new request's output channel.
pub(crate) fn outbox() -> (EventSender, EventReceiver) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State { queued: VecDeque::new(), senders: 1, open: true }),
        reader: AtomicWaker::new(),
    });
    (EventSender { shared: shared.clone() }, EventReceiver { shared })
}

struct Shared {
    state: Mutex<State>,
    reader: AtomicWaker,
}

struct State {
    queued: VecDeque<Item>,
    /// Live [`EventSender`]s; the stream ends when none is left and the queue is read.
    senders: usize,
    /// The receiver still exists.
    open: bool,
}

impl State {
    /// Queues `item`, merging new tokens into the sequence's unread `Tokens` event of the same version.
    fn push(&mut self, item: Item) {
        if let Ok(EngineEvent::Tokens { sequence, version, token_ids, logprobs }) = &item {
            let unread = self.queued.iter_mut().rev().find_map(|queued| match queued {
                Ok(EngineEvent::Tokens { sequence: s, version: v, token_ids, logprobs })
                    if s == sequence && v == version =>
                {
                    Some((token_ids, logprobs))
                }
                _ => None,
            });
            if let Some((queued_tokens, queued_logprobs)) = unread {
                queued_tokens.extend_from_slice(token_ids);
                queued_logprobs.extend_from_slice(logprobs);
                return;
            }
        }
        self.queued.push_back(item);
    }
}

/// The step thread's end. Cloning it is cheap; the caller's stream ends once every sender is dropped.
pub(crate) struct EventSender {
    shared: Arc<Shared>,
}

impl EventSender {
    /// Queues `item` for the caller without waiting; false if the caller is gone (the item is dropped).
    pub(crate) fn send(&self, item: Item) -> bool {
        {
            let mut state = self.shared.state.lock();
            if !state.open {
                return false;
            }
            state.push(item);
        }
        self.shared.reader.wake();
        true
    }

    /// Whether the caller dropped its stream.
    pub(crate) fn is_closed(&self) -> bool {
        !self.shared.state.lock().open
    }
}

impl Clone for EventSender {
    fn clone(&self) -> Self {
        self.shared.state.lock().senders += 1;
        Self { shared: self.shared.clone() }
    }
}

impl Drop for EventSender {
    fn drop(&mut self) {
        let last = {
            let mut state = self.shared.state.lock();
            state.senders -= 1;
            state.senders == 0
        };
        if last {
            self.shared.reader.wake();
        }
    }
}

/// The caller's end: a stream of the request's events.
pub(crate) struct EventReceiver {
    shared: Arc<Shared>,
}

impl EventReceiver {
    /// The next queued event, if any, without waiting.
    #[cfg(test)]
    pub(crate) fn try_recv(&mut self) -> Option<Item> {
        self.shared.state.lock().queued.pop_front()
    }

    /// How many events are queued (coalesced), for tests of the bound.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.shared.state.lock().queued.len()
    }
}

impl Stream for EventReceiver {
    type Item = Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        // Registered before looking, so a send after the look wakes this task.
        self.shared.reader.register(cx.waker());
        let mut state = self.shared.state.lock();
        match state.queued.pop_front() {
            Some(item) => Poll::Ready(Some(item)),
            None if state.senders == 0 => Poll::Ready(None),
            None => Poll::Pending,
        }
    }
}

impl Drop for EventReceiver {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock();
        state.open = false;
        state.queued.clear();
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use loragate_core::{AdapterVersion, FinishReason};

    use super::*;

    fn tokens(sequence: u32, version: u64, token_ids: &[u32]) -> Item {
        let logprobs = token_ids.iter().map(|t| -(*t as f32)).collect();
        Ok(EngineEvent::Tokens { sequence, version: AdapterVersion(version), token_ids: token_ids.to_vec(), logprobs })
    }

    #[tokio::test]
    async fn an_unread_outbox_coalesces_tokens_per_sequence_and_keeps_their_order() {
        let (sender, mut receiver) = outbox();
        assert!(sender.send(Ok(EngineEvent::PromptLogprobs(vec![f32::NAN, -1.0]))));
        for step in 0..1000 {
            for sequence in 0..3 {
                assert!(sender.send(tokens(sequence, 4, &[step])));
            }
        }
        assert!(sender.send(Ok(EngineEvent::Finished { sequence: 1, reason: FinishReason::Length })));
        assert!(sender.send(tokens(0, 4, &[1000])));
        assert_eq!(receiver.queued(), 5, "prompt logprobs, one Tokens per sequence, one Finished");
        drop(sender);

        let mut events = Vec::new();
        while let Some(event) = receiver.next().await {
            events.push(event.expect("no errors"));
        }
        let all: Vec<u32> = (0..1000).collect();
        let mut seq0 = all.clone();
        seq0.push(1000);
        let expected_logprobs = |ids: &[u32]| ids.iter().map(|t| -(*t as f32)).collect::<Vec<_>>();
        assert!(matches!(&events[0], EngineEvent::PromptLogprobs(l) if l.len() == 2));
        assert_eq!(
            events[1..],
            [
                EngineEvent::Tokens {
                    sequence: 0,
                    version: AdapterVersion(4),
                    logprobs: expected_logprobs(&seq0),
                    token_ids: seq0
                },
                EngineEvent::Tokens {
                    sequence: 1,
                    version: AdapterVersion(4),
                    logprobs: expected_logprobs(&all),
                    token_ids: all.clone()
                },
                EngineEvent::Tokens {
                    sequence: 2,
                    version: AdapterVersion(4),
                    logprobs: expected_logprobs(&all),
                    token_ids: all
                },
                EngineEvent::Finished { sequence: 1, reason: FinishReason::Length },
            ]
        );
    }

    #[tokio::test]
    async fn tokens_of_another_version_are_not_merged_and_read_events_are_not_reopened() {
        let (sender, mut receiver) = outbox();
        sender.send(tokens(0, 1, &[1]));
        sender.send(tokens(0, 2, &[2]));
        assert_eq!(receiver.queued(), 2, "versions stay apart");
        assert_eq!(receiver.next().await.expect("event").expect("ok"), tokens(0, 1, &[1]).expect("ok"));
        sender.send(tokens(0, 2, &[3]));
        sender.send(tokens(0, 1, &[4]));
        assert_eq!(receiver.try_recv().expect("queued").expect("ok"), tokens(0, 2, &[2, 3]).expect("ok"));
        assert_eq!(receiver.try_recv().expect("queued").expect("ok"), tokens(0, 1, &[4]).expect("ok"));
    }

    #[tokio::test]
    async fn a_dropped_receiver_closes_the_outbox_and_the_last_sender_ends_the_stream() {
        let (sender, mut receiver) = outbox();
        let clone = sender.clone();
        drop(sender);
        clone.send(tokens(0, 1, &[1]));
        drop(clone);
        assert!(receiver.next().await.is_some());
        assert!(receiver.next().await.is_none(), "no sender left: the stream ends");

        let (sender, receiver) = outbox();
        assert!(!sender.is_closed());
        drop(receiver);
        assert!(sender.is_closed());
        assert!(!sender.send(tokens(0, 1, &[1])), "nothing is queued for a caller that left");
    }

    #[tokio::test]
    async fn a_waiting_reader_is_woken_by_a_send_from_another_thread() {
        let (sender, mut receiver) = outbox();
        let writer = std::thread::spawn(move || {
            for token in 0..100 {
                sender.send(tokens(0, 1, &[token]));
            }
        });
        let mut received = Vec::new();
        while let Some(event) = receiver.next().await {
            if let Ok(EngineEvent::Tokens { token_ids, .. }) = event {
                received.extend(token_ids);
            }
        }
        writer.join().expect("writer");
        assert_eq!(received, (0..100).collect::<Vec<_>>());
    }
}
