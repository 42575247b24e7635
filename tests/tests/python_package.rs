//! The Python package (`crates/loragate-py`, `import loragate`) against a real demo server: its pytest suite
//! (`crates/loragate-py/tests/`) runs with `$LORAGATE_PYTHON` (default `python3`), which must have the package,
//! `pytest` and `numpy` installed; the README's test command (`scripts/test.sh`) installs them into `.venv`. Without
//! them the test fails, saying so.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use loragate_tests::DemoServer;

/// A bound on the whole suite, so that a hung test fails instead of blocking CI (it takes seconds normally).
const SUITE_LIMIT: Duration = Duration::from_secs(20 * 60);

fn python() -> String {
    std::env::var("LORAGATE_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_package_passes_its_pytest_suite_against_a_real_server() {
    let python = python();
    let check = Command::new(&python)
        .args(["-c", "import loragate, pytest, numpy"])
        .output()
        .unwrap_or_else(|err| panic!("cannot run {python}: {err}"));
    assert!(
        check.status.success(),
        "{python} lacks the loragate package, pytest or numpy (scripts/test.sh installs them into .venv; by hand: \
         pip install ./crates/loragate-py pytest numpy): {}",
        String::from_utf8_lossy(&check.stderr)
    );

    let demo = DemoServer::start().await;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut pytest = Command::new(&python);
    pytest
        .current_dir(&repo)
        .args(["-m", "pytest", "crates/loragate-py/tests", "-q", "-p", "no:cacheprovider", "--strict-markers"])
        .env("LORAGATE_TEST_GRPC", demo.server.grpc_addr().to_string())
        .env("LORAGATE_TEST_HTTP", demo.server.http_addr().to_string())
        .env("LORAGATE_TEST_ADAPTERS", demo.adapter_root.to_path_buf())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The server runs on this test's runtime: wait for pytest off it.
    let output = tokio::task::spawn_blocking(move || run_bounded(pytest, SUITE_LIMIT)).await.expect("pytest's waiter");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the package's tests failed ({}):\n{stdout}\n{stderr}", output.status);
    assert!(stdout.contains(" passed"), "pytest ran no test:\n{stdout}\n{stderr}");
    assert!(
        !stdout.contains(" deselected") && !stdout.contains(" skipped"),
        "every test of the package runs:\n{stdout}"
    );
}

/// Runs `command` to its end, killing it after `limit`.
fn run_bounded(mut command: Command, limit: Duration) -> std::process::Output {
    let mut child = command.spawn().expect("pytest starts");
    let (stdout, stderr) = (child.stdout.take().expect("stdout"), child.stderr.take().expect("stderr"));
    let read = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let (stdout, stderr) = (read(Box::new(stdout)), read(Box::new(stderr)));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("pytest's status") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let status = child.wait().expect("pytest's status");
            eprintln!("pytest ran past {limit:?} and was killed");
            break status;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::process::Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}
