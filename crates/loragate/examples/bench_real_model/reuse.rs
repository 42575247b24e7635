//! The KV-reuse scenes of issue 33 on the real model (token-id prompts, greedy unless said, end of sequence
//! ignored):
//! - **multi-turn** (loragate and llama.cpp, the latter with its slot prompt cache on; with `--vllm`, also a loragate
//!   and a real vLLM with its prefix cache on the same float32 directory, see `vllm`): 4 conversations at once, 8
//!   turns each, every turn resending the whole conversation plus 120 new tokens and asking 32; the total time of
//!   each (goal: loragate's ≤ each peer's);
//! - **grpo** (loragate): 16 separate concurrent requests with one 1,200-token prompt (temperature 1, seeds 0–15),
//!   against one `n=16` request on another 1,200-token prompt (goal: ≤ 1.25×), and the prefix cache's hits;
//! - **continuation** (loragate): 32 requests decode, an ABORT-mode pause with no weight change and a resume, and
//!   each aborted request is resubmitted as `prompt + its tokens` with the rest of its budget, as the retry client
//!   does: each continuation's prefilled tokens, `prompt_tokens − cached_tokens` (goal: ≤ one block, 16, each);
//! - **kv-memory** (loragate): the KV cache's blocks in use while 32 sequences of 1,000 positions decode, in bytes,
//!   beside what the padded batch buffers they replaced held for the same sequences.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Server;
use super::scenes::Target;
use super::streams::{Progress, prompt_ids, secs};

pub(crate) const CONVERSATIONS: usize = 4;
const TURNS: usize = 8;
const TURN_TOKENS: usize = 120;
const REPLY_TOKENS: u32 = 32;
const GROUP: usize = 16;
const GROUP_PROMPT_TOKENS: usize = 1200;
const GROUP_MAX_TOKENS: u32 = 32;
const CONTINUED: usize = 32;
const CONTINUED_PROMPT_TOKENS: usize = 100;
const CONTINUED_MAX_TOKENS: u32 = 160;
/// Tokens each request decodes before the pause.
const BEFORE_PAUSE: usize = 8;
const HELD: usize = 32;
const HELD_POSITIONS: usize = 1000;
/// SmolLM2-135M's bytes per cached position at f32: 2 · 30 layers · 3 key/value heads · 64 · 4.
const SMOLLM2_POSITION_BYTES: u64 = 46_080;

/// The context each llama.cpp slot needs for a whole conversation.
pub(crate) const CONVERSATION_CONTEXT: usize = TURNS * (TURN_TOKENS + REPLY_TOKENS as usize) + 256;

/// One turn on `server`: `history` (token ids) completed greedily by [`REPLY_TOKENS`] tokens, whose ids it returns.
/// loragate through `/v1/completions` (its choices carry `token_ids`), vLLM the same with the server's extra fields
/// (`return_token_ids`); llama.cpp through its own `/completion`, with its slot prompt cache on and the generated ids
/// returned (`return_tokens`).
async fn turn(client: &reqwest::Client, server: &Server, history: &[u32]) -> Vec<u32> {
    let (path, body) = if server.name == "llama.cpp" {
        let body = json!({"prompt": history, "n_predict": REPLY_TOKENS, "temperature": 0.0, "ignore_eos": true,
                          "cache_prompt": true, "return_tokens": true});
        ("/completion", body)
    } else {
        let mut body = json!({"model": server.model, "prompt": history, "max_tokens": REPLY_TOKENS,
                              "temperature": 0.0, "ignore_eos": true});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), server.extra.as_object()) {
            body.extend(extra.clone());
        }
        ("/v1/completions", body)
    };
    let response = client.post(format!("{}{path}", server.base_url)).json(&body).send().await.expect("request sent");
    let status = response.status();
    let answer: Value = response.json().await.expect("a JSON answer");
    assert!(status.is_success(), "{}: {status} {answer}", server.name);
    let ids = answer["choices"][0].get("token_ids").or_else(|| answer.get("tokens")).and_then(Value::as_array);
    let ids = ids.unwrap_or_else(|| panic!("{}: token ids in {answer}", server.name));
    ids.iter().map(|id| id.as_u64().expect("a token id") as u32).collect()
}

/// The generated token ids of a `/v1/completions` answer's first choice.
fn reply_ids(answer: &Value) -> Vec<u32> {
    let ids = answer["choices"][0]["token_ids"].as_array().unwrap_or_else(|| panic!("token ids in {answer}"));
    ids.iter().map(|id| id.as_u64().expect("a token id") as u32).collect()
}

/// The multi-turn scene's times on one server.
pub(crate) struct MultiTurn {
    /// The 4 conversations' total.
    total: Duration,
    /// Per turn index, each conversation's time for that turn (request sent to reply read).
    turns: Vec<Vec<Duration>>,
}

