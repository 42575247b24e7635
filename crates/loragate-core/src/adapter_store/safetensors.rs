//! The safetensors header of pushed weights, parsed and checked before the tensors are received: the header length
//! is bounded, the header is a well-formed JSON object with no key twice, every tensor is F32, F16 or BF16 with data
//! offsets that tile the data exactly, every name is a LoRA factor (`…lora_A.weight` / `…lora_B.weight`, optionally
//! with PEFT's `.default`), no module is named twice, and every module has both its A and its B. What fits the base
//! model (which modules, which shapes) is the engine's to say ([`AdapterLayout`], handed to its check).

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};

use crate::contract::{CoreError, Field};

/// The largest safetensors header accepted, in bytes (what the `safetensors` crate accepts).
pub const MAX_HEADER_BYTES: u64 = 100 << 20;

/// A tensor's element type, among those a pushed adapter may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorDtype {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// bfloat16.
    BF16,
}

impl TensorDtype {
    fn parse(raw: &str) -> Option<Self> {
        match raw {
            "F32" => Some(Self::F32),
            "F16" => Some(Self::F16),
            "BF16" => Some(Self::BF16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
        }
    }

    /// The safetensors name (`F32`, `F16`, `BF16`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
        }
    }
}

/// One tensor of a pushed adapter, as its header declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorLayout {
    /// Its name, as in the file.
    pub name: String,
    /// Its element type.
    pub dtype: TensorDtype,
    /// Its shape.
    pub shape: Vec<usize>,
}

/// What the engine checks against the base model before a pushed adapter's tensors are received: the adapter's
/// configuration and its tensors' names, dtypes and shapes.
#[derive(Clone, Debug)]
pub struct AdapterLayout {
    /// `adapter_config.json`, parsed.
    pub config: serde_json::Map<String, serde_json::Value>,
    /// Every tensor, in the header's order.
    pub tensors: Vec<TensorLayout>,
}

/// A parsed and checked header: the tensors and the size the whole file must have.
#[derive(Debug)]
pub(crate) struct CheckedHeader {
    pub(crate) tensors: Vec<TensorLayout>,
    /// 8 + header length + data length.
    pub(crate) file_len: u64,
}

fn invalid(reason: impl Into<String>) -> CoreError {
    CoreError::invalid(Field::Weights, reason)
}

/// What the first 8 bytes say the header length is; refuses, as another format, what cannot be a safetensors file
/// (a pickle, a zip archive, a header length past the bound or the limit).
pub(crate) fn header_len(first: [u8; 8], max_file_bytes: u64) -> Result<u64, CoreError> {
    if first[0] == 0x80 && first[1] <= 5 {
        return Err(CoreError::UnsupportedFormat("it starts with a pickle's magic bytes".into()));
    }
    if first.starts_with(b"PK\x03\x04") {
        return Err(CoreError::UnsupportedFormat("it is a zip archive (a PyTorch .bin or .pt file?)".into()));
    }
    let len = u64::from_le_bytes(first);
    if !(2..=MAX_HEADER_BYTES).contains(&len) || len.saturating_add(8) > max_file_bytes {
        return Err(CoreError::UnsupportedFormat(format!(
            "its first 8 bytes announce a {len}-byte header, which no safetensors file within the limits has"
        )));
    }
    Ok(len)
}

