//! Server-sent events as vLLM's and SGLang's HTTP servers stream them: `data: {json}` events separated by blank
//! lines, ending with `data: [DONE]`. The body is read to its end before `[DONE]` is reported, so that a caller that
//! stops at `[DONE]` leaves the connection whole: it goes back to the client's pool instead of being closed.

use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use tokio::time::Instant;

use super::WorkerError;

/// How long the body may take to end after `[DONE]`.
const BODY_END_BOUND: Duration = Duration::from_secs(1);
/// The longest event (one line, or the `data:` lines of one event together) a stream may send: a chunk carries a
/// few tokens with their candidates, so anything near this is a worker gone wrong, and nothing longer is buffered.
pub(crate) const MAX_EVENT_BYTES: usize = 4 << 20;

/// One event of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SseEvent {
    /// An event's data (its `data:` lines joined).
    Data(String),
    /// `data: [DONE]`: the server ended the stream on purpose.
    Done,
}

/// Splits a response body into events. A body that ends without `[DONE]` just ends (the caller knows whether the
/// sequence finished); a transport error mid-body is `Unavailable`. `[DONE]` comes once the body ended (what follows
/// it is read and ignored; at most [`BODY_END_BOUND`] is waited for its end), so the connection is free for the next
/// request when the caller sees it.
pub(crate) fn events(response: reqwest::Response) -> BoxStream<'static, Result<SseEvent, WorkerError>> {
    let body = response.bytes_stream().map(|chunk| {
        chunk.map(|bytes| bytes.to_vec()).map_err(|err| WorkerError::Unavailable(format!("the stream broke: {err}")))
    });
    parse(body).boxed()
}

/// The events of a stream of body chunks.
fn parse(
    body: impl futures::Stream<Item = Result<Vec<u8>, WorkerError>> + Send + 'static,
) -> impl futures::Stream<Item = Result<SseEvent, WorkerError>> + Send + 'static {
    let state = Parser {
        body: Box::pin(body),
        buffer: Vec::new(),
        data: None,
        ready: Default::default(),
        ended: false,
        done_deadline: None,
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if state.ready.front().is_some_and(|event| matches!(event, Ok(SseEvent::Done))) && !state.ended {
                // Nothing after `[DONE]` is an event: read on to the body's end, bounded (a server that keeps the
                // body open after `[DONE]` costs its connection, not the caller's wait).
                let deadline = *state.done_deadline.get_or_insert_with(|| Instant::now() + BODY_END_BOUND);
                match tokio::time::timeout_at(deadline, state.body.next()).await {
                    Ok(Some(Ok(_))) => {}
                    Ok(Some(Err(_)) | None) | Err(_) => state.ended = true,
                }
                continue;
            }
            if let Some(event) = state.ready.pop_front() {
                return Some((event, state));
            }
            if state.ended {
                return None;
            }
            match state.body.next().await {
                Some(Ok(chunk)) => state.absorb(&chunk),
                Some(Err(err)) => {
                    state.ended = true;
                    state.ready.push_back(Err(err));
                }
                None => {
                    state.ended = true;
                    let rest = std::mem::take(&mut state.buffer);
                    state.line(&rest);
                    state.dispatch();
                }
            }
        }
    })
}

struct Parser {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = Result<Vec<u8>, WorkerError>> + Send>>,
    buffer: Vec<u8>,
    data: Option<String>,
    ready: std::collections::VecDeque<Result<SseEvent, WorkerError>>,
    ended: bool,
    /// When reading on after `[DONE]` stops.
    done_deadline: Option<Instant>,
}

