//! The ids this front makes up: request ids that tell this process's futures from an earlier process's, session ids,
//! and self-describing sampling-session ids that name their target, so an SDK client survives a server restart
//! without any table. Future and session ids carry 128 random bits: they cannot be guessed from one another (a
//! future is also readable only by the key that created it).

use std::fmt;

use loragate_core::AdapterKey;

/// Marks every id this process makes, so that ids of an earlier process (a restart) are told apart from ids never
/// issued: the first are looked up among the futures put back at start, and get 410 if absent (the SDK resubmits);
/// the others 404.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Epoch(u32);

impl Epoch {
    /// A fresh epoch for this process.
    pub(crate) fn random() -> Self {
        Self(rand::random())
    }
}

/// A future's request id: `tk-<epoch>-<128 random bits in hex>`, also the core request id of its sample, so that
/// aborts list it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FutureId {
    epoch: u32,
    token: u128,
}

/// What a `request_id` sent to `retrieve_future` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KnownId {
    /// Made by this process: look it up.
    Ours(FutureId),
    /// Made by an earlier process of this server: its future was put back at start if it was recorded, else it died
    /// with that process.
    EarlierProcess(FutureId),
    /// Not an id this server makes.
    Foreign,
}

impl FutureId {
    /// The text of the id.
    pub(crate) fn to_wire(self) -> String {
        self.to_string()
    }

    /// Reads a `request_id` as this process (`epoch`) sees it.
    pub(crate) fn classify(raw: &str, epoch: Epoch) -> KnownId {
        match Self::parse(raw) {
            Some(id) if id.epoch == epoch.0 => KnownId::Ours(id),
            Some(id) => KnownId::EarlierProcess(id),
            None => KnownId::Foreign,
        }
    }

    /// Reads a request id of any process of this server (`None`: not one this server makes).
    pub(crate) fn parse(raw: &str) -> Option<Self> {
        let (epoch_hex, token) = raw.strip_prefix("tk-")?.split_once('-')?;
        let hex = |text: &str, digits: usize| text.len() == digits && text.bytes().all(|b| b.is_ascii_hexdigit());
        let epoch = hex(epoch_hex, 8).then(|| u32::from_str_radix(epoch_hex, 16).ok()).flatten()?;
        let token = hex(token, 32).then(|| u128::from_str_radix(token, 16).ok()).flatten()?;
        Some(Self { epoch, token })
    }
}

impl fmt::Display for FutureId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tk-{:08x}-{:032x}", self.epoch, self.token)
    }
}

/// Makes this process's future and session ids.
#[derive(Debug)]
pub(crate) struct IdMaker {
    epoch: Epoch,
}

impl IdMaker {
    /// Ids marked with `epoch`.
    pub(crate) fn new(epoch: Epoch) -> Self {
        Self { epoch }
    }

    /// This process's epoch.
    pub(crate) fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// A fresh future id.
    pub(crate) fn future_id(&self) -> FutureId {
        FutureId { epoch: self.epoch.0, token: rand::random() }
    }

    /// A fresh session id (sessions are bookkeeping only: the id is opaque to the SDK).
    pub(crate) fn session_id(&self) -> String {
        format!("session-{:08x}-{:032x}", self.epoch.0, rand::random::<u128>())
    }
}

/// A sampling session id: `ss-<random>-<hex of the target>`, the target being the adapter's name or the empty
/// string for the base model. Decoded on every `asample`, so the front keeps no table of sampling sessions.
pub(crate) fn sampling_session_id(target: &AdapterKey) -> String {
    let hex: String = target.as_wire_str().bytes().map(|b| format!("{b:02x}")).collect();
    format!("ss-{:016x}-{hex}", rand::random::<u64>())
}

/// The target a sampling session id names, if it is one this front makes (the target may no longer be loaded).
pub(crate) fn sampling_session_target(id: &str) -> Option<AdapterKey> {
    let (random, hex) = id.strip_prefix("ss-")?.split_once('-')?;
    if random.len() != 16 || !random.bytes().all(|b| b.is_ascii_hexdigit()) || hex.len() % 2 != 0 {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|at| hex.get(at..at + 2).and_then(|pair| u8::from_str_radix(pair, 16).ok()))
        .collect::<Option<Vec<u8>>>()?;
    AdapterKey::parse(&String::from_utf8(bytes).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use loragate_core::AdapterName;

    use super::*;

    #[test]
    fn future_ids_round_trip_and_tell_earlier_processes_from_foreign_ids() {
        let ours = IdMaker::new(Epoch(0xabc));
        let id = ours.future_id();
        let wire = id.to_wire();
        assert!(wire.starts_with("tk-00000abc-") && wire.len() == "tk-00000abc-".len() + 32, "{wire}");
        assert_eq!(FutureId::classify(&wire, Epoch(0xabc)), KnownId::Ours(id));
        assert_ne!(ours.future_id(), id, "ids are fresh");
        assert_eq!(FutureId::classify(&wire, Epoch(0xdef)), KnownId::EarlierProcess(id));
        assert_eq!(FutureId::parse(&wire), Some(id));
        let sequential = "tk-00000abc-00000000000000000000000000000001";
        assert_eq!(FutureId::classify(sequential, Epoch(0xabc)), KnownId::Ours(FutureId { epoch: 0xabc, token: 1 }));
        for foreign in [
            "",
            "tk-",
            "tk-00000abc",
            "tk-00000abc-",
            "tk-abc-1",
            "tk-00000abc-x",
            "tk-00000abc-+1",
            "tk-00000abc-0",
            "tk-00000abc-+0000000000000000000000000000001",
            "lg-1",
        ] {
            assert_eq!(FutureId::classify(foreign, Epoch(0xabc)), KnownId::Foreign, "{foreign:?}");
        }
    }

    #[test]
    fn future_ids_cannot_be_guessed_from_one_another() {
        let ids = IdMaker::new(Epoch(1));
        let (a, b) = (ids.future_id(), ids.future_id());
        assert_ne!(a.token.abs_diff(b.token), 1, "not sequential");
        assert!(a.token.count_ones() > 16 && b.token.count_ones() > 16, "128 random bits: {a} {b}");
    }

    #[test]
    fn sampling_session_ids_name_their_target() {
        let meow = AdapterKey::Lora(AdapterName::parse("org/meow").expect("name"));
        for target in [AdapterKey::Base, meow] {
            let id = sampling_session_id(&target);
            assert_eq!(sampling_session_target(&id), Some(target.clone()), "{id}");
            assert_ne!(sampling_session_id(&target), id, "each session gets its own id");
        }
        for bad in ["", "ss-", "ss-0123456789abcdef", "ss-0123-6d", "ss-0123456789abcdef-6", "ss-0123456789abcdef-zz"] {
            assert_eq!(sampling_session_target(bad), None, "{bad:?}");
        }
        assert_eq!(sampling_session_target("ss-0123456789abcdef-2020"), None, "a name with a space is no adapter");
    }
}
