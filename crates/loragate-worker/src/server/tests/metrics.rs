//! `GET /metrics` on the worker's HTTP listener: the coordinator's metrics, as `loragate serve` serves them.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// `GET path` over a connection of its own (HTTP/1.1, closed after the answer): the status code and the body.
async fn get(address: SocketAddr, path: &str) -> (u16, String) {
    let mut connection = tokio::net::TcpStream::connect(address).await.expect("connect");
    let head = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    connection.write_all(head.as_bytes()).await.expect("request");
    let mut answer = String::new();
    connection.read_to_string(&mut answer).await.expect("answer");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).expect("a status line");
    assert!(
        status != 200 || head.to_ascii_lowercase().contains("content-type: application/openmetrics-text"),
        "OpenMetrics text: {head}"
    );
    (status, body.to_owned())
}

async fn scrape(worker: &TestWorker) -> String {
    let (status, body) = get(worker.http_address, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn metrics_are_the_coordinators_with_vllms_names_refreshed_on_every_scrape() {
    // Requests emit one token, then hold until aborted if their budget allows more.
    let worker = TestWorker::start(1).await;
    let fresh = scrape(&worker).await;
    for line in [
        "vllm:num_requests_running{model_name=\"scripted\",adapter=\"\"} 0",
        "vllm:generation_tokens_total{model_name=\"scripted\",adapter=\"\"} 0",
        "loragate_paused{adapter=\"\"} 0",
    ] {
        assert!(fresh.contains(line), "missing {line:?} before any request in\n{fresh}");
    }
    assert!(fresh.trim_end().ends_with("# EOF"), "OpenMetrics text ends with # EOF");

    worker.load("meow@1", "meow").await.expect("load");
    let finished = read_to_end(worker.stream(request("short", "meow@1", 1)).await.expect("stream")).await;
    assert_eq!(finished.reason(), FinishReason::Length);
    let mut held = worker.stream(request("held", "meow@1", 50)).await.expect("stream");
    let mut received = Received::default();
    read_until_tokens(&mut held, &mut received, 1).await;
    let running = "vllm:num_requests_running{model_name=\"scripted\",adapter=\"meow@1\"} 1";
    eventually("the held request counts as running", || async { scrape(&worker).await.contains(running) }).await;
    let text = scrape(&worker).await;
    for line in [
        "loragate_in_flight{adapter=\"meow@1\"} 1",
        "loragate_version{adapter=\"meow@1\"} 1",
        "vllm:prompt_tokens_total{model_name=\"scripted\",adapter=\"meow@1\"} 4",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }

    let abort = pb::AbortRequest { request_ids: vec!["held".into()] };
    worker.control().abort(abort).await.expect("abort");
    while let Some(message) = held.message().await.expect("no error") {
        accept(&mut received, message);
    }
    assert_eq!((received.reason(), received.num_tokens), (FinishReason::Aborted, 1));
    let idle = "loragate_in_flight{adapter=\"meow@1\"} 0";
    eventually("the aborted request left", || async { scrape(&worker).await.contains(idle) }).await;
    let text = scrape(&worker).await;
    for line in [
        "vllm:generation_tokens_total{model_name=\"scripted\",adapter=\"meow@1\"} 2",
        "vllm:num_requests_running{model_name=\"scripted\",adapter=\"meow@1\"} 0",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }

    assert_eq!(get(worker.http_address, "/v1/models").await.0, 404, "only /metrics is served there");
}

#[tokio::test]
async fn the_metrics_listener_closes_with_the_worker() {
    let worker = TestWorker::start(1).await;
    let _ = scrape(&worker).await;
    worker.shutdown.cancel();
    let served = tokio::time::timeout(std::time::Duration::from_secs(10), worker.served).await;
    // `serve_worker` returns only once both servers returned.
    assert!(matches!(served, Ok(Ok(Ok(())))), "both servers stop cleanly: {served:?}");
}
