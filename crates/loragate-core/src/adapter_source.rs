//! Where adapter weights may be read from. A path from a request becomes an [`AdapterSource`] only through
//! [`AdapterRoot::resolve`], which refuses anything outside the root (absolute paths elsewhere, `..` escapes,
//! symlinks pointing out) with one message, whether or not the path exists outside. Engines open the files of a
//! source only through [`AdapterSource::open_file`], which refuses anything but a regular file and, for a source
//! inside a root, a file whose real path leaves the root (a symlinked file pointing out).

use std::any::Any;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use sha2::Digest;

use crate::contract::{CoreError, Field, Sha256, VersionOrigin};

/// The weights file of a PEFT adapter directory, whose SHA-256 is an adapter version's content identity.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// The configuration file of a PEFT adapter directory.
pub const CONFIG_FILE: &str = "adapter_config.json";

/// A directory of adapter files the engine may read (PEFT: `adapter_config.json` + `adapter_model.safetensors`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSource {
    dir: PathBuf,
    /// The root every file must lie in (canonical), for a source resolved from a request.
    root: Option<PathBuf>,
    /// For weights pushed into the adapter store: their digest and size, known since they were received.
    pushed: Option<(Sha256, u64)>,
    /// Weights the engine read while they were pushed, for its load to take instead of the files.
    prepared: Option<PreparedLoad>,
}

/// Weights an engine began reading before their load (a push's, while it was received: see
/// [`crate::Engine::prepare_pushed_adapter`]), travelling with their [`AdapterSource`] to the engine's
/// [`crate::Engine::load_adapter`], which takes them instead of reading the files again. Opaque to the core: only the
/// engine that prepared them knows their type. Not part of a source's identity (sources compare equal with or without
/// one). Whoever holds the push discards them once the version is installed or refused
/// (a push's stored version does when dropped), so that clones of the source kept elsewhere never hold weights.
#[derive(Clone)]
pub struct PreparedLoad(Arc<Mutex<Option<Box<dyn Any + Send>>>>);

impl PreparedLoad {
    /// Wraps what an engine prepared.
    pub fn new(prepared: Box<dyn Any + Send>) -> Self {
        Self(Arc::new(Mutex::new(Some(prepared))))
    }

    /// Takes what was prepared, if nobody took or discarded it yet.
    pub fn take(&self) -> Option<Box<dyn Any + Send>> {
        self.0.lock().take()
    }

    /// Drops what was prepared (if it was not taken): every clone then holds nothing.
    pub fn discard(&self) {
        drop(self.take());
    }

    /// Whether what was prepared is still there to take.
    fn is_pending(&self) -> bool {
        self.0.lock().is_some()
    }
}

impl std::fmt::Debug for PreparedLoad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedLoad").field("pending", &self.is_pending()).finish()
    }
}

