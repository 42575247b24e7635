use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sha2::Digest;

use super::*;
use crate::contract::{CoreError, ErrorClass};
use crate::{CONFIG_FILE, WEIGHTS_FILE};

const CONFIG: &[u8] = br#"{"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}"#;

/// A safetensors file of F32 tensors `(name, shape)` whose values are their byte offsets, as a real file lays them
/// out. `raw_header` replaces the generated header when given.
fn safetensors_file(tensors: &[(&str, &[usize])], raw_header: Option<&str>) -> Vec<u8> {
    let mut header = String::from("{");
    let mut offset = 0usize;
    for (index, (name, shape)) in tensors.iter().enumerate() {
        let len = shape.iter().product::<usize>() * 4;
        if index > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            r#""{name}":{{"dtype":"F32","shape":{shape:?},"data_offsets":[{offset},{}]}}"#,
            offset + len
        ));
        offset += len;
    }
    header.push('}');
    let header = raw_header.map_or(header, str::to_owned);
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend((0..offset).map(|byte| (byte % 251) as u8));
    file
}

const Q_A: &str = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
const Q_B: &str = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";

fn good_file() -> Vec<u8> {
    safetensors_file(&[(Q_A, &[2, 8]), (Q_B, &[8, 2])], None)
}

fn accept_all() -> LayoutCheck {
    Arc::new(|_: &AdapterLayout| Ok(()))
}

fn new_store(max_bytes: u64) -> (tempfile::TempDir, AdapterStore) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = AdapterStore::open(dir.path().join("adapters"), max_bytes).expect("store opens");
    (dir, store)
}

fn header(sha256: &str, total_bytes: Option<u64>) -> PushHeader {
    PushHeader::parse(CONFIG.to_vec(), sha256, total_bytes).expect("a valid header")
}

/// Pushes `file` in chunks of `chunk` bytes; the first error, whether from a write or the finish.
async fn push(store: &AdapterStore, head: PushHeader, file: &[u8], chunk: usize) -> Result<StoredAdapter, CoreError> {
    let mut receiver = store.receive(head, accept_all()).await?;
    for part in file.chunks(chunk) {
        receiver.write(part).await?;
    }
    receiver.finish().await
}

fn field_of(err: &CoreError) -> Option<Field> {
    match err {
        CoreError::InvalidArgument { field, .. } => Some(*field),
        _ => None,
    }
}

#[tokio::test]
async fn a_push_lands_in_a_directory_named_by_content_with_both_files() {
    let (_dir, store) = new_store(1 << 20);
    let file = good_file();
    let sha = Sha256(sha2::Sha256::digest(&file).into());
    for chunk in [1, 7, 1 << 20] {
        let stored = push(&store, header(&sha.to_hex(), Some(file.len() as u64)), &file, chunk).await.expect("stored");
        assert_eq!((stored.sha256, stored.bytes), (sha, file.len() as u64));
        let dir = stored.source.dir().to_owned();
        assert!(dir.file_name().expect("name").to_string_lossy().starts_with(&sha.to_hex()), "{dir:?}");
        assert_eq!(std::fs::read(dir.join(WEIGHTS_FILE)).expect("weights"), file);
        assert_eq!(std::fs::read(dir.join(CONFIG_FILE)).expect("config"), CONFIG);
        assert_eq!(stored.source.digest().expect("known"), (sha, file.len() as u64));
    }
    assert_eq!(store.blob_dirs().expect("list").len(), 1, "the same content is stored once");
    assert_eq!(store.pending_uploads().expect("tmp"), 0);
}

