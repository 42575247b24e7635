//! The step scheduler: one dedicated OS thread owns the model and runs it, off the async runtime, one step at a
//! time under a token budget (the design of vLLM V1's scheduler and TGI's chunked prefill).
//!
//! Every step:
//! 1. take new submissions from the command channel (blocking on it when there is nothing to do: no busy loop);
//! 2. hand back every cancelled request — waiting, in the middle of its prefill or decoding — with
//!    `Finished { Abort }` (a decoding sequence's tokens were already emitted, one per step), and drop those whose
//!    caller went away;
//! 3. plan: **every** decoding sequence gets one token (and a block when it needs one: if the cache has none left,
//!    the newest running sequence is preempted — its blocks freed, its keys and values recomputed later, vLLM V1's
//!    policy); what is left of `max_num_batched_tokens` goes to prompt chunks, dealt round-robin over tenants
//!    (adapters and the base model) and first come first served within one ([`fair`]); a request starts only when
//!    the batch has room for its `num_samples` sequences (`max_batch_size`), taking the leading blocks of its prompt
//!    the prefix cache holds, and prefilling only the rest;
//! 4. run all of it in **one** forward pass ([`Llama::forward_packed`]): the decode rows, whatever their adapters and
//!    lengths, and the chunks of several prompts, each token at its own position with its own adapter;
//! 5. emit each decode row's token; after each chunk, keep its prompt logprobs; after a prompt's last chunk, emit
//!    them and its sequences' first tokens (its `num_samples` sequences share the prefill) — those that go on join
//!    the decode batch for the next step, sharing the prompt's blocks.
//!
//! So a decoding sequence never waits for someone else's prefill: every step advances it, and the budget bounds what
//! a step costs. A long prompt is prefilled over several steps. A cancelled request is answered within one step.
//! Events go to each request's [`outbox`], which never makes a step wait for a slow reader. A sequence whose logits
//! are not all finite (an adapter's values overflowed), or a request whose prefill chunk is not, fails with
//! [`EngineError::NonFiniteOutput`]; the others in the pass go on. Errors of the model end the affected requests with
//! [`EngineError::Internal`]; the thread keeps serving. Dropping the [`StepThread`] stops the thread after its
//! current step, and every request still in it ends with [`EngineError::Stopped`].

mod batch;
mod cost;
mod fair;
mod outbox;
mod park;
mod pending;
mod preempt;
mod prefill;
mod sequence;
mod step;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;

use loragate_core::EngineError;

use crate::lora::LoraBank;
use crate::model::{KvCache, Llama};
use batch::Batch;
use pending::Pending;

pub(crate) use cost::{ChunkProbe, StepCostModel};
pub use cost::{StepCost, StepTarget};
pub(crate) use outbox::outbox;
pub(crate) use sequence::Submission;

/// What the engine front sends to the step thread.
pub(crate) enum Command {
    /// Start a request.
    Generate(Box<Submission>),
    /// Stop after the current step.
    Shutdown,
}

/// The running step thread. Dropping it stops the thread and waits for it.
pub(crate) struct StepThread {
    commands: Sender<Command>,
    handle: Option<JoinHandle<()>>,
    /// The step cost the thread has fitted, as of its last step.
    cost: Arc<parking_lot::Mutex<StepCost>>,
}

impl StepThread {
    /// Starts the thread, which owns `model` and `cache` from now on.
    pub(crate) fn spawn(model: Llama, cache: KvCache, limits: StepLimits) -> std::io::Result<Self> {
        let (commands, receiver) = mpsc::channel();
        let scheduler = Scheduler::new(model, cache, receiver, limits);
        let cost = scheduler.published_cost.clone();
        let threads = rayon::current_num_threads();
        let handle = std::thread::Builder::new().name("loragate-engine-step".into()).spawn(move || {
            // The steps run on a worker of the engine's own compute pool: a forward pass's parallel products then
            // split among the pool's threads by work stealing, instead of each of the ~200 products of a token
            // being handed from a thread outside the pool to it and back (two wake-ups each).
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|index| format!("loragate-compute-{index}"))
                .build();
            match pool {
                Ok(pool) => pool.install(|| scheduler.run()),
                Err(err) => {
                    tracing::warn!(%err, "no compute pool of its own: the engine steps on rayon's global pool");
                    scheduler.run();
                }
            }
        })?;
        Ok(Self { commands, handle: Some(handle), cost })
    }

    /// What a step costs, as fitted to the steps run so far (the prior until one has run).
    pub(crate) fn step_cost(&self) -> StepCost {
        *self.cost.lock()
    }

    /// Hands `submission` to the thread; fails with [`EngineError::Stopped`] if the thread is gone.
    pub(crate) fn submit(&self, submission: Submission) -> Result<(), EngineError> {
        self.commands.send(Command::Generate(Box::new(submission))).map_err(|_| EngineError::Stopped)
    }
}

