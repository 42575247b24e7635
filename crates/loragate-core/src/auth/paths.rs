//! Which adapter directories under `--adapter-root` a tenant key may load from (`"paths"` in the tenant file, or by
//! default its `"adapters"` patterns read as directories).
//!
//! A requested path is checked twice, both times here: as spelled (lexically, before anything is looked up on disk,
//! so that the answer never depends on what exists outside the tenant's directories), and once resolved (its real
//! path, so that a symlink inside the tenant's directory cannot lead into another tenant's). Paths are compared
//! component by component: `team-a` allows `team-a/policy`, never `team-ab/`.

use std::path::{Component, Path, PathBuf};

use super::KeyConfigError;

/// A directory a tenant may load adapters from, relative to the adapter root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathPattern {
    /// This directory and everything under it (`meow`, `team-a/`), as path components.
    Under(Vec<String>),
    /// Every relative path (components joined with `/`) starting with this (`team-a/*`, `exp-*`; `*` alone: the
    /// whole root).
    Prefix(String),
}

impl PathPattern {
    /// Parses `dir` (that directory and everything under it) or `prefix*`, relative to the adapter root: no absolute
    /// path, no `..`, and a `*` only at the end.
    pub fn parse(raw: &str) -> Result<Self, KeyConfigError> {
        let bad = |why: &str| KeyConfigError::BadPattern { pattern: raw.to_owned(), why: why.to_owned() };
        let (body, prefix) = match raw.strip_suffix('*') {
            Some(body) => (body, true),
            None => (raw, false),
        };
        if body.contains('*') {
            return Err(bad("only a trailing * is supported"));
        }
        if body.chars().any(char::is_control) {
            return Err(bad("adapter paths have no control characters"));
        }
        let path = Path::new(body);
        if path.is_absolute() || path.has_root() {
            return Err(bad("adapter paths are relative to --adapter-root"));
        }
        if path.components().any(|part| matches!(part, Component::ParentDir)) {
            return Err(bad("adapter paths may not contain `..`"));
        }
        if prefix {
            return Ok(Self::Prefix(body.to_owned()));
        }
        let parts = components(path).ok_or_else(|| bad("adapter paths are UTF-8"))?;
        if parts.is_empty() {
            return Err(bad("an empty path would allow the whole adapter root: say `*` if that is meant"));
        }
        Ok(Self::Under(parts))
    }

    /// The path a tenant may load from by default for an adapter pattern of its `adapters` (the same spelling, read
    /// as a directory under the root); `None` where the pattern is no valid path pattern.
    pub(super) fn from_adapter_pattern(raw: &str) -> Option<Self> {
        Self::parse(raw).ok()
    }

    /// Whether the relative path `parts` (normalised components) is allowed.
    fn permits(&self, parts: &[String]) -> bool {
        match self {
            Self::Under(allowed) => parts.starts_with(allowed),
            Self::Prefix(prefix) => parts.join("/").starts_with(prefix.as_str()),
        }
    }
}

impl std::fmt::Display for PathPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Under(parts) => write!(f, "{}/", parts.join("/")),
            Self::Prefix(prefix) => write!(f, "{prefix}*"),
        }
    }
}

/// The directories one tenant may load adapters from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathGrant(Vec<PathPattern>);

impl PathGrant {
    /// The grant of explicit patterns.
    pub fn new(patterns: Vec<PathPattern>) -> Self {
        Self(patterns)
    }

    /// The default grant of a tenant whose file names no `paths`: its adapter patterns, read as directories.
    pub(super) fn from_adapter_patterns<'a>(patterns: impl IntoIterator<Item = &'a str>) -> Self {
        Self(patterns.into_iter().filter_map(PathPattern::from_adapter_pattern).collect())
    }

    /// Whether `path` lies in an allowed directory: `path` is relative to `root`, or absolute (then it must lie under
    /// `root`); decided by its spelling alone (`.` dropped, `..` taken lexically, never climbing above the root).
    pub fn permits(&self, root: &Path, path: &Path) -> bool {
        relative_parts(root, path).is_some_and(|parts| self.0.iter().any(|pattern| pattern.permits(&parts)))
    }

    /// The allowed directories, as an error message lists them (the tenant's own grant, nothing else).
    pub fn describe(&self) -> String {
        if self.0.is_empty() {
            return "none".to_owned();
        }
        self.0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    }
}

/// `path`'s components relative to `root` (normalised lexically), or `None` if it is outside `root`, climbs above it
/// with `..`, or is not UTF-8.
fn relative_parts(root: &Path, path: &Path) -> Option<Vec<String>> {
    let relative: PathBuf = if path.has_root() {
        let normalized = normalize(path)?;
        let root = normalize(root)?;
        normalized.strip_prefix(&root).ok()?.to_owned()
    } else {
        normalize(path)?
    };
    components(&relative)
}

/// `path` with `.` dropped and `..` applied lexically; `None` if `..` would climb above its start.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut normalized = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !normalized.pop() {
                    return None;
                }
            }
            other => normalized.push(other),
        }
    }
    Some(normalized)
}

/// The normal components of a relative path, as strings; `None` if one is not UTF-8 (or the path is not relative).
fn components(path: &Path) -> Option<Vec<String>> {
    path.components()
        .filter(|part| !matches!(part, Component::CurDir))
        .map(|part| match part {
            Component::Normal(name) => name.to_str().map(str::to_owned),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests;