#[tokio::test]
async fn a_stored_version_is_found_by_its_content_name_and_kept_from_collection_while_held() {
    let (_dir, store) = new_store(1 << 20);
    let file = good_file();
    let sha = Sha256(sha2::Sha256::digest(&file).into());
    let pushed = push(&store, header("", None), &file, 64).await.expect("stored");
    let dir = pushed.source.dir().to_owned();
    drop(pushed.lease);
    let name = dir.file_name().expect("a name").to_owned();
    let found = store.stored(&name, sha, file.len() as u64).expect("found by its name");
    assert_eq!((found.source.dir(), found.sha256), (dir.as_path(), sha));
    assert_eq!(store.collect_garbage(&HashSet::new()).expect("collected"), 0, "held: not collected");
    let other = Sha256([7; 32]);
    assert!(store.stored(&name, other, file.len() as u64).is_none(), "a name that is not that content");
    assert!(store.stored(std::ffi::OsStr::new("absent"), sha, 1).is_none());
    drop(found);
    assert_eq!(store.collect_garbage(&HashSet::new()).expect("collected"), 1, "released: collected");
}

/// A body that must be refused: what it is, its bytes, the class, the field named and words of the message.
type Refusal = (&'static str, Vec<u8>, ErrorClass, Option<Field>, &'static str);

#[tokio::test]
async fn bad_bodies_are_refused_naming_the_field_and_leave_no_temporary_file() {
    let (_dir, store) = new_store(1 << 20);
    let good = good_file();
    let mut pickle = vec![0x80, 0x02, b'c', b'c'];
    pickle.extend_from_slice(b"ollections\nOrderedDict\nq\x00");
    let zip = b"PK\x03\x04 and then a torch archive".to_vec();
    let garbage = b"this is not a safetensors file at all, just text".to_vec();
    let not_json = {
        let mut file = 5u64.to_le_bytes().to_vec();
        file.extend_from_slice(b"{abc}");
        file
    };
    let cases: Vec<Refusal> = vec![
        ("truncated", good[..good.len() - 3].to_vec(), ErrorClass::Invalid, Some(Field::Weights), "truncated"),
        ("inside the header", good[..20].to_vec(), ErrorClass::Invalid, Some(Field::Weights), "truncated"),
        ("empty", Vec::new(), ErrorClass::Invalid, Some(Field::Weights), "no bytes"),
        ("pickle", pickle, ErrorClass::UnsupportedFormat, None, "pickle"),
        ("zip", zip, ErrorClass::UnsupportedFormat, None, "zip"),
        ("garbage", garbage, ErrorClass::UnsupportedFormat, None, "header"),
        ("bad JSON", not_json, ErrorClass::Invalid, Some(Field::Weights), "not valid"),
        (
            "missing B",
            safetensors_file(&[(Q_A, &[2, 8])], None),
            ErrorClass::Invalid,
            Some(Field::Weights),
            "layers.0.self_attn.q_proj has no lora_B",
        ),
        (
            "duplicate with .default",
            safetensors_file(
                &[
                    (Q_A, &[2, 8]),
                    (Q_B, &[8, 2]),
                    ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", &[2, 8]),
                ],
                None,
            ),
            ErrorClass::Invalid,
            Some(Field::Weights),
            "appears twice",
        ),
        (
            "unknown name",
            safetensors_file(&[(Q_A, &[2, 8]), (Q_B, &[8, 2]), ("model.embed_tokens.weight", &[4])], None),
            ErrorClass::Invalid,
            Some(Field::Weights),
            "model.embed_tokens.weight",
        ),
        (
            "duplicate JSON key",
            safetensors_file(
                &[(Q_A, &[2, 8]), (Q_B, &[8, 2])],
                Some(&format!(
                    r#"{{"{Q_A}":{{"dtype":"F32","shape":[2,8],"data_offsets":[0,64]}},"{Q_A}":{{"dtype":"F32","shape":[2,8],"data_offsets":[0,64]}}}}"#
                )),
            ),
            ErrorClass::Invalid,
            Some(Field::Weights),
            "appears twice",
        ),
        (
            "pickled dtype",
            safetensors_file(
                &[(Q_A, &[2, 8]), (Q_B, &[8, 2])],
                Some(&format!(
                    r#"{{"{Q_A}":{{"dtype":"I64","shape":[2,4],"data_offsets":[0,64]}},"{Q_B}":{{"dtype":"F32","shape":[8,2],"data_offsets":[64,128]}}}}"#
                )),
            ),
            ErrorClass::Invalid,
            Some(Field::Weights),
            "dtype I64",
        ),
    ];
    for (what, file, class, field, says) in cases {
        let err = push(&store, header("", None), &file, 5).await.expect_err(what);
        assert_eq!((err.class(), field_of(&err)), (class, field), "{what}: {err}");
        assert!(err.to_string().contains(says), "{what}: {err}");
        assert_eq!(store.pending_uploads().expect("tmp"), 0, "{what} left a temporary file");
    }
    assert!(store.blob_dirs().expect("list").is_empty());
}

