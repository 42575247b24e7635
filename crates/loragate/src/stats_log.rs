//! The periodic stats line (`--log-stats-interval`), in the shape of vLLM's "Avg prompt throughput: … tokens/s, Avg
//! generation throughput: … tokens/s, Running: N reqs, Waiting: N reqs", with what loragate adds: the requests held at
//! paused gates and kept by pauses, and the paused adapters with their pause counts. Its counts are those of the
//! `vllm:num_requests_running` and `vllm:num_requests_waiting` metrics. Logged at INFO while anything runs, waits or
//! flows, at DEBUG when the server is idle (as vLLM does). Its numbers are fields of the event as well
//! (`prompt_throughput`, `generation_throughput`, `running`, `waiting`, `held`, `kept`, `paused`: numbers in
//! `--log-format json`).

use std::fmt;
use std::time::{Duration, Instant};

use loragate_core::{AdapterStatus, Coordinator};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

/// Logs the stats line every `interval` until `stop` fires.
pub(crate) async fn log_stats(coordinator: Coordinator, interval: Duration, stop: CancellationToken) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last = (Instant::now(), coordinator.metrics().token_totals());
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let statuses = coordinator.statuses().await;
        let now = (Instant::now(), coordinator.metrics().token_totals());
        let (elapsed, (prompt, generation)) = (now.0 - last.0, (now.1.0 - last.1.0, now.1.1 - last.1.1));
        let line = StatsLine::of(&statuses, elapsed, prompt, generation);
        // The numbers as fields too: `--log-format json` pipelines read them without parsing the message.
        macro_rules! emit {
            ($level:ident) => {
                tracing::$level!(
                    prompt_throughput = line.prompt_throughput,
                    generation_throughput = line.generation_throughput,
                    running = line.running,
                    waiting = line.waiting,
                    held = line.held,
                    kept = line.kept,
                    paused = line.paused.len(),
                    "{line}"
                )
            };
        }
        if line.is_idle() {
            emit!(debug);
        } else {
            emit!(info);
        }
        last = now;
    }
}

/// One stats line.
#[derive(Debug, PartialEq)]
struct StatsLine {
    prompt_throughput: f64,
    generation_throughput: f64,
    running: u64,
    waiting: u64,
    held: u64,
    kept: u64,
    /// Each paused adapter (`(base model)` for the base model) with its number of pauses.
    paused: Vec<(String, usize)>,
}

impl StatsLine {
    /// The line for `statuses`, with `prompt` and `generation` tokens over the last `elapsed`.
    fn of(statuses: &[AdapterStatus], elapsed: Duration, prompt: u64, generation: u64) -> Self {
        let per_second = |tokens: u64| if elapsed.is_zero() { 0.0 } else { tokens as f64 / elapsed.as_secs_f64() };
        let mut line = Self {
            prompt_throughput: per_second(prompt),
            generation_throughput: per_second(generation),
            running: 0,
            waiting: 0,
            held: 0,
            kept: 0,
            paused: Vec::new(),
        };
        for status in statuses {
            let queued = status.in_flight.saturating_sub(status.running);
            line.running += u64::from(status.running);
            line.waiting += u64::from(status.held) + u64::from(status.kept) + u64::from(queued);
            line.held += u64::from(status.held);
            line.kept += u64::from(status.kept);
            if status.paused {
                let name = match status.key.as_wire_str() {
                    "" => "(base model)".to_owned(),
                    name => name.to_owned(),
                };
                line.paused.push((name, status.pauses.len().max(1)));
            }
        }
        line
    }

    /// Nothing flowed, runs or waits (paused adapters alone are no activity).
    fn is_idle(&self) -> bool {
        self.prompt_throughput == 0.0 && self.generation_throughput == 0.0 && self.running == 0 && self.waiting == 0
    }
}

impl fmt::Display for StatsLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Avg prompt throughput: {:.1} tokens/s, Avg generation throughput: {:.1} tokens/s, Running: {} reqs, \
             Waiting: {} reqs (held at a gate: {}, kept by a pause: {}), Paused: ",
            self.prompt_throughput, self.generation_throughput, self.running, self.waiting, self.held, self.kept,
        )?;
        if self.paused.is_empty() {
            return f.write_str("none");
        }
        for (index, (name, pauses)) in self.paused.iter().enumerate() {
            let separator = if index == 0 { "" } else { ", " };
            let plural = if *pauses == 1 { "" } else { "s" };
            write!(f, "{separator}{name} ({pauses} pause{plural})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use loragate_core::{AdapterKey, AdapterName, AdapterVersion};

    use super::*;

    fn status(name: &str, in_flight: u32, running: u32, held: u32, kept: u32, paused: bool) -> AdapterStatus {
        let key = if name.is_empty() {
            AdapterKey::Base
        } else {
            AdapterKey::Lora(AdapterName::parse(name).expect("a valid name"))
        };
        AdapterStatus {
            key,
            version: AdapterVersion(1),
            paused,
            in_flight,
            running,
            held,
            waiting: 0,
            kept,
            pauses: Vec::new(),
            weights_error: None,
            versions: Vec::new(),
            staleness: None,
        }
    }

    #[test]
    fn the_line_reads_like_vllms_with_what_the_gates_hold() {
        let statuses =
            [status("", 3, 2, 0, 0, false), status("meow", 1, 0, 4, 2, true), status("woof", 0, 0, 0, 0, false)];
        let line = StatsLine::of(&statuses, Duration::from_secs(10), 120, 455);
        assert_eq!(
            line.to_string(),
            "Avg prompt throughput: 12.0 tokens/s, Avg generation throughput: 45.5 tokens/s, Running: 2 reqs, \
             Waiting: 8 reqs (held at a gate: 4, kept by a pause: 2), Paused: meow (1 pause)"
        );
        assert!(!line.is_idle());
    }

    #[test]
    fn an_idle_server_is_idle_even_with_a_paused_adapter() {
        let statuses = [status("", 0, 0, 0, 0, true), status("meow", 0, 0, 0, 0, true)];
        let line = StatsLine::of(&statuses, Duration::from_secs(10), 0, 0);
        assert!(line.is_idle(), "{line}");
        assert!(line.to_string().ends_with("Paused: (base model) (1 pause), meow (1 pause)"), "{line}");
        assert_eq!(StatsLine::of(&[], Duration::ZERO, 5, 5).prompt_throughput, 0.0, "no time, no rate");
    }
}
