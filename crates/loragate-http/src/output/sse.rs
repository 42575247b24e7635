//! Streamed responses: server-sent events `data: {chunk}` as the deltas come, each API family rendering its own
//! chunks ([`ChunkRenderer`]), then `data: [DONE]`. A failure midway is sent as one `data: {"error": …}` event before
//! `[DONE]` (the status line is long gone). Dropping the response body (the client went away) drops the core's
//! streams, which cancels the requests.

use std::convert::Infallible;

use axum::Json;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, BoxStream};
use futures::{StreamExt, TryStreamExt};
use http::HeaderValue;
use loragate_core::CoreError;
use serde::Serialize;

use super::choice::ChoiceDelta;
use super::drive::{Part, deltas};
use crate::error::{Api, HttpError};

/// The caller's request id header: the id aborts report, echoed in the response.
pub(crate) const REQUEST_ID_HEADER: &str = "x-request-id";

/// How one API family renders a response, streamed or whole.
pub(crate) trait ChunkRenderer: Send + 'static {
    /// The whole response of a request that does not stream.
    type Unary: Serialize;

    /// Renders every delta of a request that does not stream as one response.
    fn unary(self, deltas: Vec<ChoiceDelta>) -> Self::Unary;

    /// The API whose names errors use.
    fn api(&self) -> Api;

    /// The JSON chunks one delta becomes (often one, sometimes none).
    fn chunks(&mut self, delta: ChoiceDelta) -> Vec<String>;

    /// The JSON chunks after the last delta (a usage chunk, for example).
    fn finish(&mut self) -> Vec<String>;
}

/// Where a streamed response is.
enum Progress<R> {
    Running { deltas: BoxStream<'static, Result<ChoiceDelta, CoreError>>, renderer: R },
    Done,
}

/// Answers a sampling request: server-sent events when it streams, else `renderer`'s one JSON response once every
/// delta came; with `request_id`, if given, in `X-Request-Id`. The one place every API family answers from.
pub(crate) async fn respond<R: ChunkRenderer>(
    parts: Vec<Part>,
    renderer: R,
    stream: bool,
    request_id: Option<&str>,
) -> Result<Response, HttpError> {
    let mut response = if stream {
        sse_response(parts, renderer)
    } else {
        let api = renderer.api();
        let all = deltas(parts).try_collect().await.map_err(|err| HttpError::in_api(err, api))?;
        Json(renderer.unary(all)).into_response()
    };
    if let Some(value) = request_id.and_then(|id| HeaderValue::from_str(id).ok()) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    Ok(response)
}

/// The SSE response streaming `parts` through `renderer`.
fn sse_response<R: ChunkRenderer>(parts: Vec<Part>, renderer: R) -> Response {
    let start = Progress::Running { deltas: deltas(parts), renderer };
    let events = stream::unfold(start, next_events).flat_map(stream::iter);
    Sse::new(events.map(Ok::<Event, Infallible>)).into_response()
}

/// The next events to send, and what follows them.
async fn next_events<R: ChunkRenderer>(progress: Progress<R>) -> Option<(Vec<Event>, Progress<R>)> {
    let Progress::Running { mut deltas, mut renderer } = progress else {
        return None;
    };
    loop {
        match deltas.next().await {
            Some(Ok(delta)) => {
                let chunks = renderer.chunks(delta);
                if chunks.is_empty() {
                    continue;
                }
                return Some((chunks.into_iter().map(data_event).collect(), Progress::Running { deltas, renderer }));
            }
            Some(Err(err)) => {
                let err = HttpError::in_api(err, renderer.api());
                tracing::warn!(error = %err, "streamed response failed");
                return Some((vec![data_event(to_json(&err.body())), done_event()], Progress::Done));
            }
            None => {
                let mut events: Vec<Event> = renderer.finish().into_iter().map(data_event).collect();
                events.push(done_event());
                return Some((events, Progress::Done));
            }
        }
    }
}

/// `payload` as JSON text (a chunk).
pub(crate) fn to_json(payload: &impl Serialize) -> String {
    serde_json::to_string(payload).unwrap_or_else(|err| {
        tracing::error!(%err, "a response chunk could not be serialized");
        r#"{"error":{"message":"internal error","type":"server_error","code":"internal","param":null}}"#.to_owned()
    })
}

/// `payload` as a JSON value, its `f32`s written as their shortest decimal (not widened to `f64` digits).
pub(crate) fn to_value(payload: &impl Serialize) -> serde_json::Value {
    serde_json::from_str(&to_json(payload)).unwrap_or(serde_json::Value::Null)
}

fn data_event(json: String) -> Event {
    Event::default().data(json)
}

fn done_event() -> Event {
    Event::default().data("[DONE]")
}
