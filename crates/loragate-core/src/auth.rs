//! Who may do what: API keys, the admin key and tenant keys, decided here once for every front.
//!
//! Authentication is off by default ([`Keyring::open`]): every caller is [`Principal::Anyone`]. Configuring any key
//! turns it on; then every call except health and metrics must present a known key, which becomes a
//! [`Principal`]:
//!
//! - the **API key** (`--api-key`, `LORAGATE_API_KEY`) may sample (and long-poll pause state, list adapters);
//! - the **admin key** (`--admin-key`, `LORAGATE_ADMIN_KEY`) may do everything: pause, resume, load, unload, fleet
//!   changes, and sample;
//! - a **tenant key** (`--tenant-keys FILE`) may sample only its own adapters (names, or prefix patterns such as
//!   `team-a/*`) and, with `"control": true`, pause, resume, load and unload them, loading only from its own
//!   directories under the adapter root (`"paths"`, by default its adapter patterns read as directories; see
//!   [`PathGrant`]). Tenant keys may also sample the base model, which belongs to nobody and whose weights no tenant
//!   can change.
//!
//! Fronts only extract the presented key (`authorization: Bearer KEY` on HTTP and gRPC; other schemes such as
//! Tinker's `X-API-Key` pass the raw key to [`Keyring::authenticate`]) and map the errors:
//! [`CoreError::Unauthenticated`] (401 / `UNAUTHENTICATED`) and [`CoreError::PermissionDenied`] (403 /
//! `PERMISSION_DENIED`). A front checks [`Principal::may`] before reading a request, and
//! [`Principal::authorize`] once it knows the adapter the request is for; the coordinator checks a requested adapter
//! path with [`Principal::check_adapter_path`] ([`CoreError::PathNotPermitted`], 403 / `PERMISSION_DENIED`).
//!
//! The tenant file is JSON, an object from key to grant:
//!
//! ```json
//! {"k-team-a": {"adapters": ["team-a/*"], "control": true, "paths": ["team-a/", "shared/base-inits"]},
//!  "k-rollouts": {"adapters": ["team-a/policy", "team-b/policy"]}}
//! ```
//!
//! Keys are compared in constant time against every configured key, so response timing tells nothing about how
//! much of a guess was right. Keys never appear in `Debug` output or error messages.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use crate::contract::{Action, AdapterKey, AdapterName, CoreError, Field};
use serde::Deserialize;

mod paths;

pub use paths::{PathGrant, PathPattern};

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 512;

/// A secret key: printable ASCII without spaces (so that it fits in a header), at most [`MAX_KEY_LEN`] bytes.
/// Its `Debug` output is redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(Arc<str>);

impl Key {
    /// Checks a key as configured by the operator.
    pub fn parse(raw: &str) -> Result<Self, KeyConfigError> {
        if raw.is_empty() {
            return Err(KeyConfigError::BadKey("a key must not be empty".into()));
        }
        if raw.len() > MAX_KEY_LEN {
            return Err(KeyConfigError::BadKey(format!(
                "a key is {} bytes long, the limit is {MAX_KEY_LEN}",
                raw.len()
            )));
        }
        if !raw.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(KeyConfigError::BadKey("a key must be printable ASCII without spaces".into()));
        }
        Ok(Self(raw.into()))
    }

    /// The key itself, to present it to another server (a fleet coordinator's `--worker-key`). Never log it.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }
}

impl FromStr for Key {
    type Err = KeyConfigError;

    fn from_str(raw: &str) -> Result<Self, KeyConfigError> {
        Self::parse(raw)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

/// Which adapters a tenant key covers: one name, or every name starting with a prefix (`team-a/*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdapterPattern {
    /// Exactly this adapter.
    Exact(AdapterName),
    /// Every adapter whose name starts with this (`*` alone: every adapter).
    Prefix(String),
}

impl AdapterPattern {
    /// Parses `name` or `prefix*`; a `*` anywhere but at the end is refused.
    pub fn parse(raw: &str) -> Result<Self, KeyConfigError> {
        let bad = |why: &str| KeyConfigError::BadPattern { pattern: raw.to_owned(), why: why.to_owned() };
        match raw.strip_suffix('*') {
            Some(prefix) if prefix.contains('*') => Err(bad("only a trailing * is supported")),
            Some(prefix) => {
                if prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    return Err(bad("adapter names have no whitespace or control characters"));
                }
                Ok(Self::Prefix(prefix.to_owned()))
            }
            None if raw.contains('*') => Err(bad("only a trailing * is supported")),
            None => AdapterName::parse(raw).map(Self::Exact).map_err(|err| bad(&err.to_string())),
        }
    }

    /// Whether `name` is covered.
    pub fn matches(&self, name: &AdapterName) -> bool {
        match self {
            Self::Exact(exact) => exact == name,
            Self::Prefix(prefix) => name.as_str().starts_with(prefix.as_str()),
        }
    }
}

