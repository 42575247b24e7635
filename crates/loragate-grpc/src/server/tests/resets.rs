//! Clients cancel freely: requests their client resets before the server took them up (RL samplers' timeouts, a
//! client walking away from many requests at once) cost only themselves, never the connection other calls share.

use bytes::Bytes;
use h2::Reason;
use tokio::net::TcpStream;

use super::*;

/// More resets in one flight than HTTP/2's default allowance for requests reset before they were taken up (20, after
/// which the connection was dropped with GOAWAY ENHANCE_YOUR_CALM), fewer than the streams a client may open (200).
const BURST: usize = 150;

fn call(address: std::net::SocketAddr, path: &str) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://{address}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_reset_as_they_are_sent_cost_only_themselves_not_the_connection() {
    let coordinator =
        coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), CoordinatorConfig::default(), &["meow"]).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let (_stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(serve_grpc(listener, coordinator, std::future::pending(), async move {
        let _ = stopped.await;
    }));
    let tcp = TcpStream::connect(address).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("an HTTP/2 connection");
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.expect("the connection is ready");

    // Each call's head and at once its reset, queued without a pause: they reach the server together, which reads
    // them before it takes any of them up.
    for _ in 0..BURST {
        let (_response, mut body) =
            client.send_request(call(address, "/loragate.v1.Sampler/Sample"), false).expect("sent");
        body.send_reset(Reason::CANCEL);
    }

    // The same connection still serves: a `ListLoraAdapters` (an empty message) is answered OK.
    let mut client = client.ready().await.expect("the connection is still open");
    let (response, mut body) =
        client.send_request(call(address, "/loragate.v1.LoraControl/ListLoraAdapters"), false).expect("sent");
    body.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true).expect("the message");
    let response = tokio::time::timeout(Duration::from_secs(60), response)
        .await
        .expect("answered in time")
        .expect("answered on the same connection: it was not dropped");
    assert_eq!(response.status(), 200);
    let mut answer = response.into_body();
    while let Some(chunk) = answer.data().await {
        let chunk = chunk.expect("the answer's bytes");
        answer.flow_control().release_capacity(chunk.len()).expect("capacity");
    }
    let trailers = answer.trailers().await.expect("the trailers").expect("a grpc-status");
    assert_eq!(trailers.get("grpc-status").map(|status| status.as_bytes()), Some(&b"0"[..]), "{trailers:?}");
    assert!(!connection.is_finished(), "the connection is still open");
}