/// A preparation is not part of a source's identity.
impl PartialEq for PreparedLoad {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for PreparedLoad {}

impl AdapterSource {
    /// A directory named by the operator (command line or configuration), trusted as is: its files may be symlinks
    /// anywhere (a Hugging Face cache snapshot is), but must still be regular files.
    pub fn trusted(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), root: None, pushed: None, prepared: None }
    }

    /// A directory of the adapter store holding pushed weights whose `adapter_model.safetensors` has `sha256` and
    /// `bytes` (checked as they were received; the store never changes a file once it is in place).
    pub fn pushed(dir: impl Into<PathBuf>, sha256: Sha256, bytes: u64) -> Self {
        Self { dir: dir.into(), root: None, pushed: Some((sha256, bytes)), prepared: None }
    }

    /// These weights with what an engine prepared of them while they were pushed.
    pub fn with_prepared(mut self, prepared: PreparedLoad) -> Self {
        self.prepared = Some(prepared);
        self
    }

    /// Takes what an engine prepared of these weights while they were pushed, if anything is left
    /// ([`PreparedLoad::take`]).
    pub fn take_prepared(&self) -> Option<Box<dyn Any + Send>> {
        self.prepared.as_ref().and_then(PreparedLoad::take)
    }

    /// Whether an engine's preparation of these weights is waiting to be taken.
    pub fn is_prepared(&self) -> bool {
        self.prepared.as_ref().is_some_and(PreparedLoad::is_pending)
    }

    /// Whether these are pushed weights in the adapter store.
    pub fn is_pushed(&self) -> bool {
        self.pushed.is_some()
    }

    /// Where the weights come from: the directory, or a push.
    pub fn origin(&self) -> VersionOrigin {
        match self.pushed {
            Some(_) => VersionOrigin::Push,
            None => VersionOrigin::Path(self.dir.clone()),
        }
    }

    /// The SHA-256 and size of the weights file: known for pushed weights, else read from the directory (blocking:
    /// call it off the async runtime). The file is opened as the engine opens it ([`AdapterSource::open_file`]).
    pub fn digest(&self) -> io::Result<(Sha256, u64)> {
        if let Some(known) = self.pushed {
            return Ok(known);
        }
        let (mut file, _) = self.open_file(WEIGHTS_FILE)?;
        let mut hasher = sha2::Sha256::new();
        let mut buffer = vec![0u8; 1 << 20];
        let mut bytes = 0u64;
        loop {
            let read = file.read(&mut buffer)?;
            if read == 0 {
                break;
            }
            hasher.update(&buffer[..read]);
            bytes += read as u64;
        }
        Ok((Sha256(hasher.finalize().into()), bytes))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The adapter root this source's files must lie in, if it came from a request.
    pub fn confined_to(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// Opens the file `name` (a file name, no separators) of the directory for reading, with its length. Blocking
    /// (call it off the async runtime). Every error's message names the file. Refuses, with an
    /// [`io::ErrorKind::InvalidInput`] error:
    /// - anything but a regular file: FIFOs, devices, sockets, directories (opening never blocks on a FIFO);
    /// - for a source inside an adapter root, a file whose canonical path is outside that root.
    ///
    /// The file opened is the one checked: its canonical path is opened without following a final symlink, and the
    /// opened handle's own metadata is what is checked.
    pub fn open_file(&self, name: &str) -> io::Result<(File, u64)> {
        let refused = || {
            let place = if self.root.is_some() { "a regular file inside the adapter root" } else { "a regular file" };
            io::Error::new(io::ErrorKind::InvalidInput, format!("{name} is not {place}"))
        };
        let missing = || {
            // A directory that is not there is what to say, not the first file looked for in it.
            let message = match (std::fs::metadata(&self.dir), &self.root) {
                (Err(_), None) => format!("the adapter directory {} does not exist", self.dir.display()),
                (Err(_), Some(_)) => "the adapter directory does not exist".to_owned(),
                (Ok(metadata), None) if !metadata.is_dir() => {
                    format!("{} is not a directory (an adapter is a PEFT directory)", self.dir.display())
                }
                (Ok(_), _) => format!("{name} is missing"),
            };
            io::Error::new(io::ErrorKind::NotFound, message)
        };
        let unreadable = |err: io::Error| io::Error::new(err.kind(), format!("cannot read {name}: {err}"));
        let path = self.dir.join(name);
        match std::fs::symlink_metadata(&path) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Err(missing()),
            Err(err) => return Err(unreadable(err)),
            Ok(_) => {}
        }
        // Inside a root, a dangling link says no more than a link out: whether a path outside exists is private.
        let canonical = std::fs::canonicalize(&path).map_err(|err| match err.kind() {
            io::ErrorKind::NotFound if self.root.is_none() => missing(),
            _ => refused(),
        })?;
        if self.root.as_ref().is_some_and(|root| !canonical.starts_with(root)) {
            return Err(refused());
        }
        let file = open_no_follow_no_block(&canonical)
            .map_err(|err| if self.root.is_some() { refused() } else { unreadable(err) })?;
        let metadata = file.metadata().map_err(unreadable)?;
        if !metadata.is_file() {
            return Err(refused());
        }
        Ok((file, metadata.len()))
    }
}

/// Opens `path` read-only without following a final symlink and without blocking (a FIFO with no writer would
/// otherwise block the open).
#[cfg(unix)]
fn open_no_follow_no_block(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path)
}

#[cfg(not(unix))]
fn open_no_follow_no_block(path: &Path) -> io::Result<File> {
    File::open(path)
}

/// The only directory tree that `LoadLoraAdapter` requests may read from.
#[derive(Clone, Debug)]
pub struct AdapterRoot {
    root: PathBuf,
    /// The tree is on this machine: paths are checked on disk. Otherwise it is the workers' (a fleet's coordinator
    /// need not hold the files) and paths are checked by their components only.
    on_disk: bool,
}

