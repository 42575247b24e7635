//! A `dict` of arrays as the Rust client's tensors: `loragate._tensors.as_buffers` turns each value (numpy, anything
//! with `__array__` or DLPack, torch) into its dtype's name, shape and a flat `uint8` view of its little-endian,
//! C-ordered bytes, which is copied here through the buffer protocol.

use loragate_client::{ClientError, Tensor, TensorDtype};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

use crate::errors::to_py_err;

/// The tensors of `tensors` (a mapping of name to array).
pub(crate) fn tensors_of(py: Python<'_>, tensors: &Bound<'_, PyAny>) -> PyResult<Vec<Tensor>> {
    let buffers = py.import("loragate._tensors")?.getattr("as_buffers")?.call1((tensors,))?;
    let mut converted = Vec::new();
    for item in buffers.try_iter()? {
        let (name, dtype, shape, data): (String, String, Vec<usize>, Bound<'_, PyAny>) = item?.extract()?;
        let Some(dtype) = TensorDtype::parse(&dtype) else {
            let reason = format!("dtype {dtype} is not float32, float16 or bfloat16");
            return Err(to_py_err(py, ClientError::InvalidArgument { field: format!("tensors[{name:?}]"), reason }));
        };
        let buffer = PyBuffer::<u8>::get(&data)?;
        if !buffer.is_c_contiguous() {
            let reason = "the bytes handed over are not contiguous".to_owned();
            return Err(to_py_err(py, ClientError::InvalidArgument { field: format!("tensors[{name:?}]"), reason }));
        }
        converted.push(Tensor { name, dtype, shape, data: buffer.to_vec(py)? });
    }
    Ok(converted)
}

/// `config=`: a JSON string as it is, or a mapping written as JSON.
pub(crate) fn config_json(py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(text) = config.extract::<String>() {
        return Ok(text);
    }
    if config.cast::<pyo3::types::PyMapping>().is_ok() || config.is_instance_of::<pyo3::types::PyDict>() {
        return py.import("json")?.getattr("dumps")?.call1((config,))?.extract();
    }
    let reason = format!("a dict or a JSON string, not {}", config.get_type().name()?);
    Err(to_py_err(py, ClientError::InvalidArgument { field: "config".into(), reason }))
}
