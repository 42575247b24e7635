//! Where `loragate serve` keeps its control-plane state (`--state-dir`): by default a directory per served model
//! under the user's state directory, `$XDG_STATE_HOME/loragate/<served-name>` or
//! `~/.local/state/loragate/<served-name>`; `--state-dir none` keeps it in memory only; `--state etcd://…` shares
//! it with the other replicas through etcd.

use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use loragate_core::{MemoryStore, StateError, StateStore};
use loragate_etcd::{EtcdConfig, EtcdStore, EtcdUrl};
use loragate_state::EmbeddedStore;

/// Where the state lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateLocation {
    /// In memory only: nothing survives the process (`--state-dir none`).
    Memory,
    /// The default directory for the served model's name under the user's state directory.
    UserDefault,
    /// This directory.
    Directory(PathBuf),
    /// Shared with the other replicas through etcd (`--state etcd://…`).
    Shared(EtcdUrl),
}

impl StateLocation {
    /// Parses `--state-dir`: `none`, or a directory.
    pub fn parse(raw: &str) -> Result<Self, String> {
        match raw {
            "" => Err("--state-dir needs a directory, or `none`".into()),
            "none" => Ok(Self::Memory),
            dir => Ok(Self::Directory(PathBuf::from(dir))),
        }
    }

    /// The directory this names for a server whose base model is served as `served_name` (`None`: memory only).
    pub fn dir(&self, served_name: &str) -> Result<Option<PathBuf>, StateError> {
        match self {
            Self::Memory | Self::Shared(_) => Ok(None),
            Self::Directory(dir) => Ok(Some(dir.clone())),
            Self::UserDefault => user_state_dir(
                std::env::var_os("XDG_STATE_HOME").map(PathBuf::from),
                std::env::var_os("HOME").map(PathBuf::from),
            )
            .map(|dir| Some(dir.join("loragate").join(file_name(served_name))))
            .ok_or_else(|| {
                StateError::Failed(
                    "no state directory: neither XDG_STATE_HOME nor HOME is set (give --state-dir DIR, or none)".into(),
                )
            }),
        }
    }

    /// Opens the store this names. A shared one registers this replica under a lease of `replica_lease` and waits at
    /// most `ack_timeout` for the other replicas to apply a pause.
    pub async fn open(
        &self,
        served_name: &str,
        replica_lease: Duration,
        ack_timeout: Duration,
    ) -> Result<(Arc<dyn StateStore>, Option<PathBuf>), StateError> {
        if let Self::Shared(url) = self {
            let config = EtcdConfig { replica_ttl: replica_lease, ack_timeout, ..EtcdConfig::new(url.clone()) };
            return Ok((Arc::new(EtcdStore::connect(config).await?), None));
        }
        match self.dir(served_name)? {
            None => Ok((Arc::new(MemoryStore::new()), None)),
            Some(dir) => {
                let store = EmbeddedStore::open(&dir)?;
                Ok((Arc::new(store), Some(dir)))
            }
        }
    }
}

/// `$XDG_STATE_HOME` if set to an absolute path (the XDG rule), else `$HOME/.local/state`.
fn user_state_dir(xdg_state_home: Option<PathBuf>, home: Option<PathBuf>) -> Option<PathBuf> {
    xdg_state_home
        .filter(|dir| dir.is_absolute())
        .or_else(|| home.filter(|home| !home.as_os_str().is_empty()).map(|home| home.join(".local/state")))
}

/// A served name as one directory name: anything but letters, digits, `.`, `_` and `-` becomes `_` (a Hugging Face
/// name like `org/model` is one directory, `org_model`), and a name of dots is `_`.
fn file_name(served_name: &str) -> String {
    let name: String = served_name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .collect();
    if name.is_empty() || name.chars().all(|c| c == '.') { "_".to_owned() } else { name }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_follows_xdg_then_home_and_names_one_directory_per_served_model() {
        let home = Some(PathBuf::from("/home/ada"));
        assert_eq!(user_state_dir(None, home.clone()), Some(PathBuf::from("/home/ada/.local/state")));
        assert_eq!(user_state_dir(Some(PathBuf::from("/xdg")), home.clone()), Some(PathBuf::from("/xdg")));
        assert_eq!(
            user_state_dir(Some(PathBuf::from("relative")), home),
            Some(PathBuf::from("/home/ada/.local/state")),
            "a relative XDG_STATE_HOME is ignored, as the XDG rule says"
        );
        assert_eq!(user_state_dir(None, None), None);
        assert_eq!(file_name("loragate-demo"), "loragate-demo");
        assert_eq!(file_name("org/model v2"), "org_model_v2");
        assert_eq!(file_name(".."), "_");
    }

    #[test]
    fn none_is_memory_and_anything_else_a_directory() {
        assert_eq!(StateLocation::parse("none"), Ok(StateLocation::Memory));
        assert_eq!(StateLocation::parse("/var/lib/lg"), Ok(StateLocation::Directory(PathBuf::from("/var/lib/lg"))));
        assert!(StateLocation::parse("").is_err());
        assert_eq!(StateLocation::Memory.dir("m"), Ok(None));
    }
}