/// The multi-turn scene on `server`: the total time of the 4 conversations, and each turn's.
pub(crate) async fn multi_turn(client: &reqwest::Client, server: &Server) -> MultiTurn {
    let started = Instant::now();
    let conversations = (0..CONVERSATIONS).map(|conversation| async move {
        let mut history: Vec<u32> = Vec::new();
        let mut times = Vec::with_capacity(TURNS);
        for turn_index in 0..TURNS {
            history.extend(prompt_ids(TURN_TOKENS, conversation * 100 + turn_index));
            let turn_started = Instant::now();
            let reply = turn(client, server, &history).await;
            times.push(turn_started.elapsed());
            assert_eq!(reply.len(), REPLY_TOKENS as usize, "{}: the whole reply", server.name);
            history.extend(reply);
        }
        times
    });
    let times = futures::future::join_all(conversations).await;
    let turns = (0..TURNS).map(|turn| times.iter().map(|times| times[turn]).collect()).collect();
    MultiTurn { total: started.elapsed(), turns }
}

/// Prints the multi-turn figures of loragate and its peer (`peer` names it and its cache, `model` the weights both
/// served): the totals, then each turn's median over the conversations.
pub(crate) fn print_multi_turn(loragate: &MultiTurn, theirs: &MultiTurn, peer: &str, model: &str) {
    println!(
        "\nmulti-turn on {model}: {CONVERSATIONS} conversations × {TURNS} turns (+{TURN_TOKENS} tokens, \
         {REPLY_TOKENS} asked each): loragate {}, {peer} {}: {:.2}× (goal ≤ 1.00×)",
        secs(loragate.total),
        secs(theirs.total),
        loragate.total.as_secs_f64() / theirs.total.as_secs_f64()
    );
    let median = |times: &[Duration]| {
        let mut times = times.to_vec();
        times.sort_unstable();
        times[times.len() / 2]
    };
    let peer_name = peer.split(" (").next().unwrap_or(peer);
    println!("| turn | prompt tokens | loragate (median of {CONVERSATIONS}) | {peer_name} |");
    println!("| --- | --- | --- | --- |");
    for (turn, (ours, theirs)) in loragate.turns.iter().zip(&theirs.turns).enumerate() {
        let prompt = (turn + 1) * TURN_TOKENS + turn * REPLY_TOKENS as usize;
        println!("| {} | {prompt} | {} | {} |", turn + 1, secs(median(ours)), secs(median(theirs)));
    }
}

/// The loragate server's `/metrics` value of `series`, summed over its labels (one series per adapter), or 0.
async fn metric(target: &Target<'_>, series: &str) -> f64 {
    let text = target.client.get(format!("{}/metrics", target.base_url)).send().await.expect("metrics");
    let text = text.text().await.expect("metrics text");
    text.lines()
        .filter(|line| line.strip_prefix(series).is_some_and(|rest| rest.starts_with(['{', ' '])))
        .filter_map(|line| line.rsplit(' ').next().and_then(|value| value.parse::<f64>().ok()))
        .sum()
}

/// The GRPO-group scene; prints its figures.
pub(crate) async fn grpo(target: &Target<'_>) {
    let server = |body: Value| async move {
        let url = format!("{}/v1/completions", target.base_url);
        let response = target.client.post(url).json(&body).send().await.expect("request sent");
        assert!(response.status().is_success(), "grpo: {}", response.status());
        response.json::<Value>().await.expect("a JSON answer")
    };
    let body = |prompt: &[u32], seed: usize, n: usize| {
        json!({"model": target.model, "prompt": prompt, "max_tokens": GROUP_MAX_TOKENS, "temperature": 1.0,
               "seed": seed, "n": n, "ignore_eos": true})
    };
    let (separate_prompt, grouped_prompt) =
        (prompt_ids(GROUP_PROMPT_TOKENS, 7001), prompt_ids(GROUP_PROMPT_TOKENS, 7002));
    let hits_before = metric(target, "vllm:prefix_cache_hits_total").await;
    let started = Instant::now();
    futures::future::join_all((0..GROUP).map(|seed| server(body(&separate_prompt, seed, 1)))).await;
    let separate = started.elapsed();
    let hits = metric(target, "vllm:prefix_cache_hits_total").await - hits_before;
    let started = Instant::now();
    server(body(&grouped_prompt, 0, GROUP)).await;
    let grouped = started.elapsed();
    println!(
        "\ngrpo: {GROUP} separate requests of one {GROUP_PROMPT_TOKENS}-token prompt {} against one n={GROUP} \
         request {}: {:.2}× (goal ≤ 1.25×); prefix-cache hits {hits} tokens (of {} the 15 repeats could reuse)",
        secs(separate),
        secs(grouped),
        separate.as_secs_f64() / grouped.as_secs_f64(),
        (GROUP - 1) * ((GROUP_PROMPT_TOKENS - 1) / 16 * 16)
    );
}

