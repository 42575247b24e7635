//! Where adapter weights may be read from. A path from a request becomes an [`AdapterSource`] only through
//! [`AdapterRoot::resolve`], which refuses anything outside the root (absolute paths elsewhere, `..` escapes,
//! symlinks pointing out).

use std::io;
use std::path::{Path, PathBuf};

use crate::error::{CoreError, Field};

/// A directory of adapter files the engine may read (PEFT: `adapter_config.json` + `adapter_model.safetensors`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSource {
    dir: PathBuf,
}

impl AdapterSource {
    /// A directory named by the operator (command line or configuration), trusted as is.
    pub fn trusted(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The only directory tree that `LoadLoraAdapter` requests may read from.
#[derive(Clone, Debug)]
pub struct AdapterRoot {
    root: PathBuf,
}

impl AdapterRoot {
    /// Opens `root`, which must be an existing directory.
    pub fn new(root: impl AsRef<Path>) -> io::Result<Self> {
        let root = std::fs::canonicalize(root.as_ref())?;
        if !root.is_dir() {
            return Err(io::Error::new(io::ErrorKind::NotADirectory, format!("{} is not a directory", root.display())));
        }
        Ok(Self { root })
    }

    /// The root directory (canonical).
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Resolves a requested path (relative paths are taken from the root) to a directory inside the root, following
    /// symlinks before checking. Errors name the `path` field.
    pub async fn resolve(&self, requested: &str) -> Result<AdapterSource, CoreError> {
        if requested.is_empty() {
            return Err(CoreError::invalid(Field::Path, "must not be empty"));
        }
        let joined = self.root.join(requested);
        let canonical = match tokio::fs::canonicalize(&joined).await {
            Ok(path) => path,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                return Err(CoreError::invalid(Field::Path, format!("{requested:?} does not exist")));
            }
            Err(err) => {
                return Err(CoreError::invalid(Field::Path, format!("{requested:?} cannot be read: {err}")));
            }
        };
        if !canonical.starts_with(&self.root) {
            return Err(CoreError::invalid(
                Field::Path,
                format!("{requested:?} is outside the adapter root {}", self.root.display()),
            ));
        }
        if !canonical.is_dir() {
            return Err(CoreError::invalid(Field::Path, format!("{requested:?} is not a directory")));
        }
        Ok(AdapterSource { dir: canonical })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_tree() -> (PathBuf, AdapterRoot) {
        let base = std::env::temp_dir().join(format!("loragate-root-{}", rand::random::<u64>()));
        std::fs::create_dir_all(base.join("root/meow")).expect("mkdir");
        std::fs::create_dir_all(base.join("outside")).expect("mkdir");
        let root = AdapterRoot::new(base.join("root")).expect("root");
        (base, root)
    }

    #[tokio::test]
    async fn paths_inside_the_root_resolve() {
        let (base, root) = temp_tree();
        let source = root.resolve("meow").await.expect("relative path");
        assert!(source.dir().ends_with("root/meow"));
        let absolute = base.join("root/meow");
        assert!(root.resolve(absolute.to_str().expect("utf8")).await.is_ok());
        std::fs::remove_dir_all(base).ok();
    }

    #[tokio::test]
    async fn escapes_and_symlinks_out_are_refused_naming_the_field() {
        let (base, root) = temp_tree();
        #[cfg(unix)]
        std::os::unix::fs::symlink(base.join("outside"), base.join("root/sneaky")).expect("symlink");
        let outside = base.join("outside");
        let mut refused = vec!["../outside", "meow/../../outside", outside.to_str().expect("utf8"), "missing", ""];
        if cfg!(unix) {
            refused.push("sneaky");
        }
        for path in refused {
            let err = root.resolve(path).await.expect_err(path);
            assert!(err.to_string().starts_with("path:"), "{path}: {err}");
        }
        std::fs::remove_dir_all(base).ok();
    }
}
