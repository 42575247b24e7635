//! Block hashes for prefix reuse: a full block is named by a hash chain over what its keys and values depend on —
//! the adapter's name **and version**, the request's cache salt, and every token up to the block's end. Two blocks
//! with the same hash hold the same keys and values (up to float rounding), whoever computed them; a block computed
//! under another adapter version, or another salt, has another hash and is never found.
//!
//! The hashes are 128 bits of two SipHash instances keyed at random once per process (std's `RandomState`), so a
//! client cannot craft token blocks that collide with another tenant's (the keys are secret and the cache is never
//! persisted), and accidental collisions are out of reach (2⁻¹²⁸ per pair).

use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::OnceLock;

/// The hash of a block's keys and values: its prefix chain's, from the root of its sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BlockHash(u128);

/// The two keyed hashers of this process.
fn hashers() -> &'static [RandomState; 2] {
    static HASHERS: OnceLock<[RandomState; 2]> = OnceLock::new();
    HASHERS.get_or_init(|| [RandomState::new(), RandomState::new()])
}

/// 128 bits of `value` under the process's two keys.
fn hash128(value: &impl Hash) -> BlockHash {
    let [low, high] = hashers().each_ref().map(|state| state.hash_one(value));
    BlockHash(u128::from(high) << 64 | u128::from(low))
}

impl BlockHash {
    /// The root of every chain of sequences whose keys and values come from `adapter` (empty for the base model)
    /// at `version`, for callers of `scope` (a tenant) under `salt`: what a block's hash starts from.
    pub(crate) fn root(adapter: &str, version: u64, scope: Option<&str>, salt: Option<&str>) -> Self {
        hash128(&("loragate-kv-root", adapter, version, scope, salt))
    }

    /// The hash of the block holding `tokens` right after the block (or root) hashed `self`.
    pub(crate) fn then(self, tokens: &[u32]) -> Self {
        hash128(&(self.0, tokens))
    }

    /// The hashes of the full blocks of `tokens` (`tokens.len() / block_size` of them), from `root`.
    pub(crate) fn chain(root: Self, tokens: &[u32], block_size: usize) -> Vec<Self> {
        let mut parent = root;
        tokens
            .chunks_exact(block_size)
            .map(|block| {
                parent = parent.then(block);
                parent
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_depends_on_the_adapter_its_version_the_salt_and_every_earlier_token() {
        let tokens: Vec<u32> = (0..40).collect();
        let root = BlockHash::root("meow", 1, None, None);
        let chain = BlockHash::chain(root, &tokens, 16);
        assert_eq!(chain.len(), 2, "only full blocks");
        assert_eq!(chain, BlockHash::chain(BlockHash::root("meow", 1, None, None), &tokens[..33], 16), "deterministic");
        for other in [
            BlockHash::root("meow", 2, None, None),
            BlockHash::root("woof", 1, None, None),
            BlockHash::root("meow", 1, None, Some("salt")),
            BlockHash::root("meow", 1, Some("tenant-0"), None),
            BlockHash::root("", 0, None, None),
        ] {
            let other = BlockHash::chain(other, &tokens, 16);
            assert!(other.iter().zip(&chain).all(|(a, b)| a != b), "a different root changes every block");
        }
        assert_ne!(BlockHash::root("meow", 1, None, Some("a")), BlockHash::root("meow", 1, None, Some("b")));
        assert_ne!(
            BlockHash::root("meow", 1, Some("tenant-0"), Some("a")),
            BlockHash::root("meow", 1, Some("tenant-1"), Some("a")),
            "two tenants with one salt"
        );
        let mut changed = tokens.clone();
        changed[3] = 99;
        let changed = BlockHash::chain(root, &changed, 16);
        assert!(changed[0] != chain[0] && changed[1] != chain[1], "a token changes its block and every later one");
    }
}
