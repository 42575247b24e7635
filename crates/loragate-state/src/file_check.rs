//! What is checked of an existing state file before the storage library opens it: a file that is empty, is not a
//! state file, or is shorter than its own header says (truncated) is refused with a message naming the file and
//! what to do, instead of being taken as a fresh store (an empty one: recorded versions would vanish and be issued
//! again) or reaching the library's own assertions (a truncated one).
//!
//! The header read here is redb's (2.x, pinned in the workspace): its magic number, then little-endian `u32`s for
//! the page size, the pages of a region's header, a full region's data pages, the full regions, and the trailing
//! region's data pages. The file holds one page of super-header, the full regions, then the trailing region.

use std::io::Read;
use std::path::Path;

use loragate_core::state::StateError;

/// redb's magic number, at the start of every file it finished creating.
const MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];
/// The fields read: up to the trailing region's data pages.
const HEADER_BYTES: usize = 32;
/// The page size this version of the library writes (and asserts on open).
const PAGE_SIZE: u64 = 4096;

/// Refuses the state file at `path` if it exists and is empty, foreign or truncated.
pub(crate) fn check(path: &Path) -> Result<(), StateError> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(StateError::Failed(format!("cannot read the state file {}: {err}", path.display()))),
    };
    let len = file
        .metadata()
        .map_err(|err| StateError::Failed(format!("cannot read the state file {}: {err}", path.display())))?
        .len();
    let mut header = [0u8; HEADER_BYTES];
    let read = file.read(&mut header).unwrap_or(0);
    match problem(len, &header[..read]) {
        None => Ok(()),
        Some(problem) => Err(refused(path, &problem)),
    }
}

/// What is wrong with a file of `len` bytes starting with `header`, if anything.
fn problem(len: u64, header: &[u8]) -> Option<String> {
    if len == 0 {
        return Some("it is empty (0 bytes): a state file is never empty, so it was truncated or replaced".into());
    }
    if header.len() < HEADER_BYTES || header[..MAGIC.len()] != MAGIC {
        return Some(format!("it is not a loragate state file, or it was truncated ({len} bytes)"));
    }
    let field = |offset: usize| u64::from(u32::from_le_bytes([0, 1, 2, 3].map(|i| header[offset + i])));
    let (page_size, header_pages, max_data_pages) = (field(12), field(16), field(20));
    let (full_regions, trailing_data_pages) = (field(24), field(28));
    if page_size != PAGE_SIZE {
        return Some(format!("its page size ({page_size}) is not one this version reads"));
    }
    let trailing = if trailing_data_pages > 0 { header_pages + trailing_data_pages } else { 0 };
    let pages =
        full_regions.checked_mul(header_pages + max_data_pages).and_then(|pages| pages.checked_add(1 + trailing));
    match pages.and_then(|pages| pages.checked_mul(page_size)) {
        Some(expected) if len >= expected => None,
        Some(expected) => Some(format!("it is truncated: {len} bytes where its header records {expected}")),
        None => Some("its header is corrupt".into()),
    }
}

/// The refusal of the state file at `path` for `problem`, saying what to do.
fn refused(path: &Path, problem: &str) -> StateError {
    let dir = path.parent().map_or_else(String::new, |dir| dir.display().to_string());
    StateError::Failed(format!(
        "the state file {} cannot be used: {problem}. Starting fresh would issue again the versions it recorded, so \
         loragate does not: restore the file from a backup, or start with --state-dir pointing at another directory \
         (a new one starts an empty state) after moving {dir} aside",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(full_regions: u32, trailing: u32) -> Vec<u8> {
        let mut bytes = MAGIC.to_vec();
        bytes.extend([0, 0, 0]);
        for value in [4096u32, 1, 1000, full_regions, trailing] {
            bytes.extend(value.to_le_bytes());
        }
        bytes
    }

    #[test]
    fn the_length_a_header_records_is_required() {
        let whole = 4096 * (1 + 2 * 1001 + 1 + 5);
        assert_eq!(problem(whole, &header(2, 5)), None);
        assert_eq!(problem(whole + 4096, &header(2, 5)), None, "longer is fine (redb trims it)");
        assert!(problem(whole - 1, &header(2, 5)).is_some_and(|p| p.contains("truncated")));
        assert!(problem(4096 * 2003, &header(2, 0)).is_none());
        assert!(problem(0, &[]).is_some_and(|p| p.contains("empty")));
        assert!(problem(100, b"not a state file at all, no").is_some_and(|p| p.contains("not a loragate state file")));
        assert!(problem(u64::MAX, &header(u32::MAX, u32::MAX)).is_none_or(|p| p.contains("corrupt")));
    }
}
