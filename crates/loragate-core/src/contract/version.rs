//! The words of adapter versions: a version's content identity (the SHA-256 of its `adapter_model.safetensors`),
//! where it came from, what a retained version is, and which versions a sampling request will take.

use std::fmt;
use std::path::PathBuf;

use super::error::{CoreError, Field};
use super::ids::AdapterVersion;

/// A SHA-256 digest: the content identity of an adapter version's `adapter_model.safetensors`. Written as 64
/// lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sha256(pub [u8; 32]);

impl Sha256 {
    /// Parses 64 hex digits (either case) given for `field`.
    pub fn parse_hex(raw: &str, field: Field) -> Result<Self, CoreError> {
        let invalid = || CoreError::invalid(field, format!("must be 64 hex digits (a SHA-256), got {raw:?}"));
        if raw.len() != 64 {
            return Err(invalid());
        }
        let mut digest = [0u8; 32];
        for (byte, pair) in digest.iter_mut().zip(raw.as_bytes().chunks_exact(2)) {
            let pair = std::str::from_utf8(pair).map_err(|_| invalid())?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| invalid())?;
        }
        Ok(Self(digest))
    }

    /// The digest as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256({self})")
    }
}

/// Where a version's weights came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionOrigin {
    /// Loaded from a directory (a request's path inside the adapter root, or the operator's flag).
    Path(PathBuf),
    /// Pushed over the network (`PushLoraAdapter`, `PUT /v1/lora_adapters/{name}`) into the adapter store.
    Push,
}

impl fmt::Display for VersionOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Path(path) => write!(f, "{}", path.display()),
            Self::Push => f.write_str("push"),
        }
    }
}

/// One version of an adapter that is loaded and servable: the current one, or an older one kept for exact pins
/// (`--retain-versions`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionInfo {
    /// The version.
    pub version: AdapterVersion,
    /// The SHA-256 of its `adapter_model.safetensors`; `None` where this server cannot read the files (a fleet whose
    /// adapter root lives on its workers).
    pub sha256: Option<Sha256>,
    /// The size of its `adapter_model.safetensors` in bytes, when known.
    pub bytes: Option<u64>,
    /// Where it came from.
    pub origin: VersionOrigin,
}

/// Which versions of its adapter a sampling request takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum VersionWanted {
    /// Whatever version is current when it is admitted.
    #[default]
    Any,
    /// The current version, once it is at least this one (`min_lora_version`): held at the gate until then.
    AtLeast(AdapterVersion),
    /// Exactly this version (`NAME@V`): served at once while it is current or retained, held while it is newer than
    /// the current one, refused once it was released.
    Exactly(AdapterVersion),
}

impl VersionWanted {
    /// Whether `version` serves a request that wants `self`.
    pub fn accepts(self, version: AdapterVersion) -> bool {
        match self {
            Self::Any => true,
            Self::AtLeast(least) => version >= least,
            Self::Exactly(exact) => version == exact,
        }
    }

    /// The oldest current version the request can wait for (`None`: any).
    pub fn least(self) -> Option<AdapterVersion> {
        match self {
            Self::Any => None,
            Self::AtLeast(version) | Self::Exactly(version) => Some(version),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_print_as_lowercase_hex_and_parse_back_in_either_case() {
        let digest = Sha256([0xab; 32]);
        assert_eq!(digest.to_hex(), "ab".repeat(32));
        assert_eq!(Sha256::parse_hex(&"AB".repeat(32), Field::Sha256).ok(), Some(digest));
        for bad in ["", "ab", &"zz".repeat(32), &"ab".repeat(33), &"é".repeat(32)] {
            match Sha256::parse_hex(bad, Field::Sha256) {
                Err(CoreError::InvalidArgument { field: Field::Sha256, .. }) => {}
                other => panic!("{bad:?} should be refused naming sha256, got {other:?}"),
            }
        }
    }

    #[test]
    fn wanted_versions_accept_what_they_say() {
        let (v2, v3) = (AdapterVersion(2), AdapterVersion(3));
        assert!(VersionWanted::Any.accepts(v2));
        assert!(VersionWanted::AtLeast(v2).accepts(v3) && !VersionWanted::AtLeast(v3).accepts(v2));
        assert!(VersionWanted::Exactly(v3).accepts(v3) && !VersionWanted::Exactly(v3).accepts(v2));
        assert_eq!(VersionWanted::Exactly(v3).least(), Some(v3));
        assert_eq!(VersionWanted::Any.least(), None);
    }
}
