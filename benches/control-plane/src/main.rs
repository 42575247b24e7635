//! `wake-long-polls`: how long a loragate server takes to answer many HTTP long-polls once their adapter resumes.
//!
//! Against a running server (`--http HOST:PORT`), each round pauses the adapter
//! (`POST /skyrl/v1/abort_lora_requests`), opens one connection per long-poll and sends
//! `POST /skyrl/v1/wait_lora_unpaused` on each, waits until `/metrics` shows every one waiting
//! (`loragate_waiting{adapter=...}`), then resumes the adapter and measures the time from sending the resume until
//! the last long-poll's answer (`{"paused":false}`) has arrived. It prints one line per round and the median.
//!
//! ```text
//! wake-long-polls --http 127.0.0.1:8000 [--polls 1000] [--rounds 5] [--adapter meow] [--key KEY] [--admin-key KEY]
//! ```
//!
//! The client is one thread of plain HTTP/1.1 over tokio sockets (no HTTP library), so that as little as possible
//! of the figure is the client's own work. `scripts/bench-control-plane.sh` runs it against old and new binaries.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the command line asks for.
struct Options {
    http: SocketAddr,
    polls: usize,
    rounds: usize,
    adapter: String,
    key: Option<String>,
    admin_key: Option<String>,
}

type Failure = Box<dyn std::error::Error>;

fn parse_options() -> Result<Options, Failure> {
    let mut options = Options {
        http: "127.0.0.1:8000".parse()?,
        polls: 1000,
        rounds: 5,
        adapter: "meow".into(),
        key: None,
        admin_key: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--http" => options.http = value()?.parse()?,
            "--polls" => options.polls = value()?.parse()?,
            "--rounds" => options.rounds = value()?.parse()?,
            "--adapter" => options.adapter = value()?,
            "--key" => options.key = Some(value()?),
            "--admin-key" => options.admin_key = Some(value()?),
            other => return Err(format!("unknown argument {other:?} (see the source's documentation)").into()),
        }
    }
    Ok(options)
}

/// A `POST` of JSON `body` to `path`, with a bearer `key` if given.
fn post(path: &str, body: &str, key: Option<&str>) -> Vec<u8> {
    let authorization = key.map(|key| format!("Authorization: Bearer {key}\r\n")).unwrap_or_default();
    format!(
        "POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n{authorization}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Reads one HTTP/1.1 response with a `Content-Length` body; returns its status and body.
async fn read_response(stream: &mut TcpStream) -> Result<(u16, String), Failure> {
    let mut buffer = Vec::with_capacity(512);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(head_end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buffer[..head_end])?;
            let status: u16 = head.split(' ').nth(1).ok_or("no status")?.parse()?;
            let length: usize = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse().ok())?
                })
                .ok_or("no Content-Length")?;
            let body_start = head_end + 4;
            if buffer.len() >= body_start + length {
                return Ok((status, String::from_utf8_lossy(&buffer[body_start..body_start + length]).into_owned()));
            }
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err("the server closed the connection".into());
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}

/// One request on a fresh connection; fails unless the answer is 200.
async fn call(http: SocketAddr, request: &[u8]) -> Result<String, Failure> {
    let mut stream = TcpStream::connect(http).await?;
    stream.write_all(request).await?;
    let (status, body) = read_response(&mut stream).await?;
    if status != 200 {
        return Err(format!("status {status}: {body}").into());
    }
    Ok(body)
}

/// How many long-polls `/metrics` shows waiting on `adapter`.
async fn waiting(http: SocketAddr, adapter: &str) -> Result<usize, Failure> {
    let mut stream = TcpStream::connect(http).await?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n").await?;
    let (_, text) = read_response(&mut stream).await?;
    let series = format!("loragate_waiting{{adapter=\"{adapter}\"}} ");
    let count = text.lines().find_map(|line| line.strip_prefix(series.as_str())).unwrap_or("0");
    Ok(count.trim().parse()?)
}

/// One round: the time from sending the resume until the last long-poll's answer arrived.
async fn round(options: &Options) -> Result<Duration, Failure> {
    let admin = options.admin_key.as_deref();
    let adapter = &options.adapter;
    call(options.http, &post("/skyrl/v1/abort_lora_requests", &format!(r#"{{"lora_name":"{adapter}"}}"#), admin))
        .await?;
    let wait = post(
        "/skyrl/v1/wait_lora_unpaused",
        &format!(r#"{{"lora_name":"{adapter}","timeout_s":60}}"#),
        options.key.as_deref(),
    );
    let mut polls = Vec::with_capacity(options.polls);
    for _ in 0..options.polls {
        let mut stream = TcpStream::connect(options.http).await?;
        stream.write_all(&wait).await?;
        polls.push(stream);
    }
    let settle_by = Instant::now() + Duration::from_secs(30);
    while waiting(options.http, adapter).await? < options.polls {
        if Instant::now() > settle_by {
            return Err("the long-polls did not all reach the server within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every answer is read by its own task, which notes when it arrived.
    let answers: Vec<_> = polls
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                let answer = read_response(&mut stream).await.map_err(|err| err.to_string());
                (answer, Instant::now())
            })
        })
        .collect();
    let resume = post("/skyrl/v1/resume_lora_requests", &format!(r#"{{"lora_name":"{adapter}"}}"#), admin);
    let mut control = TcpStream::connect(options.http).await?;
    let resumed_at = Instant::now();
    control.write_all(&resume).await?;
    let mut last = resumed_at;
    for answer in answers {
        let (answer, arrived) = answer.await?;
        let (status, body) = answer?;
        if status != 200 || !body.contains(r#""paused":false"#) {
            return Err(format!("a long-poll answered {status}: {body}").into());
        }
        last = last.max(arrived);
    }
    let (status, body) = read_response(&mut control).await?;
    if status != 200 {
        return Err(format!("resume answered {status}: {body}").into());
    }
    Ok(last - resumed_at)
}

fn main() -> Result<(), Failure> {
    let options = parse_options()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let mut times = Vec::with_capacity(options.rounds);
        for index in 0..options.rounds {
            let time = round(&options).await?;
            println!("round {}: {} long-polls answered {:.1} ms after the resume", index + 1, options.polls, ms(time));
            times.push(time);
        }
        times.sort();
        if let Some(median) = times.get(times.len() / 2) {
            println!("median: {:.1} ms ({} rounds of {} long-polls)", ms(*median), times.len(), options.polls);
        }
        Ok(())
    })
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}
