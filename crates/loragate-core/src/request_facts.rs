//! What the core learns about one front request — the adapter it samples and its token counts — for the fronts'
//! access log. A front runs each request's handling inside [`RequestFacts::scope`]; every sample the request starts
//! through [`Coordinator::sample`](crate::Coordinator::sample) adds to it from its driver, which also records the
//! metrics, so the counts are the metrics' counts.

use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;

/// A request's facts, shared between the front that logs them and the sample drivers that fill them.
#[derive(Clone, Debug, Default)]
pub struct RequestFacts(Arc<Mutex<Facts>>);

/// The adapter and token counts of one request, as far as they are known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// The adapter sampled (`base` for the base model); the last one when the request sampled several.
    pub adapter: Option<String>,
    /// Prompt tokens of every sample the request started.
    pub prompt_tokens: usize,
    /// Tokens generated for the request so far, over all its samples and sequences.
    pub generated_tokens: usize,
}

tokio::task_local! {
    static CURRENT: RequestFacts;
}

impl RequestFacts {
    /// Runs `future` (a request's handling) with these facts as the ones its samples add to.
    pub async fn scope<F: Future>(self, future: F) -> F::Output {
        CURRENT.scope(self, future).await
    }

    /// What is known so far.
    pub fn facts(&self) -> Facts {
        self.0.lock().clone()
    }

    /// The facts of the request being handled, if its front keeps any.
    pub(crate) fn current() -> Option<Self> {
        CURRENT.try_with(Self::clone).ok()
    }

    pub(crate) fn record_prompt(&self, adapter: &str, tokens: usize) {
        let mut facts = self.0.lock();
        facts.adapter = Some(adapter.to_owned());
        facts.prompt_tokens += tokens;
    }

    pub(crate) fn record_generated(&self, tokens: usize) {
        self.0.lock().generated_tokens += tokens;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scope_collects_what_its_samples_record_and_nothing_leaks_outside_it() {
        assert!(RequestFacts::current().is_none(), "no facts outside a scope");
        let facts = RequestFacts::default();
        facts
            .clone()
            .scope(async {
                let current = RequestFacts::current().expect("inside the scope");
                current.record_prompt("meow", 12);
                current.record_generated(3);
                current.record_generated(4);
            })
            .await;
        assert_eq!(facts.facts(), Facts { adapter: Some("meow".into()), prompt_tokens: 12, generated_tokens: 7 });
        assert!(RequestFacts::current().is_none());
    }
}