impl Parser {
    fn absorb(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
        while let Some(end) = self.buffer.iter().position(|&byte| byte == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            self.line(&line[..end]);
        }
        let pending = self.buffer.len() + self.data.as_ref().map_or(0, String::len);
        if pending > MAX_EVENT_BYTES {
            // Nothing more is read or kept: the stream ends with this error.
            self.buffer = Vec::new();
            self.data = None;
            self.ended = true;
            let what = format!("an event over {} MiB without its end", MAX_EVENT_BYTES >> 20);
            self.ready.push_back(Err(WorkerError::Malformed(what)));
        }
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch();
            return;
        }
        let Some(value) = line.strip_prefix(b"data:") else { return };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        let value = String::from_utf8_lossy(value);
        match &mut self.data {
            Some(data) => {
                data.push('\n');
                data.push_str(&value);
            }
            None => self.data = Some(value.into_owned()),
        }
    }

    fn dispatch(&mut self) {
        if let Some(data) = self.data.take() {
            let event = if data.trim() == "[DONE]" { SseEvent::Done } else { SseEvent::Data(data) };
            self.ready.push_back(Ok(event));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parsed(chunks: Vec<Result<&'static str, WorkerError>>) -> Vec<Result<SseEvent, WorkerError>> {
        let body = futures::stream::iter(chunks.into_iter().map(|chunk| chunk.map(|text| text.as_bytes().to_vec())));
        parse(body).collect().await
    }

    #[tokio::test]
    async fn events_split_across_chunks_and_lines_come_out_whole() {
        let events =
            parsed(vec![Ok("data: {\"a\""), Ok(": 1}\r\n\r\nda"), Ok("ta: 2\n"), Ok("\n: note\ndata: [DONE]\n\n")])
                .await;
        let expected = [SseEvent::Data("{\"a\": 1}".into()), SseEvent::Data("2".into()), SseEvent::Done];
        assert_eq!(events.into_iter().map(Result::unwrap).collect::<Vec<_>>(), expected);
    }

    #[tokio::test]
    async fn done_comes_once_the_body_was_read_to_its_end() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        let chunks = ["data: 1\n\n", "data: [DONE]\n\n", "data: 2\n\n", "trailing bytes"];
        let pulled = Arc::new(AtomicUsize::new(0));
        let counter = pulled.clone();
        let body = futures::stream::iter(chunks).map(move |chunk| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(chunk.as_bytes().to_vec())
        });
        let mut events = Box::pin(parse(body));
        assert_eq!(events.next().await.expect("one").expect("ok"), SseEvent::Data("1".into()));
        assert_eq!(events.next().await.expect("done").expect("ok"), SseEvent::Done);
        assert_eq!(pulled.load(Ordering::SeqCst), chunks.len(), "the whole body was read before [DONE]");
        assert!(events.next().await.is_none(), "nothing after [DONE] is an event");
    }

    #[tokio::test]
    async fn a_body_left_open_after_done_is_waited_for_only_so_long() {
        let body =
            futures::stream::iter([Ok(b"data: 1\n\ndata: [DONE]\n\n".to_vec())]).chain(futures::stream::pending());
        let mut events = Box::pin(parse(body));
        assert_eq!(events.next().await.expect("one").expect("ok"), SseEvent::Data("1".into()));
        let started = Instant::now();
        assert_eq!(events.next().await.expect("done").expect("ok"), SseEvent::Done);
        assert!(started.elapsed() >= BODY_END_BOUND, "[DONE] once the bound passed, not before");
        assert!(events.next().await.is_none());
    }

    #[tokio::test]
    async fn an_event_over_the_cap_is_a_protocol_error_and_is_not_buffered() {
        let line = vec![b'x'; 1 << 20];
        let body = futures::stream::iter([Ok(b"data: 1\n\ndata: ".to_vec())])
            .chain(futures::stream::repeat(Ok(line)).take(5))
            .chain(futures::stream::pending());
        let events: Vec<_> = Box::pin(parse(body)).collect().await;
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0], Ok(SseEvent::Data("1".into())));
        assert!(matches!(&events[1], Err(WorkerError::Malformed(why)) if why.contains("4 MiB")), "{events:?}");

        let many_lines = futures::stream::repeat(Ok(b"data: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n".to_vec()))
            .take(MAX_EVENT_BYTES / 32 + 1)
            .chain(futures::stream::pending());
        let events: Vec<_> = Box::pin(parse(many_lines)).collect().await;
        assert!(matches!(events.as_slice(), [Err(WorkerError::Malformed(_))]), "one event's data lines together");
    }

    #[tokio::test]
    async fn a_body_ending_early_or_breaking_says_so() {
        let events = parsed(vec![Ok("data: 1\n\ndata: 2")]).await;
        let expected = [SseEvent::Data("1".into()), SseEvent::Data("2".into())];
        assert_eq!(events.into_iter().map(Result::unwrap).collect::<Vec<_>>(), expected, "no [DONE]: it just ends");
        let broken = parsed(vec![Ok("data: 1\n\n"), Err(WorkerError::Unavailable("reset".into()))]).await;
        assert_eq!(broken.len(), 2);
        assert!(matches!(broken[1], Err(WorkerError::Unavailable(_))));
    }
}