#[tokio::test]
async fn a_declared_sha256_or_size_that_does_not_match_is_refused() {
    let (_dir, store) = new_store(1 << 20);
    let file = good_file();
    let err = push(&store, header(&"ab".repeat(32), None), &file, 64).await.expect_err("wrong sha");
    assert_eq!(field_of(&err), Some(Field::Sha256), "{err}");
    assert!(err.to_string().contains("nothing was installed"), "{err}");
    let err = push(&store, header("", Some(file.len() as u64 + 1)), &file, 64).await.expect_err("wrong size");
    assert_eq!(field_of(&err), Some(Field::TotalBytes), "{err}");
    assert!(PushHeader::parse(CONFIG.to_vec(), "xyz", None).is_err());
    for config in [&b""[..], b"[1]", b"{not json"] {
        let err = PushHeader::parse(config.to_vec(), "", None).expect_err("bad config");
        assert_eq!(field_of(&err), Some(Field::AdapterConfig), "{err}");
    }
    assert_eq!(store.pending_uploads().expect("tmp"), 0);
    assert!(store.blob_dirs().expect("list").is_empty());
}

#[tokio::test]
async fn oversized_weights_are_refused_before_they_are_all_read() {
    let (_dir, store) = new_store(4096);
    let big = safetensors_file(&[(Q_A, &[16, 64]), (Q_B, &[64, 16])], None);
    // Declared: refused before any byte.
    let err = store.receive(header("", Some(big.len() as u64)), accept_all()).await.expect_err("declared too big");
    assert_eq!(err.class(), ErrorClass::TooLarge, "{err}");
    // Announced by the header: refused once the header is in, long before the data.
    let mut receiver = store.receive(header("", None), accept_all()).await.expect("starts");
    let mut sent = 0;
    let mut refused = None;
    for part in big.chunks(64) {
        sent += part.len();
        if let Err(err) = receiver.write(part).await {
            refused = Some(err);
            break;
        }
    }
    let err = refused.expect("refused midway");
    assert_eq!(err.class(), ErrorClass::TooLarge, "{err}");
    assert!(sent < 1024, "refused after {sent} of {} bytes", big.len());
    drop(receiver);
    // Past the limit with no header to tell (bytes past a header that lies about its data are refused as they come).
    let (_dir2, small) = new_store(300);
    let mut receiver = small.receive(header("", None), accept_all()).await.expect("starts");
    let file = good_file();
    let mut failed = None;
    for part in file.chunks(16).chain(std::iter::repeat_n(&[0u8; 16][..], 40)) {
        if let Err(err) = receiver.write(part).await {
            failed = Some(err);
            break;
        }
    }
    let err = failed.expect("refused");
    assert!(matches!(err.class(), ErrorClass::TooLarge | ErrorClass::Invalid), "{err}");
    drop(receiver);
    assert_eq!(store.pending_uploads().expect("tmp") + small.pending_uploads().expect("tmp"), 0);
}

