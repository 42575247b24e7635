//! `serve`'s start said as it goes: a first line naming every step ahead (preparing the demo model, loading a model,
//! restoring the state, waiting for a worker, loading the start-up adapters), a line as each step begins, a progress
//! line every few seconds while one runs long, and how long it took once it took over a second. The step under way is
//! what the HTTP listener quotes while starting (`/health`: 503 `{"status": "starting", "step"}`).

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::ServeConfig;
use crate::model::ModelSource;
use crate::state_dir::StateLocation;

/// How often a step still running says so.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// A step that took longer than this says how long once done.
const SAY_DURATION_OVER: Duration = Duration::from_secs(1);

/// The steps of one start, in order (those that apply to its configuration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct StartupPlan {
    /// Generating (or reading) the demo model; none for a model given by path.
    pub(super) model: Option<String>,
    /// Opening the recorded state.
    pub(super) state: String,
    /// Loading the weights, or waiting for a first worker.
    pub(super) backend: String,
    /// Starting the coordinator and loading the start-up adapters.
    pub(super) adapters: String,
}

impl StartupPlan {
    /// The steps `config` implies.
    pub(super) fn of(config: &ServeConfig) -> Self {
        let model = match &config.model {
            ModelSource::Demo { cache_dir } => Some(format!(
                "preparing the demo model in {} (generated on the first run only: its adapters are trained, 10-60 s)",
                cache_dir.display()
            )),
            ModelSource::Path(_) => None,
        };
        let state = match &config.state {
            StateLocation::Memory => "opening the state in memory (--state-dir none: nothing is recorded)".to_owned(),
            StateLocation::UserDefault => "restoring the state from the user's state directory".to_owned(),
            StateLocation::Directory(dir) => format!("restoring the state from {}", dir.display()),
            StateLocation::Shared(_) => "joining the replicas that share the state through etcd".to_owned(),
        };
        let backend = match (&config.model, config.fleet.is_enabled()) {
            (_, true) => format!(
                "waiting for a first of {} worker(s) to be ready (up to {} s)",
                config.fleet.workers.len(),
                config.fleet.join_timeout.as_secs()
            ),
            (ModelSource::Demo { .. }, false) => "loading the demo model's weights".to_owned(),
            (ModelSource::Path(path), false) => format!("loading the model {}", path.display()),
        };
        let given = config.adapters.initial.len();
        let adapters = match (&config.model, given) {
            (ModelSource::Demo { .. }, _) => "loading the start-up adapters (the demo's meow and woof, and --adapter)",
            (ModelSource::Path(_), 0) => "restoring the recorded adapters",
            (ModelSource::Path(_), _) => "restoring the recorded adapters and loading --adapter",
        }
        .to_owned();
        Self { model, state, backend, adapters }
    }

    /// The steps in order.
    fn steps(&self) -> impl Iterator<Item = &str> {
        self.model.iter().chain([&self.state, &self.backend, &self.adapters]).map(String::as_str)
    }
}

/// Says the start's steps as they go, and publishes the one under way.
pub(super) struct StartupSteps {
    current: watch::Sender<String>,
}

impl StartupSteps {
    /// Logs the first line: every step ahead and where the listeners are.
    pub(super) fn announce(plan: &StartupPlan, grpc_addr: SocketAddr, http_addr: SocketAddr) -> Self {
        let steps: Vec<&str> = plan.steps().collect();
        tracing::info!(
            %grpc_addr,
            %http_addr,
            "starting: {}; /health and /ready answer 503 {{\"status\":\"starting\"}} until serving",
            steps.join(", then ")
        );
        Self { current: watch::Sender::new("binding the listeners".to_owned()) }
    }

    /// The step under way, as it changes.
    pub(super) fn watch(&self) -> watch::Receiver<String> {
        self.current.subscribe()
    }

    /// The step under way now.
    pub(super) fn current(&self) -> String {
        self.current.borrow().clone()
    }

    /// Runs `work` as the step `step`: said as it begins, every [`PROGRESS_EVERY`] while it runs, and with its
    /// duration once done if that was over a second.
    pub(super) async fn run<T>(&self, step: &str, work: impl Future<Output = T>) -> T {
        self.current.send_replace(step.to_owned());
        tracing::info!("starting: {step}");
        let began = Instant::now();
        let mut ticks = tokio::time::interval_at(began + PROGRESS_EVERY, PROGRESS_EVERY);
        tokio::pin!(work);
        loop {
            tokio::select! {
                done = &mut work => {
                    let took = began.elapsed();
                    if took > SAY_DURATION_OVER {
                        tracing::info!(took_s = took.as_secs_f64(), "starting: {step}: done in {:.1} s", took.as_secs_f64());
                    }
                    return done;
                }
                _ = ticks.tick() => {
                    let elapsed = began.elapsed().as_secs();
                    tracing::info!(elapsed_s = elapsed, "starting: still {step} ({elapsed} s so far)");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn the_plan_names_the_demo_generation_first_and_the_state_directory() {
        let mut config = ServeConfig::demo(PathBuf::from("/cache"));
        config.state = StateLocation::Directory(PathBuf::from("/state"));
        let plan = StartupPlan::of(&config);
        let steps: Vec<&str> = plan.steps().collect();
        assert!(
            steps[0].starts_with("preparing the demo model in /cache (generated on the first run only"),
            "{steps:?}"
        );
        assert_eq!(steps[1], "restoring the state from /state");
        assert_eq!(steps[2], "loading the demo model's weights");
    }

    #[test]
    fn a_model_path_is_loaded_without_a_demo_step() {
        let mut config = ServeConfig::demo(PathBuf::from("/cache"));
        config.model = ModelSource::Path(PathBuf::from("/models/smol"));
        let plan = StartupPlan::of(&config);
        assert_eq!(plan.model, None);
        assert_eq!(plan.backend, "loading the model /models/smol");
        assert!(plan.state.contains("in memory"), "{plan:?}");
    }

    #[tokio::test]
    async fn a_step_is_published_while_it_runs_and_returns_its_result() {
        let plan = StartupPlan::of(&ServeConfig::demo(PathBuf::from("/cache")));
        let address: SocketAddr = "127.0.0.1:1".parse().expect("an address");
        let steps = StartupSteps::announce(&plan, address, address);
        let watched = steps.watch();
        let result = steps
            .run("loading", async {
                assert_eq!(*watched.borrow(), "loading", "published before the work runs");
                7
            })
            .await;
        assert_eq!(result, 7);
        assert_eq!(*watched.borrow(), "loading");
        assert_eq!(steps.current(), "loading");
    }
}