/// What one tenant key grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    /// The adapters it may sample (and control, with `control`).
    pub adapters: Vec<AdapterPattern>,
    /// Whether it may pause, resume, load and unload its adapters.
    pub control: bool,
    /// The directories under the adapter root it may load adapters from.
    pub paths: PathGrant,
    /// The scope its requests' cached prefixes are confined to (`tenant-N`, by the key's place in the file): two
    /// tenants never share cached keys and values, since prefix-cache timing would let one learn the other's prompts.
    scope: Arc<str>,
}

impl Tenant {
    fn covers(&self, key: &AdapterKey) -> bool {
        match key {
            AdapterKey::Base => false,
            AdapterKey::Lora(name) => self.adapters.iter().any(|pattern| pattern.matches(name)),
        }
    }
}

/// One tenant entry as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    adapters: Vec<String>,
    #[serde(default)]
    control: bool,
    /// Directories under the adapter root it may load from; absent: its adapter patterns, read as directories.
    #[serde(default)]
    paths: Option<Vec<String>>,
}

/// The tenant keys of a `--tenant-keys` file, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantKeys(Vec<(Key, Tenant)>);

impl TenantKeys {
    /// Parses the JSON object `{"KEY": {"adapters": [...], "control": bool, "paths": [...]}, ...}`. Unknown fields
    /// are refused, so a misspelt `control` cannot silently grant less (or more) than meant. Without `paths` a tenant
    /// may load from the directories its `adapters` patterns spell (`meow`: `ROOT/meow` and below; `team-a/*`:
    /// `ROOT/team-a/...`).
    pub fn parse(json: &str) -> Result<Self, KeyConfigError> {
        let entries: std::collections::BTreeMap<String, TenantEntry> =
            serde_json::from_str(json).map_err(|err| KeyConfigError::BadTenantFile(err.to_string()))?;
        let mut tenants = Vec::with_capacity(entries.len());
        for (index, (raw_key, entry)) in entries.into_iter().enumerate() {
            let key = Key::parse(&raw_key)?;
            let adapters =
                entry.adapters.iter().map(|raw| AdapterPattern::parse(raw)).collect::<Result<Vec<_>, _>>()?;
            let paths = match &entry.paths {
                Some(raw) => {
                    PathGrant::new(raw.iter().map(|raw| PathPattern::parse(raw)).collect::<Result<Vec<_>, _>>()?)
                }
                None => PathGrant::from_adapter_patterns(entry.adapters.iter().map(String::as_str)),
            };
            let scope = format!("tenant-{index}").into();
            tenants.push((key, Tenant { adapters, control: entry.control, paths, scope }));
        }
        Ok(Self(tenants))
    }

    /// Reads and parses a tenant file.
    pub fn read(path: &Path) -> Result<Self, KeyConfigError> {
        let json = std::fs::read_to_string(path)
            .map_err(|err| KeyConfigError::BadTenantFile(format!("{}: {err}", path.display())))?;
        Self::parse(&json)
    }

    /// How many tenant keys there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Why the configured keys cannot be used (a start-up error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyConfigError {
    /// A key is malformed (its value is never shown).
    #[error("{0}")]
    BadKey(String),
    /// An adapter pattern of the tenant file is malformed.
    #[error("adapter pattern {pattern:?}: {why}")]
    BadPattern {
        /// The pattern.
        pattern: String,
        /// What is wrong with it.
        why: String,
    },
    /// The tenant file cannot be read or is not the expected JSON.
    #[error("tenant keys: {0}")]
    BadTenantFile(String),
    /// The same key is configured twice (its value is never shown).
    #[error("the same key is configured twice ({0})")]
    DuplicateKey(&'static str),
}

/// Who a caller is, once their key was checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// Authentication is off: anyone may do anything.
    Anyone,
    /// The admin key: may do everything.
    Admin,
    /// The API key: may sample.
    Sampler,
    /// A tenant key: may sample (and, with `control`, control) its own adapters.
    Tenant(Arc<Tenant>),
}

impl Principal {
    /// Whether this principal may do `action` on at least some adapter (checked before a request is read; the
    /// adapter is checked with [`Principal::authorize`] once known).
    pub fn may(&self, action: Action) -> Result<(), CoreError> {
        let allowed = match (self, action) {
            (Self::Anyone | Self::Admin, _) => true,
            (Self::Sampler, action) => action == Action::Sample,
            (Self::Tenant(tenant), action) => match action {
                Action::Sample => true,
                Action::Control => tenant.control,
                Action::Admin => false,
            },
        };
        if allowed { Ok(()) } else { Err(CoreError::PermissionDenied { action, adapter: None }) }
    }

    /// Whether this principal may do `action` on `adapter`.
    pub fn authorize(&self, action: Action, adapter: &AdapterKey) -> Result<(), CoreError> {
        self.may(action)?;
        let allowed = match self {
            Self::Tenant(tenant) => match action {
                // The base model belongs to nobody: any tenant may sample it, none may control it.
                Action::Sample => *adapter == AdapterKey::Base || tenant.covers(adapter),
                Action::Control | Action::Admin => tenant.covers(adapter),
            },
            Self::Anyone | Self::Admin | Self::Sampler => true,
        };
        if allowed { Ok(()) } else { Err(CoreError::PermissionDenied { action, adapter: Some(adapter.clone()) }) }
    }