/// The continuation scene; prints its figures.
pub(crate) async fn continuation(target: &Target<'_>) {
    let url = format!("{}/v1/completions", target.base_url);
    let runs: Vec<_> = (0..CONTINUED)
        .map(|index| {
            let prompt = prompt_ids(CONTINUED_PROMPT_TOKENS, 8000 + index);
            let body = json!({"model": target.model, "prompt": prompt, "max_tokens": CONTINUED_MAX_TOKENS,
                              "temperature": 0.0, "ignore_eos": true});
            let (client, url) = (target.client.clone(), url.clone());
            tokio::spawn(async move {
                let answer: Value =
                    client.post(url).json(&body).send().await.expect("sent").json().await.expect("json");
                (prompt, answer)
            })
        })
        .collect();
    // Wait until every request decodes (the server's running gauge), then pause in abort mode and resume.
    let deadline = Instant::now() + Duration::from_secs(600);
    while metric(target, "vllm:num_requests_running").await < CONTINUED as f64 {
        assert!(Instant::now() < deadline, "the requests never all ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200 * BEFORE_PAUSE as u64)).await;
    let pause = target.client.post(format!("{}/pause?mode=abort", target.base_url)).send().await.expect("pause");
    assert!(pause.status().is_success(), "pause: {}", pause.status());
    let resume = target.client.post(format!("{}/resume", target.base_url)).send().await.expect("resume");
    assert!(resume.status().is_success(), "resume: {}", resume.status());
    let mut prefilled = Vec::new();
    for run in runs {
        let (prompt, answer) = run.await.expect("a request");
        let tokens = reply_ids(&answer);
        if answer["choices"][0]["finish_reason"] != "abort" || tokens.len() >= CONTINUED_MAX_TOKENS as usize {
            continue;
        }
        let history: Vec<u32> = prompt.iter().chain(&tokens).copied().collect();
        let rest = CONTINUED_MAX_TOKENS as usize - tokens.len();
        let body = json!({"model": target.model, "prompt": history, "max_tokens": rest, "temperature": 0.0,
                          "ignore_eos": true});
        let answer: Value =
            target.client.post(&url).json(&body).send().await.expect("sent").json().await.expect("json");
        let usage = &answer["usage"];
        let prompt_tokens = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
        prefilled.push(prompt_tokens - usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0));
    }
    prefilled.sort_unstable();
    println!(
        "\ncontinuation: {} of {CONTINUED} requests aborted by an ABORT-mode pause and continued; prefilled tokens \
         per continuation: min {}, median {}, max {} (goal ≤ 16, one block)",
        prefilled.len(),
        prefilled.first().copied().unwrap_or(0),
        prefilled.get(prefilled.len() / 2).copied().unwrap_or(0),
        prefilled.last().copied().unwrap_or(0)
    );
}

/// The KV-memory scene; prints its figures.
pub(crate) async fn kv_memory(target: &Target<'_>) {
    let url = format!("{}/v1/completions", target.base_url);
    let mut streams = Vec::new();
    for index in 0..HELD {
        let progress = Progress::new();
        let prompt = prompt_ids(HELD_POSITIONS - 8, 9000 + index);
        let body = json!({"model": target.model, "prompt": prompt, "max_tokens": 4000, "temperature": 0.0,
                          "ignore_eos": true, "stream": true});
        let (client, url, watched) = (target.client.clone(), url.clone(), progress.clone());
        let task = tokio::spawn(async move { super::streams::stream_completion(&client, &url, body, watched).await });
        streams.push((progress, task));
    }
    for (progress, _) in &streams {
        progress.reached(8).await;
    }
    let usage = metric(target, "vllm:kv_cache_usage_perc").await;
    let text = target.client.get(format!("{}/metrics", target.base_url)).send().await.expect("metrics");
    let text = text.text().await.expect("text");
    let blocks: f64 = text
        .lines()
        .find(|line| line.starts_with("vllm:cache_config_info"))
        .and_then(|line| line.split("num_gpu_blocks=\"").nth(1))
        .and_then(|rest| rest.split('"').next())
        .and_then(|blocks| blocks.parse().ok())
        .expect("num_gpu_blocks");
    let used_bytes = usage * blocks * 16.0 * SMOLLM2_POSITION_BYTES as f64;
    // Each sequence's positions when the blocks were read: its prompt and the tokens it has received (the first
    // streams decode on while the last ones reach their eighth token, so most hold more than 1,000).
    let positions: Vec<usize> = streams.iter().map(|(progress, _)| HELD_POSITIONS - 8 + progress.count()).collect();
    let exact = positions.iter().sum::<usize>() as f64 * SMOLLM2_POSITION_BYTES as f64;
    // The padded batch's buffers held `rows × columns` positions: columns grown to a multiple of 64 past the longest
    // row (plus one for the next step).
    let longest = positions.iter().copied().max().unwrap_or(0);
    let padded_bytes = (HELD * (longest + 1).next_multiple_of(64)) as f64 * SMOLLM2_POSITION_BYTES as f64;
    println!(
        "\nkv-memory: {HELD} sequences of {}–{} positions ({} in all) once each had 8 tokens: the paged cache's blocks \
         in use {:.1} MiB (exact positions {:.1} MiB); the padded batch buffers for the same rows {:.1} MiB",
        positions.iter().copied().min().unwrap_or(0),
        longest,
        positions.iter().sum::<usize>(),
        used_bytes / (1 << 20) as f64,
        exact / (1 << 20) as f64,
        padded_bytes / (1 << 20) as f64
    );
    for (_, task) in streams {
        task.abort();
    }
}
