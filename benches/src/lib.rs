//! Shared helpers of the benchmarks: worker servers on their own threads. (Benchmarks over the scripted engine of
//! `loragate-core`'s `testing` feature build it themselves: that feature is a dev-dependency only.)

/// A `loragate worker` server on its own thread and runtime, as a separate process would be: killing it drops every
/// connection it had at once (its runtime goes, and with it every connection task).
pub struct ThreadWorker {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The port (to restart on the same address).
    pub port: u16,
    kill: tokio_util::sync::CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ThreadWorker {
    /// Serves `engine` on 127.0.0.1:`port` (0 for any) with `adapter_root`.
    pub fn start(engine: std::sync::Arc<dyn loragate_core::Engine>, adapter_root: &std::path::Path, port: u16) -> Self {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("address").port();
        let kill = tokio_util::sync::CancellationToken::new();
        let config = loragate_worker::WorkerConfig {
            served_model_name: "bench".into(),
            adapter_root: Some(loragate_core::AdapterRoot::new(adapter_root).expect("adapter root")),
            max_running_requests: 64,
            shutdown: tokio_util::sync::CancellationToken::new(),
        };
        let killed = kill.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                tokio::select! {
                    served = loragate_worker::serve_worker(listener, engine, config) => served.expect("serves"),
                    () = killed.cancelled() => {}
                }
            });
            drop(runtime);
        });
        Self { url: format!("http://127.0.0.1:{port}"), port, kill, thread: Some(thread) }
    }

    /// Kills the worker: every connection it had closes at once.
    pub fn kill(&mut self) {
        self.kill.cancel();
        if let Some(thread) = self.thread.take() {
            thread.join().expect("worker thread");
        }
    }
}

impl Drop for ThreadWorker {
    fn drop(&mut self) {
        self.kill();
    }
}
