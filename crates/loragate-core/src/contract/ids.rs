//! Validated identifiers: adapter names and keys, request ids, adapter versions.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::{CoreError, Field};

/// The longest adapter name accepted, in bytes.
pub const MAX_ADAPTER_NAME_LEN: usize = 128;
/// The longest caller-supplied request id accepted, in bytes.
pub const MAX_REQUEST_ID_LEN: usize = 256;

/// The name of a loaded LoRA adapter: non-empty, at most [`MAX_ADAPTER_NAME_LEN`] bytes, no whitespace or control
/// characters. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdapterName(Arc<str>);

impl AdapterName {
    /// Parses a control-RPC `lora_name`, which must name an adapter (the base model cannot be paused or loaded).
    pub fn parse(raw: &str) -> Result<Self, CoreError> {
        if raw.is_empty() {
            return Err(CoreError::invalid(Field::LoraName, "must not be empty"));
        }
        if raw.len() > MAX_ADAPTER_NAME_LEN {
            return Err(CoreError::invalid(
                Field::LoraName,
                format!("is {} bytes long, the limit is {MAX_ADAPTER_NAME_LEN}", raw.len()),
            ));
        }
        if let Some(bad) = raw.chars().find(|c| c.is_whitespace() || c.is_control()) {
            return Err(CoreError::invalid(
                Field::LoraName,
                format!("must not contain whitespace or control characters (found {bad:?})"),
            ));
        }
        Ok(Self(raw.into()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AdapterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for AdapterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// What a sampling request runs on: the base model or one adapter. The base model goes through the same gate and
/// registry as any adapter; it is simply never paused by the control RPCs.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AdapterKey {
    /// The base model (an empty `lora_name`).
    Base,
    /// A LoRA adapter.
    Lora(AdapterName),
}

impl AdapterKey {
    /// Parses a sampling request's `lora_name`: empty addresses the base model.
    pub fn parse(raw: &str) -> Result<Self, CoreError> {
        if raw.is_empty() { Ok(Self::Base) } else { AdapterName::parse(raw).map(Self::Lora) }
    }

    /// The adapter's name, or `None` for the base model.
    pub fn adapter_name(&self) -> Option<&AdapterName> {
        match self {
            Self::Base => None,
            Self::Lora(name) => Some(name),
        }
    }

    /// The wire form: the adapter's name, or the empty string for the base model.
    pub fn as_wire_str(&self) -> &str {
        self.adapter_name().map_or("", AdapterName::as_str)
    }
}

impl From<AdapterName> for AdapterKey {
    fn from(name: AdapterName) -> Self {
        Self::Lora(name)
    }
}

impl fmt::Display for AdapterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Base => f.write_str("the base model"),
            Self::Lora(name) => write!(f, "adapter '{name}'"),
        }
    }
}

impl fmt::Debug for AdapterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Base => f.write_str("Base"),
            Self::Lora(name) => write!(f, "Lora({name:?})"),
        }
    }
}

/// The weights version of an adapter: 1 after its first load, +1 on every later load. The base model is version 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdapterVersion(pub u64);

impl AdapterVersion {
    /// The version of the base model, and of an adapter before its first load.
    pub const BASE: Self = Self(0);

    /// The version after one more load.
    pub fn next(self) -> Self {
        Self(self.0 + 1)
    }
}

impl fmt::Display for AdapterVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// A request's id as its caller knows it: supplied by the caller, or made by the server. Ids need not be unique
/// across callers; the registry keys requests by its own tickets.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RequestId(Arc<str>);

impl RequestId {
    /// Parses a caller-supplied id; an empty one is replaced by a fresh server-made id.
    pub fn parse_or_generate(raw: &str) -> Result<Self, CoreError> {
        if raw.is_empty() {
            return Ok(Self::generate());
        }
        if raw.len() > MAX_REQUEST_ID_LEN {
            return Err(CoreError::invalid(
                Field::RequestId,
                format!("is {} bytes long, the limit is {MAX_REQUEST_ID_LEN}", raw.len()),
            ));
        }
        if raw.chars().any(char::is_control) {
            return Err(CoreError::invalid(Field::RequestId, "must not contain control characters"));
        }
        Ok(Self(raw.into()))
    }

    /// A fresh id, unique within this process and unlikely to collide across processes.
    pub fn generate() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        static PROCESS_TAG: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
        let tag = PROCESS_TAG.get_or_init(rand::random::<u32>);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self(format!("lg-{tag:08x}-{n}").into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The engine-side id of attempt `attempt` at continuing sequence `sequence` of this request (engines and
    /// workers need an id per engine request to abort it).
    pub(crate) fn continuation(&self, sequence: u32, attempt: u32) -> Self {
        Self(format!("{}~{sequence}.{attempt}", self.0).into())
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapter_names_are_checked_and_name_the_field() {
        assert_eq!(AdapterName::parse("meow").map(|n| n.to_string()).ok(), Some("meow".into()));
        assert!(AdapterName::parse("tenant/run-3@step42").is_ok());
        for bad in ["", "has space", "tab\t", &"x".repeat(MAX_ADAPTER_NAME_LEN + 1)] {
            let err = AdapterName::parse(bad).expect_err(bad);
            assert!(err.to_string().starts_with("lora_name"), "{err}");
        }
    }

    #[test]
    fn empty_lora_name_addresses_the_base_model() {
        assert_eq!(AdapterKey::parse("").ok(), Some(AdapterKey::Base));
        assert_eq!(AdapterKey::parse("").map(|k| k.as_wire_str().to_owned()).ok(), Some(String::new()));
        assert!(matches!(AdapterKey::parse("woof"), Ok(AdapterKey::Lora(_))));
    }

    #[test]
    fn request_ids_are_kept_or_generated_uniquely() {
        assert_eq!(RequestId::parse_or_generate("mine").map(|r| r.to_string()).ok(), Some("mine".into()));
        let a = RequestId::generate();
        let b = RequestId::generate();
        assert_ne!(a, b);
        assert!(RequestId::parse_or_generate("bad\n").is_err());
    }
}