impl Drop for StepThread {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(handle) = self.handle.take()
            && handle.join().is_err()
        {
            tracing::error!("the engine step thread panicked");
        }
    }
}

/// What one step may hold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepLimits {
    /// The most decoding sequences (and sequences of started prefills) at once.
    pub(crate) max_batch_size: usize,
    /// The most tokens of one forward pass: one per decoding sequence, the rest prompt chunks.
    pub(crate) max_num_batched_tokens: usize,
    /// How long a step with decode rows and prompt chunks may take, against a decode-only step of the batch
    /// (`None`: as long as the token budget makes it).
    pub(crate) step_target: Option<StepTarget>,
    /// What steps are assumed to cost until measured.
    pub(crate) cost_prior: StepCost,
}

struct Scheduler {
    model: Llama,
    /// The paged KV cache every sequence's blocks come from.
    cache: KvCache,
    /// The last stamp handed to a sequence or prefill starting to run (the newest is preempted first).
    stamp: u64,
    commands: Receiver<Command>,
    limits: StepLimits,
    /// Requests not decoding yet: waiting, or in the middle of their prefill.
    pending: Pending,
    /// Continuations waiting for a place in the batch to resume from their parked keys and values, in arrival
    /// order. They take places before any new prefill.
    resuming: VecDeque<park::Resuming>,
    /// The decoding sequences.
    batch: Batch,
    /// The LoRA bank of the last pass, reused while the set of adapters in the pass does not change.
    bank: Option<Arc<LoraBank>>,
    /// What a step costs, fitted to the steps run so far.
    cost: StepCostModel,
    /// Varies the prompt chunks when the fit pins them at the minimum, so that it can measure them.
    probe: ChunkProbe,
    /// Where the fitted cost is published (for the metrics).
    published_cost: Arc<parking_lot::Mutex<StepCost>>,
    /// How a step's time is taken.
    clock: step::StepClock,
    /// What each step ran, for tests of the scheduler's invariants.
    #[cfg(test)]
    trace: Vec<step::StepTrace>,
}

impl Scheduler {
    fn new(model: Llama, cache: KvCache, commands: Receiver<Command>, limits: StepLimits) -> Self {
        let limits = StepLimits {
            max_batch_size: limits.max_batch_size.max(1),
            max_num_batched_tokens: limits.max_num_batched_tokens.max(1),
            ..limits
        };
        Self {
            model,
            cache,
            stamp: 0,
            commands,
            limits,
            pending: Pending::default(),
            resuming: VecDeque::new(),
            batch: Batch::new(),
            bank: None,
            cost: StepCostModel::new(limits.cost_prior),
            probe: ChunkProbe::default(),
            published_cost: Arc::new(parking_lot::Mutex::new(limits.cost_prior)),
            clock: step::StepClock::Wall,
            #[cfg(test)]
            trace: Vec::new(),
        }
    }

    fn run(mut self) {
        while self.receive_commands() {
            self.run_step();
        }
        self.pending.stop_all();
        self.batch.stop_all();
        for resuming in self.resuming.drain(..) {
            resuming.submission.events.send(Err(EngineError::Stopped));
        }
    }

    /// Takes every pending command, blocking for one when the thread has nothing to do. False once told to stop.
    fn receive_commands(&mut self) -> bool {
        if self.is_idle() {
            let keep_running = self.commands.recv().ok().is_some_and(|command| self.handle(command));
            if !keep_running {
                return false;
            }
        }
        loop {
            match self.commands.try_recv() {
                Ok(command) => {
                    if !self.handle(command) {
                        return false;
                    }
                }
                Err(TryRecvError::Disconnected) => return false,
                Err(TryRecvError::Empty) => return true,
            }
        }
    }

    /// Whether nothing is decoding, waiting or being prefilled.
    fn is_idle(&self) -> bool {
        self.batch.is_empty() && self.pending.is_empty() && self.resuming.is_empty()
    }

    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Generate(submission) => {
                self.submit(submission);
                true
            }
            Command::Shutdown => false,
        }
    }

    /// Queues a submission: to resume, if it brings parked keys and values that fit; to be prefilled otherwise.
    fn submit(&mut self, submission: Box<Submission>) {
        match park::Resuming::accept(submission, self.batch.parked(), &self.model) {
            Ok(resuming) => self.resuming.push_back(resuming),
            Err(submission) => self.pending.push(*submission, &self.model),
        }
    }
}
