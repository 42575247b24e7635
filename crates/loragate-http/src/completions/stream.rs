//! Streamed completions: server-sent events `data: {chunk}` as tokens arrive, one choice per chunk, the choice's
//! last chunk carrying its finish reason (`abort` when an abort handed it back) and segments, then `data: [DONE]`.
//! A failure midway is sent as one `data: {"error": …}` event before `[DONE]` (the status line is long gone).
//!
//! Dropping the response body (the client went away) drops the core's stream, which cancels the request. Once every
//! choice has ended (some perhaps at a stop string, while the engine was still generating) the core's stream is
//! dropped at once, so the engine stops.

use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use loragate_core::SampleStream;
use serde::Serialize;

use super::choice::Choices;
use super::response::CompletionHeader;
use crate::error::HttpError;

/// Where a streamed response is.
enum Progress {
    /// The request runs; more events may come (the stream is boxed: it is large and this moves per event).
    Running { samples: Box<SampleStream>, choices: Choices },
    /// `[DONE]` was sent.
    Done,
}

/// The SSE response for a started request.
pub(crate) fn sse_response(header: CompletionHeader, choices: Choices, samples: SampleStream) -> Response {
    let events = futures::stream::unfold(Progress::Running { samples: Box::new(samples), choices }, move |progress| {
        let header = header.clone();
        async move { next_events(&header, progress).await }
    })
    .flat_map(futures::stream::iter);
    Sse::new(events.map(Ok::<Event, Infallible>)).into_response()
}

/// The next events to send, and what follows them.
async fn next_events(header: &CompletionHeader, progress: Progress) -> Option<(Vec<Event>, Progress)> {
    let Progress::Running { mut samples, mut choices } = progress else {
        return None;
    };
    loop {
        match samples.next().await {
            Some(Ok(event)) => {
                let (returned, delta) = choices.on_event_off_runtime(event).await;
                choices = returned;
                let Some(delta) = delta else { continue };
                let chunk = data_event(&header.chunk(delta));
                if choices.all_finished() {
                    return Some((vec![chunk, done_event()], Progress::Done));
                }
                return Some((vec![chunk], Progress::Running { samples, choices }));
            }
            Some(Err(err)) => {
                let err = HttpError::sampling(err);
                tracing::warn!(error = %err, "streamed completion failed");
                return Some((vec![data_event(&err.body()), done_event()], Progress::Done));
            }
            None => return Some((vec![done_event()], Progress::Done)),
        }
    }
}

fn data_event(payload: &impl Serialize) -> Event {
    match serde_json::to_string(payload) {
        Ok(json) => Event::default().data(json),
        Err(err) => {
            tracing::error!(%err, "a completion chunk could not be serialized");
            Event::default().data(
                r#"{"error":{"message":"internal error","type":"server_error","code":"engine_internal","param":null}}"#,
            )
        }
    }
}

fn done_event() -> Event {
    Event::default().data("[DONE]")
}