/// Parses and checks the header JSON (the bytes after the length).
pub(crate) fn check_header(json: &[u8]) -> Result<CheckedHeader, CoreError> {
    if json.first() != Some(&b'{') {
        return Err(CoreError::UnsupportedFormat("its header is not a JSON object".into()));
    }
    let entries = parse_entries(json).map_err(|err| invalid(format!("the safetensors header is not valid: {err}")))?;
    let mut tensors = Vec::with_capacity(entries.len());
    let mut spans = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        if name == "__metadata__" {
            continue;
        }
        let entry: RawEntry = serde_json::from_value(value)
            .map_err(|err| invalid(format!("tensor {name:?} in the safetensors header: {err}")))?;
        let dtype = TensorDtype::parse(&entry.dtype).ok_or_else(|| {
            invalid(format!("tensor {name:?} has dtype {}; pushed adapters hold F32, F16 or BF16", entry.dtype))
        })?;
        let elements = entry.shape.iter().try_fold(1u64, |n, &dim| n.checked_mul(dim as u64));
        let [begin, end] = entry.data_offsets;
        if elements.and_then(|n| n.checked_mul(dtype.size())) != end.checked_sub(begin) {
            return Err(invalid(format!(
                "tensor {name:?}: data_offsets [{begin}, {end}] do not hold a {:?} {} tensor",
                entry.shape,
                dtype.as_str()
            )));
        }
        spans.push((begin, end, name.clone()));
        tensors.push(TensorLayout { name, dtype, shape: entry.shape });
    }
    if tensors.is_empty() {
        return Err(invalid("holds no tensors"));
    }
    spans.sort();
    let mut data_len = 0u64;
    for (begin, end, name) in &spans {
        if *begin != data_len {
            return Err(invalid(format!("tensor {name:?} starts at {begin}, expected {data_len} (gap or overlap)")));
        }
        data_len = *end;
    }
    check_lora_pairs(&tensors)?;
    Ok(CheckedHeader { tensors, file_len: 8 + json.len() as u64 + data_len })
}

/// Every name is a LoRA factor, no module's factor appears twice, and every module has both.
fn check_lora_pairs(tensors: &[TensorLayout]) -> Result<(), CoreError> {
    let mut modules: BTreeMap<&str, [bool; 2]> = BTreeMap::new();
    for tensor in tensors {
        let (module, factor) = lora_factor(&tensor.name).ok_or_else(|| {
            invalid(format!(
                "tensor {:?} is not a LoRA factor (expected MODULE.lora_A.weight or MODULE.lora_B.weight)",
                tensor.name
            ))
        })?;
        let seen = &mut modules.entry(module).or_default()[factor];
        if *seen {
            return Err(invalid(format!(
                "{module}'s lora_{} appears twice (with and without `.default`)",
                ["A", "B"][factor]
            )));
        }
        *seen = true;
    }
    for (module, [a, b]) in modules {
        if !(a && b) {
            let missing = if a { "lora_B" } else { "lora_A" };
            return Err(invalid(format!("{module} has no {missing} tensor: LoRA factors come in A and B pairs")));
        }
    }
    Ok(())
}

/// `MODULE.lora_A[.default].weight` → (MODULE, 0); `…lora_B…` → (MODULE, 1).
fn lora_factor(name: &str) -> Option<(&str, usize)> {
    let path = name.strip_suffix(".weight")?;
    let path = path.strip_suffix(".default").unwrap_or(path);
    if let Some(module) = path.strip_suffix(".lora_A") {
        Some((module, 0))
    } else {
        path.strip_suffix(".lora_B").map(|module| (module, 1))
    }
    .filter(|(module, _)| !module.is_empty())
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [u64; 2],
}

/// The header's top-level entries in order, refusing a key that appears twice (a JSON map would keep the last).
fn parse_entries(json: &[u8]) -> Result<Vec<(String, serde_json::Value)>, serde_json::Error> {
    struct Entries;
    impl<'de> Visitor<'de> for Entries {
        type Value = Vec<(String, serde_json::Value)>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object of tensors")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut seen = HashSet::new();
            let mut entries = Vec::new();
            while let Some((key, value)) = map.next_entry::<String, serde_json::Value>()? {
                if !seen.insert(key.clone()) {
                    return Err(de::Error::custom(format!("{key:?} appears twice")));
                }
                entries.push((key, value));
            }
            Ok(entries)
        }
    }
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let entries = (&mut deserializer).deserialize_map(Entries)?;
    deserializer.end()?;
    Ok(entries)
}