#[tokio::test]
async fn the_models_layout_check_runs_on_the_header_before_the_tensors_arrive() {
    let (_dir, store) = new_store(1 << 20);
    let file = safetensors_file(&[(Q_A, &[2, 512]), (Q_B, &[8, 2])], None);
    let checked = Arc::new(AtomicUsize::new(0));
    let check: LayoutCheck = Arc::new({
        let checked = checked.clone();
        move |layout: &AdapterLayout| {
            checked.fetch_add(1, Ordering::SeqCst);
            assert_eq!(layout.config.get("r"), Some(&serde_json::json!(2)));
            let a = layout.tensors.iter().find(|tensor| tensor.name == Q_A).expect("A listed");
            if a.shape != [2, 8] {
                return Err(CoreError::invalid(
                    Field::Weights,
                    format!("{Q_A} has shape {:?}, expected [2, 8]", a.shape),
                ));
            }
            Ok(())
        }
    });
    let mut receiver = store.receive(header("", None), check).await.expect("starts");
    let header_end = 8 + u64::from_le_bytes(file[..8].try_into().expect("8 bytes")) as usize;
    receiver.write(&file[..header_end - 1]).await.expect("header not complete yet");
    assert_eq!(checked.load(Ordering::SeqCst), 0);
    let err = receiver.write(&file[header_end - 1..header_end + 4]).await.expect_err("wrong shape");
    assert!(err.to_string().contains("expected [2, 8]"), "{err}");
    assert_eq!(checked.load(Ordering::SeqCst), 1);
    drop(receiver);
    assert_eq!(store.pending_uploads().expect("tmp"), 0);
}

#[tokio::test]
async fn a_push_dropped_midway_leaves_nothing() {
    let (_dir, store) = new_store(1 << 20);
    let file = good_file();
    let mut receiver = store.receive(header("", None), accept_all()).await.expect("starts");
    receiver.write(&file[..file.len() / 2]).await.expect("first half");
    assert_eq!(store.pending_uploads().expect("tmp"), 1);
    drop(receiver);
    assert_eq!(store.pending_uploads().expect("tmp"), 0);
    assert!(store.blob_dirs().expect("list").is_empty());
}

/// A file of several writer batches (about 9 MiB): the writer runs behind the receiving, and syncs midway.
fn large_file() -> Vec<u8> {
    safetensors_file(&[(Q_A, &[1024, 1100]), (Q_B, &[1100, 1024])], None)
}

#[tokio::test]
async fn a_large_push_is_stored_whole_whatever_its_chunks() {
    let (_dir, store) = new_store(1 << 24);
    let file = large_file();
    let sha = Sha256(sha2::Sha256::digest(&file).into());
    for chunk in [16 << 10, 1 << 20, (1 << 20) + 5, 3 << 20] {
        let stored = push(&store, header(&sha.to_hex(), Some(file.len() as u64)), &file, chunk).await.expect("stored");
        assert_eq!((stored.sha256, stored.bytes), (sha, file.len() as u64));
        assert!(std::fs::read(stored.source.dir().join(WEIGHTS_FILE)).expect("weights") == file, "chunks of {chunk}");
    }
    let wrong = Sha256([9; 32]).to_hex();
    let refused = push(&store, header(&wrong, None), &file, 1 << 20).await.expect_err("another digest");
    assert_eq!(field_of(&refused), Some(Field::Sha256));
    assert_eq!(store.blob_dirs().expect("list").len(), 1);
    assert_eq!(store.pending_uploads().expect("tmp"), 0);
}

#[tokio::test]
async fn a_large_push_cut_midway_leaves_no_file() {
    let (_dir, store) = new_store(1 << 24);
    let file = large_file();
    for cut in [(1 << 20) + 1, file.len() / 2, file.len() - 1] {
        let mut receiver = store.receive(header("", None), accept_all()).await.expect("starts");
        for part in file[..cut].chunks(64 << 10) {
            receiver.write(part).await.expect("a part");
        }
        assert_eq!(store.pending_uploads().expect("tmp"), 1);
        // The client is gone: the receiver is dropped while the writer may still have batches queued.
        drop(receiver);
        assert_eq!(store.pending_uploads().expect("tmp"), 0, "cut after {cut} bytes");
        assert!(store.blob_dirs().expect("list").is_empty());
    }
    // A body that ends early and is finished is refused, and leaves nothing either.
    let mut receiver = store.receive(header("", None), accept_all()).await.expect("starts");
    receiver.write(&file[..file.len() - 1]).await.expect("all but one byte");
    let refused = receiver.finish().await.expect_err("truncated");
    assert_eq!(field_of(&refused), Some(Field::Weights));
    assert_eq!(store.pending_uploads().expect("tmp"), 0);
    assert!(store.blob_dirs().expect("list").is_empty());
}

