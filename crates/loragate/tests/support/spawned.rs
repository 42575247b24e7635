//! The one way the binary's tests start `loragate`: a child process (killed when dropped) whose first stdout line is
//! its JSON ready line (`{"event": "ready", "grpc_addr", "http_addr", ...}`; logs go to stderr). Declared once in
//! `integration.rs`; the test files `use crate::spawned`.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a start (demo generation included, on a loaded machine) or a shutdown may take.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// A running `loragate` child and its ready line.
pub struct Spawned {
    child: Child,
    /// The ready line.
    pub ready: serde_json::Value,
    /// Everything it wrote to stderr so far.
    stderr: Arc<Mutex<String>>,
    /// The state directory [`Spawned::serve`] gave it (its own, never the user's), removed when dropped.
    _state_dir: Option<tempfile::TempDir>,
}

impl Spawned {
    /// Starts `loragate ARGS` (with the test demo cache, `RUST_LOG=warn` and one compute thread) and waits for its
    /// ready line.
    pub fn start(args: &[&str]) -> Self {
        Self::try_start(args).unwrap_or_else(|stderr| panic!("loragate {args:?} did not start: {stderr}"))
    }

    /// [`Spawned::start`], or what the child wrote to stderr if it exited before its ready line. Its stderr is
    /// passed on line by line (captured with the test's output).
    pub fn try_start(args: &[&str]) -> Result<Self, String> {
        Self::try_start_logging(args, "warn")
    }

    /// [`Spawned::try_start`] with `RUST_LOG=rust_log`.
    pub fn try_start_logging(args: &[&str], rust_log: &str) -> Result<Self, String> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_loragate"))
            .args(args)
            .env("LORAGATE_CACHE_DIR", cache_dir())
            .env("RUST_LOG", rust_log)
            .env("RAYON_NUM_THREADS", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("loragate starts");
        let (stdout, stderr) = (child.stdout.take().expect("stdout"), child.stderr.take().expect("stderr"));
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = sender.send(line);
        });
        let written = Arc::new(Mutex::new(String::new()));
        let errors = std::thread::spawn({
            let written = written.clone();
            move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    eprintln!("{line}");
                    let mut written = written.lock().expect("stderr lock");
                    written.push_str(&line);
                    written.push('\n');
                }
            }
        });
        let line = receiver.recv_timeout(PATIENCE).expect("the ready line (or the end of stdout) in time");
        if line.is_empty() {
            let _ = child.wait();
            let _ = errors.join();
            return Err(written.lock().expect("stderr lock").clone());
        }
        let ready: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("a JSON line: {line:?}"));
        assert_eq!(ready["event"], "ready", "{ready}");
        Ok(Self { child, ready, stderr: written, _state_dir: None })
    }

    /// `loragate serve ARGS` on free loopback ports, with its own temporary state directory.
    pub fn serve(args: &[&str]) -> Self {
        Self::serve_logging(args, "warn")
    }

    /// [`Spawned::serve`] with `RUST_LOG=rust_log`.
    pub fn serve_logging(args: &[&str], rust_log: &str) -> Self {
        let state_dir = tempfile::tempdir().expect("a state directory");
        let state_path = state_dir.path().to_str().expect("a UTF-8 temporary path").to_owned();
        let mut all = vec!["serve"];
        all.extend_from_slice(args);
        all.extend_from_slice(&[
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--state-dir",
            &state_path,
        ]);
        let mut spawned = Self::try_start_logging(&all, rust_log)
            .unwrap_or_else(|stderr| panic!("loragate {all:?} did not start: {stderr}"));
        // Dropped after the child is killed (`Drop` runs before the fields go).
        spawned._state_dir = Some(state_dir);
        spawned
    }

    /// A string field of the ready line.
    pub fn field(&self, key: &str) -> String {
        self.ready[key].as_str().unwrap_or_else(|| panic!("{key} in {}", self.ready)).to_owned()
    }

    /// Everything the child wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr lock").clone()
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// [`Spawned::terminate`], and everything it wrote to stderr (its stderr read to its end).
    pub fn terminate_with_stderr(self) -> (ExitStatus, String) {
        let written = self.stderr.clone();
        let status = self.terminate();
        let deadline = Instant::now() + PATIENCE;
        // The reader thread sees the end of stderr once the child is gone; poll for its last line.
        loop {
            let text = written.lock().expect("stderr lock").clone();
            if text.contains("shutdown complete") || Instant::now() > deadline {
                return (status, text);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    pub fn terminate(mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("kill runs");
        assert!(sent.success(), "SIGTERM sent");
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "loragate did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no shutdown, no goodbye.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where the tests' demo files are generated and reused: `$LORAGATE_CACHE_DIR`, else `target/loragate-test-cache`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("LORAGATE_CACHE_DIR")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/loragate-test-cache"))
}
