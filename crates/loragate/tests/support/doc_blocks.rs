//! The fenced blocks of the Markdown docs and their markers (the convention is described in `docs/README.md`):
//! the info string's first word is the language, as GitHub reads it; the second, if any, says what the documentation
//! test does with the block: `run`, `output`, `serve` or `norun reason=WHY`.

#![allow(dead_code, unreachable_pub)]

use std::path::Path;

/// Languages whose blocks are commands a reader may paste: each must be marked.
const COMMAND_LANGUAGES: &[&str] = &["sh", "bash", "shell", "console", "python", "py"];

/// Words that start a command line: a block without a language holding one of them is a command block in disguise.
const COMMAND_WORDS: &[&str] = &["curl", "grpcurl", "cargo", "loragate", "python", "python3", "scripts/", "./scripts/"];

/// What the documentation test does with a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    /// Run in order against the file's demo server.
    Run,
    /// The expected standard output of the `run` block just before it.
    Output,
    /// Starts the demo server: the test starts it itself, on free ports.
    Serve,
    /// Not runnable by the test, for the reason given.
    NoRun(String),
    /// No marker: an illustration (a diagram, a formula, a file's shape), never a command.
    Unmarked,
}

/// One fenced block of a Markdown file.
#[derive(Debug, Clone)]
pub struct Block {
    /// The file, relative to the repository root.
    pub file: String,
    /// The line of its opening fence (1-based).
    pub line: usize,
    /// The line of its closing fence (1-based).
    pub end_line: usize,
    /// The info string's first word (empty when none).
    pub language: String,
    /// What the test does with it.
    pub marker: Marker,
    /// Its lines, joined with newlines (a trailing newline included).
    pub text: String,
}

impl Block {
    /// `file:line`, for messages.
    pub fn place(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }

    /// Whether the block is a command a reader would paste into a shell or Python.
    pub fn is_command(&self) -> bool {
        COMMAND_LANGUAGES.contains(&self.language.as_str())
            || (self.language.is_empty()
                && self.text.lines().any(|line| {
                    let line = line.trim_start();
                    COMMAND_WORDS.iter().any(|word| {
                        line.strip_prefix(word).is_some_and(|rest| word.ends_with('/') || rest.starts_with(' '))
                    })
                }))
    }
}

/// The fenced blocks of `text` (the Markdown file `file`), or the first malformed info string.
pub fn parse(file: &str, text: &str) -> Result<Vec<Block>, String> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String, String, Vec<&str>)> = None;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let fence = trimmed.starts_with("```") && line.len() - trimmed.len() <= 3;
        match open.take() {
            None if fence => {
                let info = trimmed.trim_start_matches('`').trim();
                let (language, marker) = info.split_once(char::is_whitespace).unwrap_or((info, ""));
                open = Some((index + 1, language.to_owned(), marker.trim().to_owned(), Vec::new()));
            }
            None => {}
            Some((start, language, marker, lines)) if fence && trimmed.trim_end() == "```" => {
                let marker = parse_marker(&marker).map_err(|err| format!("{file}:{start}: {err}"))?;
                let mut body = lines.join("\n");
                body.push('\n');
                let end_line = index + 1;
                blocks.push(Block { file: file.to_owned(), line: start, end_line, language, marker, text: body });
            }
            Some((start, language, marker, mut lines)) => {
                lines.push(line);
                open = Some((start, language, marker, lines));
            }
        }
    }
    match open {
        Some((start, ..)) => Err(format!("{file}:{start}: a fenced block is never closed")),
        None => Ok(blocks),
    }
}

fn parse_marker(marker: &str) -> Result<Marker, String> {
    let (word, rest) = marker.split_once(char::is_whitespace).unwrap_or((marker, ""));
    let rest = rest.trim();
    let marker = match word {
        "" => Marker::Unmarked,
        "run" => Marker::Run,
        "output" => Marker::Output,
        "serve" => Marker::Serve,
        "norun" => {
            let reason = rest.strip_prefix("reason=").map(str::trim).unwrap_or_default();
            if reason.is_empty() {
                return Err("`norun` needs `reason=WHY`".into());
            }
            return Ok(Marker::NoRun(reason.to_owned()));
        }
        other => return Err(format!("unknown marker {other:?} (run, output, serve or norun reason=…)")),
    };
    if rest.is_empty() { Ok(marker) } else { Err(format!("unexpected {rest:?} after the marker {word:?}")) }
}

