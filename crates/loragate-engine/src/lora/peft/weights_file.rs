//! `adapter_model.safetensors`, read header first: the file is opened through [`AdapterSource::open_file`] (a
//! regular file, inside the adapter root), its size is checked against the limit, its header is parsed and checked
//! against the file's size, and only then are tensors read, one at a time, each exactly the bytes its header entry
//! names. Nothing is read whole on trust: a file's declared sizes never make the engine allocate more than the file
//! holds, and the file never holds more than `--max-adapter-bytes`. A pushed file can be read while it is being
//! written ([`WeightsFile::open_growing`]): each read waits for its bytes.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use candle_core::safetensors::Load;
use candle_core::{Device, Tensor};
use loragate_core::{AdapterSource, EngineError, GrowingFile};
use safetensors::tensor::{Metadata, TensorInfo, TensorView};

use super::WEIGHTS_FILE;

/// The longest safetensors header accepted. An adapter's header names at most a few thousand tensors (a few hundred
/// KiB of JSON); the safetensors format itself allows 100 MB.
const MAX_HEADER_BYTES: u64 = 16 << 20;

/// An open, header-checked `adapter_model.safetensors`.
pub(super) struct WeightsFile {
    file: File,
    /// Where the tensors' bytes begin (after the 8-byte length and the header).
    data_start: u64,
    metadata: Metadata,
    /// For a pushed file still being written: how much of it is.
    growing: Option<GrowingFile>,
}

impl WeightsFile {
    /// Opens the weights file of `source` and checks its size and header, reading nothing past the header.
    pub(super) fn open(source: &AdapterSource, max_bytes: u64) -> Result<Self, EngineError> {
        let (file, len) = source.open_file(WEIGHTS_FILE).map_err(|err| files(err.to_string()))?;
        Self::checked(file, len, max_bytes, None)
    }

    /// Opens a pushed weights file while it is being written: as [`WeightsFile::open`], against the size its checked
    /// header gives, each read waiting until its bytes are written (and failing if the push fails first).
    pub(super) fn open_growing(growing: GrowingFile, max_bytes: u64) -> Result<Self, EngineError> {
        let file = File::open(growing.path()).map_err(|err| files(format!("cannot open {WEIGHTS_FILE}: {err}")))?;
        let len = growing.len();
        Self::checked(file, len, max_bytes, Some(growing))
    }

    fn checked(mut file: File, len: u64, max_bytes: u64, growing: Option<GrowingFile>) -> Result<Self, EngineError> {
        if len > max_bytes {
            return Err(files(format!(
                "{WEIGHTS_FILE} is {len} bytes, over the limit of {max_bytes} bytes (--max-adapter-bytes)"
            )));
        }
        if len < 8 {
            return Err(malformed(format!("it has {len} bytes, fewer than a header length")));
        }
        let written = |end: u64| match &growing {
            Some(growing) => growing.wait_written(end).map_err(|err| files(format!("{WEIGHTS_FILE}: {err}"))),
            None => Ok(()),
        };
        written(8)?;
        let mut length = [0u8; 8];
        file.read_exact(&mut length).map_err(|err| malformed(format!("cannot read its header length: {err}")))?;
        let header_len = u64::from_le_bytes(length);
        if header_len > MAX_HEADER_BYTES || header_len > len - 8 {
            return Err(malformed(format!(
                "its header claims {header_len} bytes (the file has {len}, headers may have {MAX_HEADER_BYTES})"
            )));
        }
        written(8 + header_len)?;
        let mut header = vec![0u8; header_len as usize];
        file.read_exact(&mut header).map_err(|err| malformed(format!("cannot read its header: {err}")))?;
        let metadata: Metadata = serde_json::from_slice(&header).map_err(|err| malformed(err.to_string()))?;
        let data_start = 8 + header_len;
        let data_len = metadata.data_len() as u64;
        if data_start + data_len != len {
            return Err(malformed(format!(
                "its header describes {data_len} bytes of tensors, but {} bytes follow it",
                len - data_start
            )));
        }
        Ok(Self { file, data_start, metadata, growing })
    }

    /// Every tensor's name and header entry (dtype, shape, offsets), in file order.
    pub(super) fn entries(&self) -> Vec<(String, TensorInfo)> {
        self.metadata
            .offset_keys()
            .into_iter()
            .filter_map(|name| self.metadata.info(&name).cloned().map(|info| (name, info)))
            .collect()
    }

    /// Reads the bytes of one tensor (an entry of [`WeightsFile::entries`]) into `bytes`, replacing what it held
    /// (one buffer serves every tensor of a file: no allocation, and no page of it faulted in, per tensor).
    pub(super) fn read_into(&mut self, name: &str, info: &TensorInfo, bytes: &mut Vec<u8>) -> Result<(), EngineError> {
        let (start, end) = info.data_offsets;
        if let Some(growing) = &self.growing {
            growing
                .wait_written(self.data_start + end as u64)
                .map_err(|err| files(format!("cannot read tensor {name}: {err}")))?;
        }
        bytes.clear();
        let want = (end - start) as u64;
        let read = self
            .file
            .seek(SeekFrom::Start(self.data_start + start as u64))
            .and_then(|_| (&mut self.file).take(want).read_to_end(bytes))
            .map_err(|err| files(format!("cannot read tensor {name}: {err}")))?;
        if read as u64 != want {
            return Err(files(format!("cannot read tensor {name}: the file ended {} bytes early", want - read as u64)));
        }
        Ok(())
    }
}

/// The tensor `bytes` hold, as `info` (its header entry) describes it, on the CPU in its file dtype.
pub(super) fn tensor_of(name: &str, info: &TensorInfo, bytes: &[u8]) -> Result<Tensor, EngineError> {
    TensorView::new(info.dtype, info.shape.clone(), bytes)
        .map_err(|err| malformed(format!("tensor {name}: {err}")))?
        .load(&Device::Cpu)
        .map_err(|err| files(format!("cannot read tensor {name}: {err}")))
}

fn files(reason: String) -> EngineError {
    EngineError::AdapterFiles(reason)
}

fn malformed(reason: String) -> EngineError {
    EngineError::AdapterFiles(format!("{WEIGHTS_FILE} is not valid safetensors: {reason}"))
}