#[tokio::test]
async fn garbage_collection_keeps_what_is_referenced_or_being_installed() {
    let (dir, store) = new_store(1 << 20);
    let first = push(&store, header("", None), &good_file(), 1024).await.expect("first");
    let other = safetensors_file(
        &[
            (Q_A, &[2, 8]),
            (Q_B, &[8, 2]),
            (&Q_A.replace("q_proj", "v_proj"), &[2, 8]),
            (&Q_B.replace("q_proj", "v_proj"), &[8, 2]),
        ],
        None,
    );
    let second = push(&store, header("", None), &other, 1024).await.expect("second");
    let (first_dir, second_dir) = (first.source.dir().to_owned(), second.source.dir().to_owned());
    // The second is still being installed: kept even though nothing refers to it yet.
    let referenced = HashSet::from([first_dir.clone()]);
    assert_eq!(store.collect_garbage(&referenced).expect("gc"), 0);
    drop(second.lease);
    assert_eq!(store.collect_garbage(&referenced).expect("gc"), 1);
    assert_eq!(store.blob_dirs().expect("list"), vec![first_dir.clone()]);
    assert!(!second_dir.exists());
    drop(first.lease);
    // A reopened store keeps the blobs and clears what a crash left in tmp/.
    std::fs::create_dir(store.dir().join("tmp/push-left-by-a-crash")).expect("mkdir");
    drop(store);
    let reopened = AdapterStore::open(dir.path().join("adapters"), 1 << 20).expect("reopens");
    assert_eq!(reopened.blob_dirs().expect("list"), vec![first_dir]);
    assert_eq!(reopened.pending_uploads().expect("tmp"), 0);
    assert_eq!(reopened.collect_garbage(&HashSet::new()).expect("gc"), 1);
    assert!(reopened.blob_dirs().expect("list").is_empty());
}

#[tokio::test]
async fn a_temporary_store_is_removed_with_its_last_clone() {
    let store = AdapterStore::temporary(1 << 20).expect("temporary");
    assert!(!store.is_durable(), "nothing reopens a temporary store: it syncs nothing");
    assert!(new_store(1 << 20).1.is_durable(), "a store in a directory is synced");
    let dir = store.dir().to_owned();
    let stored = push(&store, header("", None), &good_file(), 4096).await.expect("stored");
    assert!(stored.source.dir().starts_with(&dir));
    assert_eq!(std::fs::read(stored.source.dir().join(WEIGHTS_FILE)).expect("in place"), good_file());
    let clone = store.clone();
    drop(store);
    assert!(dir.exists());
    drop((clone, stored));
    assert!(!dir.exists());
}

/// A collection reads its record after it begins; a version whose install ended after that may be in a newer record
/// than the one read, so that collection keeps it, whatever other collections run meanwhile; the next one decides.
#[tokio::test]
async fn a_collection_keeps_what_was_installed_after_it_began() {
    let (_dir, store) = new_store(1 << 20);
    let older = store.begin_collection();
    let pushed = push(&store, header("", None), &good_file(), 1024).await.expect("stored");
    let blob = pushed.source.dir().to_owned();
    let newer = store.begin_collection();
    drop(pushed.lease);
    // Both began before the install ended: neither deletes it, though neither record names it.
    assert_eq!(newer.collect(&HashSet::new()).expect("gc"), 0, "installed after the newer one began");
    assert_eq!(older.collect(&HashSet::new()).expect("gc"), 0, "installed after the older one began");
    assert!(blob.exists());
    // One that begins after the install ended read a record that would name it: unreferenced, it is deleted.
    assert_eq!(store.begin_collection().collect(&HashSet::new()).expect("gc"), 1);
    assert!(!blob.exists());
}

