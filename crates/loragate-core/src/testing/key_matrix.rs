//! The keys of docs/security.md's route × key matrix, shared by each front's test of it: an admin key, an API key,
//! and two tenants owning `team-a/*`, one that may only sample and one with `control`.

use crate::{Key, Keyring, TenantKeys};

/// The keys of the matrix's columns, in order: admin, API, the sampling tenant, the tenant with `control`.
pub const MATRIX_KEYS: [&str; 4] = ["k-admin", "k-api", "k-a-sampler", "k-a-control"];

/// The keyring holding [`MATRIX_KEYS`].
pub fn matrix_keyring() -> Keyring {
    let tenants = TenantKeys::parse(
        r#"{"k-a-sampler": {"adapters": ["team-a/*"]}, "k-a-control": {"adapters": ["team-a/*"], "control": true}}"#,
    )
    .expect("a valid tenant file");
    let key = |raw| Key::parse(raw).expect("key");
    Keyring::new(Some(key("k-api")), Some(key("k-admin")), tenants).expect("distinct keys")
}
