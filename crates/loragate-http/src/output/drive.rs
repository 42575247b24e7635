//! Driving the core requests of one HTTP request (one per prompt) together: their deltas, merged in the order they
//! come. A request's stream is dropped as soon as all its choices ended (some perhaps at a stop string while the
//! engine was still generating), so the engine stops; dropping the merged stream (the client went away, or a unary
//! response failed) drops every request, which cancels them.

use futures::StreamExt;
use futures::stream::{self, BoxStream};
use loragate_core::{CoreError, SampleStream};

use super::choice::{ChoiceDelta, Choices};

/// One started core request and its choices.
pub(crate) struct Part {
    choices: Choices,
    /// Boxed: the stream is large and a part moves on every event.
    samples: Box<SampleStream>,
}

impl Part {
    /// `samples`, rendered into `choices`.
    pub(crate) fn new(choices: Choices, samples: SampleStream) -> Self {
        Self { choices, samples: Box::new(samples) }
    }
}

/// Every delta of `parts`, as they come. A failing request yields its error and nothing more.
pub(crate) fn deltas(parts: Vec<Part>) -> BoxStream<'static, Result<ChoiceDelta, CoreError>> {
    let streams = parts.into_iter().map(|part| stream::unfold(Some(part), next_delta).boxed());
    stream::select_all(streams).boxed()
}

async fn next_delta(state: Option<Part>) -> Option<(Result<ChoiceDelta, CoreError>, Option<Part>)> {
    let mut part = state?;
    while !part.choices.all_finished() {
        match part.samples.next().await? {
            Ok(event) => {
                let (choices, delta) = part.choices.on_event_off_runtime(event).await;
                part.choices = choices;
                if let Some(delta) = delta {
                    return Some((Ok(delta), Some(part)));
                }
            }
            Err(err) => return Some((Err(err), None)),
        }
    }
    None
}