impl AdapterRoot {
    /// Opens `root`, which must be an existing directory.
    pub fn new(root: impl AsRef<Path>) -> io::Result<Self> {
        let root = std::fs::canonicalize(root.as_ref())?;
        if !root.is_dir() {
            return Err(io::Error::new(io::ErrorKind::NotADirectory, format!("{} is not a directory", root.display())));
        }
        Ok(Self { root, on_disk: true })
    }

    /// A root that lives on a fleet's workers, not necessarily on this machine: `root` must be absolute, and nothing
    /// is read here. [`AdapterRoot::resolve`] then checks paths by their components alone: relative paths are taken
    /// from the root, `..` is refused anywhere, and an absolute path must lie under the root. The workers open the
    /// files (and apply their own checks).
    pub fn remote(root: impl AsRef<Path>) -> io::Result<Self> {
        let root = root.as_ref();
        if !root.is_absolute() || has_parent_component(root) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not an absolute path without `..`", root.display()),
            ));
        }
        Ok(Self { root: normalized(root), on_disk: false })
    }

    /// The root directory (canonical).
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Resolves a requested path (relative paths are taken from the root) to a directory inside the root, following
    /// symlinks before checking. Errors name the `path` field, and say the same for a path that does not exist, one
    /// outside the root and one that is not a directory, so a caller learns nothing about paths outside the root.
    pub async fn resolve(&self, requested: &str) -> Result<AdapterSource, CoreError> {
        if requested.is_empty() {
            return Err(CoreError::invalid(Field::Path, "must not be empty"));
        }
        let not_inside = || {
            CoreError::invalid(
                Field::Path,
                format!("{requested:?} is not an adapter directory inside the adapter root"),
            )
        };
        if !self.on_disk {
            let requested = Path::new(requested);
            let joined = normalized(&self.root.join(requested));
            if has_parent_component(requested) || !joined.starts_with(&self.root) {
                return Err(not_inside());
            }
            return Ok(AdapterSource { dir: joined, root: Some(self.root.clone()), pushed: None, prepared: None });
        }
        let canonical = tokio::fs::canonicalize(self.root.join(requested)).await.map_err(|_| not_inside())?;
        if !canonical.starts_with(&self.root) || !tokio::fs::metadata(&canonical).await.is_ok_and(|m| m.is_dir()) {
            return Err(not_inside());
        }
        Ok(AdapterSource { dir: canonical, root: Some(self.root.clone()), pushed: None, prepared: None })
    }
}

/// Whether `path` has a `..` component.
fn has_parent_component(path: &Path) -> bool {
    path.components().any(|part| matches!(part, std::path::Component::ParentDir))
}