/// `text` (a Markdown file) with the contents of the blocks opening at the given lines replaced, each by its new
/// contents (lines without the fences).
pub fn replace_contents(text: &str, blocks: &[(&Block, String)]) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::with_capacity(lines.len());
    let mut line = 1;
    for (block, contents) in blocks {
        out.extend(lines[line - 1..block.line].iter().map(|line| (*line).to_owned()));
        out.extend(contents.trim_end().lines().map(str::to_owned));
        line = block.end_line;
    }
    out.extend(lines[line - 1..].iter().map(|line| (*line).to_owned()));
    let mut joined = out.join("\n");
    if text.ends_with('\n') {
        joined.push('\n');
    }
    joined
}

/// Every rule of the convention `blocks` (one file's, in order) breaks, as messages naming the block.
pub fn violations(blocks: &[Block]) -> Vec<String> {
    let mut found = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        let place = block.place();
        let command = block.is_command();
        match &block.marker {
            Marker::Unmarked if command && block.language.is_empty() => found.push(format!(
                "{place}: a command block without a language: give it one (```sh) and a marker (run, serve or norun)"
            )),
            Marker::Unmarked if command => found
                .push(format!("{place}: a ```{} block must be marked run, serve or norun reason=…", block.language)),
            Marker::Run | Marker::Serve | Marker::NoRun(_) if !command => found.push(format!(
                "{place}: only command blocks (sh, bash, python) are run, served or marked not runnable"
            )),
            Marker::Run if !["sh", "bash", "python"].contains(&block.language.as_str()) => {
                found.push(format!("{place}: the test runs sh, bash and python blocks, not {:?}", block.language))
            }
            Marker::Output if index == 0 || blocks[index - 1].marker != Marker::Run => {
                found.push(format!("{place}: an output block must follow a run block"))
            }
            Marker::Output if command => found.push(format!("{place}: an output block is json or text, not a command")),
            _ => {}
        }
    }
    found
}

/// The Markdown files whose examples are covered: `README.md` and every `docs/*.md`, relative to `root`, sorted.
pub fn documentation_files(root: &Path) -> Vec<String> {
    let mut files = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.expect("a docs/ entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "text\n```sh run\ncurl -s localhost:8000/health\n```\n\n```json output\n{\"status\":\"ok\"}\n```\n```\na diagram\n```\n```sh norun reason=needs a GPU\nloragate serve --device cuda:0\n```\n";

    #[test]
    fn blocks_are_parsed_with_their_markers_and_lines() {
        let blocks = parse("x.md", SAMPLE).expect("well formed");
        let markers: Vec<&Marker> = blocks.iter().map(|b| &b.marker).collect();
        assert_eq!(
            markers,
            [&Marker::Run, &Marker::Output, &Marker::Unmarked, &Marker::NoRun("needs a GPU".into())],
            "{blocks:?}"
        );
        assert_eq!((blocks[0].line, blocks[0].text.as_str()), (2, "curl -s localhost:8000/health\n"));
        assert_eq!((blocks[1].line, blocks[1].end_line), (6, 8));
        assert!(violations(&blocks).is_empty(), "{:?}", violations(&blocks));
        let blessed = replace_contents(SAMPLE, &[(&blocks[1], "{\"status\":\"draining\"}\n{}".into())]);
        assert_eq!(blessed, SAMPLE.replace("{\"status\":\"ok\"}", "{\"status\":\"draining\"}\n{}"));
    }

    #[test]
    fn unmarked_commands_stray_outputs_and_reasonless_noruns_are_refused() {
        let unmarked = parse("x.md", "```sh\ncurl -s localhost:8000/health\n```\n").expect("parsed");
        assert_eq!(violations(&unmarked).len(), 1);
        let disguised = parse("x.md", "```\ngrpcurl -plaintext 127.0.0.1:50051 list\n```\n").expect("parsed");
        assert_eq!(violations(&disguised).len(), 1, "a command without a language is still a command");
        let stray = parse("x.md", "```json output\n{}\n```\n").expect("parsed");
        assert_eq!(violations(&stray).len(), 1, "an output with no run before it");
        assert!(parse("x.md", "```sh norun\nx\n```\n").is_err(), "norun without a reason");
        assert!(parse("x.md", "```sh runn\nx\n```\n").is_err(), "a misspelt marker");
        assert!(parse("x.md", "```sh run\nx\n").is_err(), "an unclosed block");
    }
}
