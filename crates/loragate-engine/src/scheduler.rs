//! The step scheduler: one dedicated OS thread owns the model and runs it, off the async runtime.
//!
//! Every step:
//! 1. take new submissions from the command channel (blocking on it when there is nothing to do: no busy loop);
//! 2. hand back every sequence whose request was cancelled (`Finished { Abort }`: its tokens were already emitted,
//!    one event per step) and drop those whose caller went away (closed event channel);
//! 3. admit waiting requests while the batch has room: prefill each prompt once (its `num_samples` sequences share
//!    the prefill and copy its keys and values), emit prompt logprobs, sample each sequence's first token;
//! 4. advance every running sequence by one token in **one** batched forward pass, whatever their adapters
//!    (base-model rows included) and lengths, and emit the tokens.
//!
//! A cancelled request is therefore answered within one step. Events go to each request's [`outbox`], which never
//! makes a step wait for a slow reader. A sequence whose logits are not all finite (an adapter's values overflowed)
//! fails with [`EngineError::NonFiniteOutput`] instead of sampling, and leaves the batch; the other rows go on.
//! Errors of the model end the affected requests with [`EngineError::Internal`]; the thread keeps serving. Dropping
//! the [`StepThread`] stops the thread after its current step, and every request still in it ends with
//! [`EngineError::Stopped`].

mod batch;
mod outbox;
mod sequence;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;

use candle_core::Tensor;
use loragate_core::{EngineError, EngineEvent};

use crate::lora::LoraBatch;
use crate::model::{Llama, log_softmax};
use crate::sampler::Sampler;
use batch::Batch;
use sequence::{RequestContext, Sequence};

pub(crate) use outbox::outbox;
pub(crate) use sequence::Submission;

/// Prompt positions whose logits are materialised at once when prompt logprobs are asked for.
const PROMPT_LOGPROB_CHUNK: usize = 256;

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
}