    /// Whether this principal may load adapter weights from `path` (relative to the adapter root `root`, or absolute
    /// under it): every principal but a tenant key may load from anywhere in the root; a tenant key only from its own
    /// directories ([`PathGrant`]). Decided by the path's spelling: the coordinator checks the path as requested,
    /// before looking at the disk (so the answer says nothing about what exists outside the tenant's directories),
    /// and again once resolved (so a symlink cannot lead out of them). The refusal names the `path` field and the
    /// tenant's own directories, nothing else.
    pub fn check_adapter_path(&self, root: &Path, path: &Path, requested: &str) -> Result<(), CoreError> {
        match self {
            Self::Tenant(tenant) if !tenant.paths.permits(root, path) => Err(CoreError::PathNotPermitted {
                field: Field::Path,
                requested: requested.to_owned(),
                allowed: tenant.paths.describe(),
            }),
            Self::Anyone | Self::Admin | Self::Sampler | Self::Tenant(_) => Ok(()),
        }
    }

    /// Whether `self` and `other` presented the same key: the same tenant key (two tenant keys with the same grant are
    /// different callers), or both the API key, or both the admin key. With authentication off every caller is the
    /// same. What one caller created (a Tinker future) is readable only by the same key.
    pub fn is_same_key(&self, other: &Principal) -> bool {
        match (self, other) {
            (Self::Anyone, Self::Anyone) | (Self::Admin, Self::Admin) | (Self::Sampler, Self::Sampler) => true,
            (Self::Tenant(one), Self::Tenant(another)) => Arc::ptr_eq(one, another),
            _ => false,
        }
    }

    /// The scope this caller's requests' cached prefixes are confined to ([`SampleRequest::scope_cache_to`]): its
    /// own for a tenant key, the shared one (`None`) for every other caller.
    ///
    /// [`SampleRequest::scope_cache_to`]: crate::SampleRequest::scope_cache_to
    pub fn cache_scope(&self) -> Option<Arc<str>> {
        match self {
            Self::Tenant(tenant) => Some(Arc::clone(&tenant.scope)),
            Self::Anyone | Self::Admin | Self::Sampler => None,
        }
    }

    /// Whether `adapter` is shown to this principal in listings (the adapters it may sample).
    pub fn may_see(&self, adapter: &AdapterKey) -> bool {
        self.authorize(Action::Sample, adapter).is_ok()
    }
}

/// The configured keys. Cheap to clone. Empty (authentication off) unless some key is configured.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: Arc<[(Key, Principal)]>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring").field("keys", &self.keys.len()).finish()
    }
}

impl Keyring {
    /// No keys: authentication off, everyone is [`Principal::Anyone`].
    pub fn open() -> Self {
        Self::default()
    }

    /// The keyring of `--api-key`, `--admin-key` and `--tenant-keys`. Any key turns authentication on.
    pub fn new(api_key: Option<Key>, admin_key: Option<Key>, tenants: TenantKeys) -> Result<Self, KeyConfigError> {
        let mut keys: Vec<(Key, Principal)> = Vec::new();
        keys.extend(admin_key.map(|key| (key, Principal::Admin)));
        keys.extend(api_key.map(|key| (key, Principal::Sampler)));
        keys.extend(tenants.0.into_iter().map(|(key, tenant)| (key, Principal::Tenant(Arc::new(tenant)))));
        for (index, (key, _)) in keys.iter().enumerate() {
            if keys[..index].iter().any(|(earlier, _)| earlier == key) {
                return Err(KeyConfigError::DuplicateKey("between --api-key, --admin-key and --tenant-keys"));
            }
        }
        Ok(Self { keys: keys.into() })
    }

    /// Whether authentication is on (some key is configured).
    pub fn is_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The principal of a presented key (`None`: the caller presented none). With authentication off everyone is
    /// [`Principal::Anyone`], key or not.
    pub fn authenticate(&self, presented: Option<&str>) -> Result<Principal, CoreError> {
        if !self.is_enabled() {
            return Ok(Principal::Anyone);
        }
        let presented = presented.ok_or(CoreError::Unauthenticated("no API key was presented"))?;
        // Compare with every key, without stopping at a match, in time independent of where bytes differ.
        let mut found = None;
        for (key, principal) in self.keys.iter() {
            if constant_time_eq(key.0.as_bytes(), presented.as_bytes()) {
                found = Some(principal);
            }
        }
        found.cloned().ok_or(CoreError::Unauthenticated("the API key is not valid"))
    }
}

/// The key of an `Authorization` header value (or gRPC `authorization` metadata) of the form `Bearer KEY`; the
/// scheme is case-insensitive.
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, key) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim_start()).filter(|key| !key.is_empty())
}

/// Equality whose time depends only on the lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests;
