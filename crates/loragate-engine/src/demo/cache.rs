//! Generating the demo once per machine: a versioned cache directory, filled atomically.

use std::path::{Path, PathBuf};

use super::{DemoError, DemoFiles, write_demo_files};

/// A fingerprint of the generator's sources (and of the base weights' initialisation): any change to them (shapes,
/// seeds, corpus, training) names a new cache directory, so a stale copy is never served.
const GENERATOR_FINGERPRINT: u64 = fnv1a(&[
    include_str!("../demo.rs").as_bytes(),
    include_str!("../model/weights.rs").as_bytes(),
    include_str!("base.rs").as_bytes(),
    include_str!("corpus.rs").as_bytes(),
    include_str!("train.rs").as_bytes(),
    include_str!("vocab.rs").as_bytes(),
]);

/// The file written last into a generated copy; a copy without it (or with another content) is incomplete.
const STAMP_FILE: &str = "GENERATOR_STAMP";

/// The directory [`ensure_demo_files`] uses by default: `$LORAGATE_CACHE_DIR`, else `$XDG_CACHE_HOME/loragate`,
/// else `$HOME/.cache/loragate`, else `loragate` in the temporary directory.
pub fn default_cache_dir() -> PathBuf {
    let from_env = |name| std::env::var_os(name).filter(|value| !value.is_empty()).map(PathBuf::from);
    from_env("LORAGATE_CACHE_DIR")
        .or_else(|| from_env("XDG_CACHE_HOME").map(|dir| dir.join("loragate")))
        .or_else(|| from_env("HOME").map(|dir| dir.join(".cache").join("loragate")))
        .unwrap_or_else(|| std::env::temp_dir().join("loragate"))
}

/// The demo files in `cache_dir`, generated first if there is no complete copy made by this version of the
/// generator. Safe against concurrent callers (several test processes): one generates while the others wait on a
/// lock file beside the copy, into a temporary sibling directory renamed into place (a crash leaves no half copy);
/// where the file system has no locks, each generates its own and a loser of the race uses the winner's.
pub fn ensure_demo_files(cache_dir: &Path) -> Result<DemoFiles, DemoError> {
    let root = cache_dir.join(format!("demo-{GENERATOR_FINGERPRINT:016x}"));
    if is_complete(&root) {
        return Ok(DemoFiles::at(&root));
    }
    std::fs::create_dir_all(cache_dir).map_err(DemoError::io(cache_dir))?;
    // One generator at a time: concurrent callers wait for the first one's copy instead of training the same
    // adapters at once (on a clean checkout the parallel tests did, each slowing the others).
    let _generating = lock_generation(cache_dir);
    if is_complete(&root) {
        return Ok(DemoFiles::at(&root));
    }
    let mut staging = Staging::new(cache_dir.join(format!(
        ".demo-{GENERATOR_FINGERPRINT:016x}.{}-{:016x}.tmp",
        std::process::id(),
        rand::random::<u64>()
    )));
    write_demo_files(&staging.path)?;
    let stamp = staging.path.join(STAMP_FILE);
    std::fs::write(&stamp, stamp_contents()).map_err(DemoError::io(&stamp))?;
    match staging.rename_to(&root) {
        Ok(()) => Ok(DemoFiles::at(&root)),
        // Another process got there first (the rename fails onto a non-empty directory).
        Err(_) if is_complete(&root) => Ok(DemoFiles::at(&root)),
        Err(_) => {
            // An incomplete copy left by hand or by a crash predating the atomic rename: replace it.
            let _ = std::fs::remove_dir_all(&root);
            staging.rename_to(&root).map_err(DemoError::io(&root))?;
            Ok(DemoFiles::at(&root))
        }
    }
}

/// The demo files copied into `out` (`out/model/`, `out/adapters/{meow,woof}/`, as [`write_demo_files`] writes
/// them) from the copy in `cache_dir`, which is generated first if there is none. Where the cache cannot be used
/// (a directory that cannot be written), the files are generated into `out` directly.
pub fn copy_demo_files(cache_dir: &Path, out: &Path) -> Result<DemoFiles, DemoError> {
    let Ok(cached) = ensure_demo_files(cache_dir) else {
        return write_demo_files(out);
    };
    let files = DemoFiles::at(out);
    for (from, to) in [
        (&cached.model_dir, &files.model_dir),
        (&cached.meow_dir, &files.meow_dir),
        (&cached.woof_dir, &files.woof_dir),
    ] {
        std::fs::create_dir_all(to).map_err(DemoError::io(to))?;
        for entry in std::fs::read_dir(from).map_err(DemoError::io(from))? {
            let entry = entry.map_err(DemoError::io(from))?;
            let target = to.join(entry.file_name());
            std::fs::copy(entry.path(), &target).map_err(DemoError::io(&target))?;
        }
    }
    Ok(files)
}

/// An exclusive lock on the generation of this generator's copy in `cache_dir`, held until dropped (the file is
/// closed); `None` where the file system has no locks: callers then race as before, each on its own staging copy.
fn lock_generation(cache_dir: &Path) -> Option<std::fs::File> {
    let path = cache_dir.join(format!(".demo-{GENERATOR_FINGERPRINT:016x}.lock"));
    let file = std::fs::File::options().create(true).truncate(false).write(true).open(path).ok()?;
    file.lock().ok()?;
    Some(file)
}

fn stamp_contents() -> String {
    format!("{GENERATOR_FINGERPRINT:016x}\n")
}

fn is_complete(root: &Path) -> bool {
    let files = DemoFiles::at(root);
    let stamped = std::fs::read_to_string(root.join(STAMP_FILE)).is_ok_and(|stamp| stamp == stamp_contents());
    stamped
        && ["config.json", "model.safetensors", crate::TOKENIZER_FILE].iter().all(|f| files.model_dir.join(f).is_file())
        && [&files.meow_dir, &files.woof_dir]
            .iter()
            .all(|dir| dir.join("adapter_config.json").is_file() && dir.join("adapter_model.safetensors").is_file())
}

/// A temporary directory, removed on drop unless it was renamed into place.
struct Staging {
    path: PathBuf,
    renamed: bool,
}

impl Staging {
    fn new(path: PathBuf) -> Self {
        Self { path, renamed: false }
    }

    fn rename_to(&mut self, target: &Path) -> std::io::Result<()> {
        std::fs::rename(&self.path, target)?;
        self.renamed = true;
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

const fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut part = 0;
    while part < parts.len() {
        let bytes = parts[part];
        let mut index = 0;
        while index < bytes.len() {
            hash ^= bytes[index] as u64;
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            index += 1;
        }
        part += 1;
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incomplete_copies_are_not_complete() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        assert!(!is_complete(dir.path()));
        std::fs::write(dir.path().join(STAMP_FILE), stamp_contents()).expect("stamp");
        assert!(!is_complete(dir.path()), "a stamp without the files is not a copy");
    }
}