impl StepThread {
    /// Starts the thread, which owns `model` from now on.
    pub(crate) fn spawn(model: Llama, max_batch_size: usize) -> std::io::Result<Self> {
        let (commands, receiver) = mpsc::channel();
        let scheduler = Scheduler::new(model, receiver, max_batch_size);
        let handle = std::thread::Builder::new().name("loragate-engine-step".into()).spawn(move || scheduler.run())?;
        Ok(Self { commands, handle: Some(handle) })
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

struct Scheduler {
    model: Llama,
    commands: Receiver<Command>,
    max_batch_size: usize,
    waiting: VecDeque<Submission>,
    batch: Batch,
}

impl Scheduler {
    fn new(model: Llama, commands: Receiver<Command>, max_batch_size: usize) -> Self {
        let batch = Batch::new(&model);
        Self { model, commands, max_batch_size: max_batch_size.max(1), waiting: VecDeque::new(), batch }
    }

    fn run(mut self) {
        while self.receive_commands() {
            self.run_step();
        }
        for submission in self.waiting.drain(..) {
            submission.events.send(Err(EngineError::Stopped));
        }
        self.batch.stop_all();
    }

    /// Takes every pending command, blocking for one when the thread has nothing to do. False once told to stop.
    fn receive_commands(&mut self) -> bool {
        if self.batch.is_empty() && self.waiting.is_empty() {
            let keep_running = self.commands.recv().is_ok_and(|command| self.handle(command));
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

    /// One step: hand back abandoned sequences, admit what fits, decode one token for every running sequence.
    fn run_step(&mut self) {
        self.drop_abandoned();
        self.admit_waiting();
        if let Err(err) = self.batch.step(&self.model) {
            tracing::error!(error = %err, "decode step failed; failing its sequences");
            self.batch.fail_all(&format!("decode step failed: {err}"));
        }
    }

    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Generate(submission) => {
                self.waiting.push_back(*submission);
                true
            }
            Command::Shutdown => false,
        }
    }

    fn drop_abandoned(&mut self) {
        self.waiting.retain(|submission| {
            if submission.is_abandoned() {
                submission.abort();
                return false;
            }
            true
        });
        if let Err(err) = self.batch.drop_abandoned() {
            self.batch.fail_all(&format!("cannot shrink the batch: {err}"));
        }
    }

    /// Admits waiting requests in order while the batch has room for all their sequences (a request larger than
    /// the whole batch runs when the batch is empty).
    fn admit_waiting(&mut self) {
        while let Some(next) = self.waiting.front() {
            let wanted = next.request.num_samples() as usize;
            if !self.batch.is_empty() && self.batch.len() + wanted > self.max_batch_size {
                break;
            }
            let Some(submission) = self.waiting.pop_front() else { break };
            let events = submission.events.clone();
            if let Err(err) = self.admit(submission) {
                tracing::error!(error = %err, "prefill failed");
                events.send(Err(EngineError::Internal(format!("prefill failed: {err}"))));
            }
        }
    }

    /// Prefills one request's prompt, emits its prompt logprobs and first tokens, and adds the sequences that go
    /// on to the batch.
    fn admit(&mut self, submission: Submission) -> candle_core::Result<()> {
        if submission.cancel.is_cancelled() {
            submission.abort();
            return Ok(());
        }
        if submission.events.is_closed() {
            return Ok(());
        }
        let (context, request) = RequestContext::new(submission, &self.model.config().eos_token_ids);
        let prompt = request.prompt();
        let device = self.model.device();
        let tokens = Tensor::from_slice(prompt, (1, prompt.len()), device)?;
        let lora = LoraBatch::uniform(context.adapter.as_ref())?;
        let prefill = self.model.forward_sequences(&tokens, &lora)?;
        let last = prefill.hidden.narrow(1, prompt.len() - 1, 1)?;
        let logprobs = log_softmax(&self.model.logits(&last)?)?.flatten_all()?.to_vec1::<f32>()?;
        if request.include_prompt_logprobs() {
            let prompt_logprobs = self.prompt_logprobs(&prefill.hidden, prompt)?;
            // The first is NaN by definition (nothing predicts it); any other non-finite value is overflow.
            if prompt_logprobs[1..].iter().all(|logprob| logprob.is_finite()) {
                context.send(EngineEvent::PromptLogprobs(prompt_logprobs));
            } else {
                let where_ = format!("in the prompt logprobs, with adapter version {}", context.version);
                context.events.send(Err(EngineError::NonFiniteOutput(where_)));
                return Ok(());
            }
        }
        let mut continuing = 0;
        for index in 0..request.num_samples() {
            let sampler = Sampler::new(request.params(), index);
            let mut sequence = Sequence::new(Arc::clone(&context), index, sampler, prompt.len());
            match sequence.advance(&logprobs, self.model.context_length()) {
                Ok(Some(reason)) => sequence.finish(reason),
                Ok(None) => {
                    self.batch.push_row(sequence);
                    continuing += 1;
                }
                Err(error) => sequence.fail(error),
            }
        }
        self.batch.push_cache(&prefill.kv, continuing)
    }

    /// One logprob per prompt token under the model's raw distribution: NaN for the first (nothing predicts it),
    /// then `log p(prompt[i] | prompt[..i])`.
    fn prompt_logprobs(&self, hidden: &Tensor, prompt: &[u32]) -> candle_core::Result<Vec<f32>> {
        let mut logprobs = Vec::with_capacity(prompt.len());
        logprobs.push(f32::NAN);
        let predicting = prompt.len() - 1;
        let mut start = 0;
        while start < predicting {
            let len = PROMPT_LOGPROB_CHUNK.min(predicting - start);
            let chunk = log_softmax(&self.model.logits(&hidden.narrow(1, start, len)?.squeeze(0)?)?)?;
            let targets = Tensor::from_slice(&prompt[start + 1..start + 1 + len], (len, 1), self.model.device())?;
            logprobs.extend(chunk.gather(&targets, 1)?.flatten_all()?.to_vec1::<f32>()?);
            start += len;
        }
        Ok(logprobs)
    }
}