/// `path` without `.` components or a trailing separator.
fn normalized(path: &Path) -> PathBuf {
    path.components().filter(|part| !matches!(part, std::path::Component::CurDir)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `base/root/meow/` (an adapter directory with a config file) and `base/outside/` (with a file), for tests.
    fn temp_tree() -> (tempfile::TempDir, AdapterRoot) {
        let base = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(base.path().join("root/meow")).expect("mkdir");
        std::fs::create_dir_all(base.path().join("outside")).expect("mkdir");
        std::fs::write(base.path().join("root/meow/adapter_config.json"), "{}").expect("write");
        std::fs::write(base.path().join("outside/secret.json"), "{}").expect("write");
        let root = AdapterRoot::new(base.path().join("root")).expect("root");
        (base, root)
    }

    #[tokio::test]
    async fn a_remote_root_checks_paths_by_their_components_without_touching_the_disk() {
        let root = AdapterRoot::remote("/no/such/dir/adapters/").expect("absolute");
        assert_eq!(root.path(), Path::new("/no/such/dir/adapters"));
        let resolved = |path: &str| {
            let root = root.clone();
            let path = path.to_owned();
            async move { root.resolve(&path).await.map(|source| source.dir().to_owned()) }
        };
        assert_eq!(resolved("meow/step-3").await.expect("inside"), Path::new("/no/such/dir/adapters/meow/step-3"));
        assert_eq!(resolved("./meow").await.expect("inside"), Path::new("/no/such/dir/adapters/meow"));
        assert_eq!(
            resolved("/no/such/dir/adapters/woof").await.expect("inside"),
            Path::new("/no/such/dir/adapters/woof")
        );
        for outside in ["../secret", "meow/../../x", "/etc", "/no/such/dir/adapters-2/meow", ""] {
            let err = resolved(outside).await.expect_err(outside);
            assert!(err.to_string().starts_with("path"), "{outside}: {err}");
        }
        assert!(AdapterRoot::remote("relative/root").is_err());
        assert!(AdapterRoot::remote("/a/../b").is_err());
    }

    #[tokio::test]
    async fn paths_inside_the_root_resolve_and_their_regular_files_open() {
        let (base, root) = temp_tree();
        let source = root.resolve("meow").await.expect("relative path");
        assert!(source.dir().ends_with("root/meow"));
        assert_eq!(source.confined_to(), Some(root.path()));
        let (_, len) = source.open_file("adapter_config.json").expect("a regular file opens");
        let gone = AdapterSource::trusted(base.path().join("no-such-adapter"));
        let err = gone.open_file("adapter_config.json").expect_err("no directory");
        let text = err.to_string();
        assert!(text.contains("no-such-adapter does not exist") && !text.contains("adapter_config"), "{text}");
        let err = source.open_file("adapter_model.safetensors").expect_err("no weights file");
        assert_eq!(err.to_string(), "adapter_model.safetensors is missing", "the directory exists: name the file");
        assert_eq!(len, 2);
        let absolute = base.path().join("root/meow");
        assert!(root.resolve(absolute.to_str().expect("utf8")).await.is_ok());
    }

    #[tokio::test]
    async fn escapes_and_symlinks_out_are_refused_with_one_message_naming_the_field() {
        let (base, root) = temp_tree();
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(base.path().join("outside"), base.path().join("root/sneaky")).expect("symlink");
            std::os::unix::fs::symlink(base.path().join("nowhere"), base.path().join("root/dangling"))
                .expect("symlink");
        }
        let outside = base.path().join("outside");
        let missing_outside = base.path().join("missing");
        let mut refused = vec![
            "../outside",
            "../missing",
            "meow/../../outside",
            outside.to_str().expect("utf8"),
            missing_outside.to_str().expect("utf8"),
            "missing",
            "meow/adapter_config.json",
        ];
        if cfg!(unix) {
            refused.extend(["sneaky", "dangling"]);
        }
        for path in refused {
            let err = root.resolve(path).await.expect_err(path);
            assert_eq!(err.to_string(), format!("path: {path:?} is not an adapter directory inside the adapter root"));
        }
        assert_eq!(root.resolve("").await.expect_err("empty").to_string(), "path: must not be empty");
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn files_linked_out_of_the_root_fifos_and_devices_are_refused_without_blocking() {
        let (base, root) = temp_tree();
        let meow = base.path().join("root/meow");
        std::os::unix::fs::symlink(base.path().join("outside/secret.json"), meow.join("escape.json")).expect("link");
        std::os::unix::fs::symlink(base.path().join("outside/gone.json"), meow.join("dangling.json")).expect("link");
        std::os::unix::fs::symlink("/dev/zero", meow.join("zero.bin")).expect("link");
        std::os::unix::fs::symlink("adapter_config.json", meow.join("inside.json")).expect("link");
        let made = std::process::Command::new("mkfifo").arg(meow.join("fifo.bin")).status().expect("mkfifo runs");
        assert!(made.success());
        std::fs::create_dir(meow.join("dir.bin")).expect("mkdir");

        let source = root.resolve("meow").await.expect("resolves");
        for name in ["escape.json", "dangling.json", "zero.bin", "fifo.bin", "dir.bin"] {
            let err = source.open_file(name).expect_err(name);
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{name}");
            assert_eq!(err.to_string(), format!("{name} is not a regular file inside the adapter root"));
        }
        assert!(source.open_file("inside.json").is_ok(), "a link that stays inside the root is fine");

        // An operator's directory may link anywhere (a Hugging Face cache does), but only to regular files.
        let trusted = AdapterSource::trusted(&meow);
        assert!(trusted.open_file("escape.json").is_ok());
        for name in ["zero.bin", "fifo.bin"] {
            assert_eq!(trusted.open_file(name).expect_err(name).to_string(), format!("{name} is not a regular file"));
        }
        assert_eq!(trusted.open_file("absent.json").expect_err("absent").to_string(), "absent.json is missing");
        assert_eq!(source.open_file("absent.json").expect_err("absent").to_string(), "absent.json is missing");
    }
}