/// Releases are remembered only while a collection that began before them runs.
#[tokio::test]
async fn releases_are_forgotten_once_no_collection_needs_them() {
    let (_dir, store) = new_store(1 << 20);
    let pushed = push(&store, header("", None), &good_file(), 1024).await.expect("stored");
    let running = store.begin_collection();
    drop(pushed.lease);
    assert_eq!(store.inner.holds.lock().released.len(), 1, "remembered for the running collection");
    drop(running);
    assert!(store.inner.holds.lock().released.is_empty(), "forgotten with it");
    let again = push(&store, header("", None), &good_file(), 1024).await.expect("stored again");
    drop(again.lease);
    assert!(store.inner.holds.lock().released.is_empty(), "no collection runs: nothing to remember");
}

/// A receiver of a push into `store` whose preparation reads the growing file whole on a thread of its own, as an
/// engine reading tensors as they arrive would: its result (the bytes it read, or why it could not) arrives on the
/// channel returned beside it.
async fn receiver_read_as_it_arrives(
    store: &AdapterStore,
) -> (Receiver, std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>) {
    let (results, read) = std::sync::mpsc::channel();
    let results = parking_lot::Mutex::new(results);
    let preparation: Preparation = Arc::new(move |layout: &AdapterLayout, file: GrowingFile| {
        assert_eq!(layout.tensors.len(), 2, "given the checked layout");
        let results = results.lock().clone();
        std::thread::spawn(move || {
            let read = file.wait_written(file.len()).and_then(|()| std::fs::read(file.path()));
            let _ = results.send(read);
        });
        Some(PreparedLoad::new(Box::new("prepared")))
    });
    let receiver = store.receive(header("", None), accept_all()).await.expect("starts").prepared_by(preparation);
    (receiver, read)
}

#[tokio::test]
async fn a_preparation_reads_the_file_as_it_arrives_and_travels_with_the_stored_version() {
    let (_dir, store) = new_store(64 << 20);
    let file = large_file();
    let (mut receiver, read) = receiver_read_as_it_arrives(&store).await;
    for part in file.chunks(100_000) {
        receiver.write(part).await.expect("written");
    }
    let stored = receiver.finish().await.expect("stored");
    let bytes = tokio::task::spawn_blocking(move || read.recv().expect("the reading ended"))
        .await
        .expect("joined")
        .expect("the reading saw the whole file");
    assert_eq!(bytes, file, "what the preparation read is the pushed file");
    assert!(stored.source.is_prepared(), "the stored version's source carries the preparation");
    let prepared = stored.source.clone().take_prepared().expect("taken once");
    assert_eq!(prepared.downcast_ref::<&str>(), Some(&"prepared"));
    assert!(!stored.source.is_prepared() && stored.source.take_prepared().is_none(), "taken by every clone");
}

#[tokio::test]
async fn a_preparation_is_discarded_with_its_stored_version_and_fails_with_a_push_dropped_midway() {
    let (_dir, store) = new_store(64 << 20);
    let file = large_file();
    let (mut receiver, _read) = receiver_read_as_it_arrives(&store).await;
    receiver.write(&file[..]).await.expect("written");
    let stored = receiver.finish().await.expect("stored");
    let kept_elsewhere = stored.source.clone();
    assert!(kept_elsewhere.is_prepared());
    drop(stored);
    assert!(!kept_elsewhere.is_prepared(), "a clone of the source holds nothing once the stored version is gone");

    let (mut receiver, read) = receiver_read_as_it_arrives(&store).await;
    receiver.write(&file[..file.len() / 2]).await.expect("first half");
    drop(receiver);
    let outcome = tokio::task::spawn_blocking(move || read.recv().expect("the reading ended")).await.expect("joined");
    assert!(outcome.is_err(), "the reading of a push dropped midway fails instead of waiting forever");
    assert_eq!(store.pending_uploads().expect("tmp"), 0);
}
