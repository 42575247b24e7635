//! One decoder layer: RMSNorm → grouped-query attention → residual, RMSNorm → SwiGLU MLP → residual. Every
//! projection takes the batch's LoRA.

use candle_core::{Result, Tensor};

use super::kv_cache::{KvCache, LayerKv, Slots};
use super::linear::Linear;
use super::ops::{self, SequenceView};
use crate::lora::{LoraBatch, LoraTarget};

/// A linear projection `y = x·Wᵀ (+ b)` plus the batch's LoRA term for it. `W` is dense or quantized ([`Linear`]);
/// the LoRA term is dense either way, so per-row LoRA is exact on a quantized model too.
#[derive(Debug)]
pub(crate) struct Projection {
    /// `W` and how `x·Wᵀ` is computed.
    pub(crate) weight: Linear,
    /// Qwen2's q/k/v projections have biases; LLaMA's have none.
    pub(crate) bias: Option<Tensor>,
    pub(crate) target: LoraTarget,
}

impl Projection {
    /// `x` is `(rows·len, in)` for `rows` rows; returns `(rows·len, out)`.
    fn forward(&self, x: &Tensor, rows: usize, layer: usize, lora: &LoraBatch) -> Result<Tensor> {
        let y = self.weight.forward(x)?;
        self.finish(y, x, rows, layer, lora)
    }

    /// [`Self::forward`] of several projections of the same `x` (`(rows·len, in)`), their products computed
    /// together ([`Linear::forward_many`]): one `(rows·len, outᵢ)` each, in order.
    fn forward_many<const N: usize>(
        projections: [&Self; N],
        x: &Tensor,
        rows: usize,
        layer: usize,
        lora: &LoraBatch,
    ) -> Result<[Tensor; N]> {
        let products = Linear::forward_many(&projections.map(|projection| &projection.weight), x)?;
        let outputs = projections
            .iter()
            .zip(products)
            .map(|(projection, y)| projection.finish(y, x, rows, layer, lora))
            .collect::<Result<Vec<_>>>()?;
        outputs.try_into().map_err(|_| candle_core::Error::Msg("one product per projection".into()))
    }

    /// `y = x·Wᵀ` plus the bias and the batch's LoRA term.
    fn finish(&self, mut y: Tensor, x: &Tensor, rows: usize, layer: usize, lora: &LoraBatch) -> Result<Tensor> {
        if let Some(bias) = &self.bias {
            y = y.broadcast_add(bias)?;
        }
        match lora.delta(layer, self.target, x, rows)? {
            Some(delta) => y + delta,
            None => Ok(y),
        }
    }
}

/// What attention attends over.
pub(crate) enum AttentionInput<'a> {
    /// Whole sequences from position 0, with a causal mask `(len, len)`; nothing is cached.
    Sequences { cos: &'a Tensor, sin: &'a Tensor, causal_mask: &'a Tensor },
    /// Packed tokens of several sequences, one per row (`len` 1), each with its own position: `cos`/`sin` are per
    /// token, `(tokens, 1, head_dim / 2)`. The first rows are the decode rows' (one new position each), then each
    /// prefill chunk's tokens in order; their keys and values go into the paged cache, which attention then reads.
    Packed { cos: &'a Tensor, sin: &'a Tensor, pass: &'a PassKv<'a> },
}

/// The keys and values of one packed pass: where its tokens' go, and what each sequence attends to.
pub(crate) struct PassKv<'a> {
    pub(crate) cache: &'a KvCache,
    /// Each token's slot, in pass order.
    pub(crate) slots: &'a Slots,
    /// Each decode row's sequence, its new position included.
    pub(crate) decode: &'a [SequenceView<'a>],
    /// Each chunk's sequence (its own positions last) and its length.
    pub(crate) chunks: &'a [(SequenceView<'a>, usize)],
    /// The gather indices of devices, where attention does not read the blocks in place.
    pub(crate) gathered: Option<&'a Gathered>,
}

/// A pass's slots as gather indices (built once per pass, on the device): what attention reads on devices.
pub(crate) struct Gathered {
    /// The decode rows' slots, `rows × longest` (padding: slot 0 of block 0, which stays zero), the mask `(rows, 1,
    /// 1, 1, longest)` hiding the padding, and `longest`.
    decode: Option<(Tensor, Tensor, usize)>,
    /// Each chunk's slots, its sequence's every position.
    chunks: Vec<Tensor>,
}

impl Gathered {
    /// The gather indices of `decode` rows and `chunks` on `device`, the mask in `dtype`.
    pub(crate) fn new(
        decode: &[SequenceView<'_>],
        chunks: &[(SequenceView<'_>, usize)],
        device: &candle_core::Device,
        dtype: candle_core::DType,
    ) -> Result<Self> {
        let slots = |sequence: &SequenceView<'_>| -> Vec<u32> {
            sequence.runs().flat_map(|(first, count)| first as u32..(first + count) as u32).collect()
        };
        let decode = if decode.is_empty() {
            None
        } else {
            let longest = decode.iter().map(|row| row.len).max().unwrap_or(0);
            let mut index = Vec::with_capacity(decode.len() * longest);
            let mut mask = Vec::with_capacity(decode.len() * longest);
            for row in decode {
                index.extend(slots(row));
                index.resize(index.len() + longest - row.len, 0);
                mask.extend((0..longest).map(|position| if position < row.len { 0f32 } else { f32::NEG_INFINITY }));
            }
            let rows = decode.len();
            let index = Tensor::from_vec(index, rows * longest, device)?;
            let mask = Tensor::from_vec(mask, (rows, 1, 1, 1, longest), device)?.to_dtype(dtype)?;
            Some((index, mask, longest))
        };
        let chunks = chunks
            .iter()
            .map(|(sequence, _)| Tensor::from_vec(slots(sequence), sequence.len, device))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { decode, chunks })
    }
}

/// Which key positions each query position of [`Attention::attend`] may see.
#[derive(Clone, Copy)]
enum Visible<'a> {
    /// An additive mask (0 or `-inf`) broadcast to the scores `(rows, kv_heads, group, len, total)`.
    Masked(&'a Tensor),
    /// The `len` queries are the last `len` of the `total` positions, each seeing those up to itself.
    Causal,
}

#[derive(Debug)]
pub(crate) struct Attention {
    pub(crate) q: Projection,
    pub(crate) k: Projection,
    pub(crate) v: Projection,
    pub(crate) o: Projection,
    pub(crate) num_heads: usize,
    pub(crate) num_kv_heads: usize,
    pub(crate) head_dim: usize,
}

impl Attention {
    /// `x` is `(rows, len, hidden)`.
    fn forward(&self, x: &Tensor, layer: usize, lora: &LoraBatch, input: AttentionInput<'_>) -> Result<Tensor> {
        let (rows, len, hidden) = x.dims3()?;
        let x = x.reshape((rows * len, hidden))?;
        let heads = |projection: Tensor, count: usize| -> Result<Tensor> {
            projection.reshape((rows, len, count, self.head_dim))?.transpose(1, 2)?.contiguous()
        };
        let [q, k, v] = Projection::forward_many([&self.q, &self.k, &self.v], &x, rows, layer, lora)?;
        let q = heads(q, self.num_heads)?;
        let k = heads(k, self.num_kv_heads)?;
        let v = heads(v, self.num_kv_heads)?;
        let output = match input {
            AttentionInput::Sequences { cos, sin, causal_mask } => {
                let (q, k) = (ops::rope(&q, cos, sin)?, ops::rope(&k, cos, sin)?);
                self.attend(&q, &k, &v, Visible::Masked(causal_mask))?
            }
            AttentionInput::Packed { cos, sin, pass } => {
                let (q, k) = (ops::rope(&q, cos, sin)?, ops::rope(&k, cos, sin)?);
                self.attend_packed(layer, &q, &k, &v, pass)?
            }
        };
        let output = output.reshape((rows * len, self.num_heads * self.head_dim))?;
        self.o.forward(&output, rows, layer, lora)?.reshape((rows, len, hidden))
    }

    /// Attention of packed tokens `(tokens, heads, 1, d)`: their keys and values are written into the cache, then
    /// the decode rows attend over their blocks in one call, and each chunk over its sequence's. Returns `(tokens,
    /// 1, heads, d)`.
    fn attend_packed(&self, layer: usize, q: &Tensor, k: &Tensor, v: &Tensor, pass: &PassKv<'_>) -> Result<Tensor> {
        pass.cache.write(layer, pass.slots, k, v)?;
        let Some(storage) = pass.cache.layer(layer) else { candle_core::bail!("no layer {layer} in the KV cache") };
        let mut outputs = Vec::with_capacity(pass.chunks.len() + 1);
        let rows = pass.decode.len();
        if rows > 0 {
            let output = match ops::paged_decode_attention(q, pass.decode, storage, self.num_kv_heads)? {
                Some(output) => output,
                None => {
                    let fallback;
                    let gathered = match pass.gathered {
                        Some(gathered) => gathered,
                        None => {
                            fallback = Gathered::new(pass.decode, &[], q.device(), q.dtype())?;
                            &fallback
                        }
                    };
                    let Some((index, mask, longest)) = &gathered.decode else { candle_core::bail!("no decode index") };
                    let (keys, values) = self.gather(storage, index, rows, *longest)?;
                    self.attend(&q.narrow(0, 0, rows)?, &keys, &values, Visible::Masked(mask))?
                }
            };
            outputs.push(output);
        }
        // A chunk's tokens are rows of the packed tensors; attention wants them as one sequence, `(1, heads, len, d)`.
        let sequence = |x: &Tensor, offset: usize, len: usize| -> Result<Tensor> {
            let (_, heads, _, head_dim) = x.dims4()?;
            x.narrow(0, offset, len)?.reshape((1, len, heads, head_dim))?.transpose(1, 2)?.contiguous()
        };
        let mut offset = rows;
        for (index, &(view, len)) in pass.chunks.iter().enumerate() {
            let output = match ops::causal_chunk_attention(q, offset, len, view, storage, self.num_kv_heads)? {
                Some(output) => output,
                None => {
                    let own;
                    let slots = match pass.gathered.and_then(|gathered| gathered.chunks.get(index)) {
                        Some(slots) => slots,
                        None => {
                            own = Gathered::new(&[], &[(view, len)], q.device(), q.dtype())?.chunks.remove(0);
                            &own
                        }
                    };
                    let (keys, values) = self.gather(storage, slots, 1, view.len)?;
                    self.attend(&sequence(q, offset, len)?, &keys, &values, Visible::Causal)?.reshape((
                        len,
                        1,
                        self.num_heads,
                        self.head_dim,
                    ))?
                }
            };
            outputs.push(output);
            offset += len;
        }
        if outputs.len() == 1 { Ok(outputs.remove(0)) } else { Tensor::cat(&outputs, 0) }
    }

    /// The keys and values at `index` (`rows × len` slots) of a layer's storage, as `(rows, kv_heads, len, d)`.
    fn gather(&self, storage: &LayerKv, index: &Tensor, rows: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let take = |buffer: &Tensor| -> Result<Tensor> {
            buffer
                .index_select(index, 0)?
                .reshape((rows, len, self.num_kv_heads, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        Ok((take(&storage.keys)?, take(&storage.values)?))
    }

    /// Scaled dot-product attention of `q` `(rows, heads, len, d)` over `k`/`v` `(rows, kv_heads, total, d)`.
    /// Grouped-query attention without copying keys: the query heads sharing a key/value head are folded into the
    /// length axis, `(rows, kv_heads, group·len, d)`. Returns `(rows, len, heads, d)`, contiguous.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, visible: Visible<'_>) -> Result<Tensor> {
        let (rows, _, len, head_dim) = q.dims4()?;
        let total = k.dim(2)?;
        let group = self.num_heads / self.num_kv_heads;
        let q = (q * (1.0 / (head_dim as f64).sqrt()))?.reshape((rows, self.num_kv_heads, group * len, head_dim))?;
        let scores = q.matmul(&k.t()?)?.reshape((rows, self.num_kv_heads, group, len, total))?;
        let weights = match visible {
            Visible::Masked(mask) => ops::softmax_last_dim(&scores.broadcast_add(mask)?)?,
            Visible::Causal => ops::causal_softmax(scores)?,
        };
        let output = weights.reshape((rows, self.num_kv_heads, group * len, total))?.matmul(v)?;
        output.reshape((rows, self.num_heads, len, head_dim))?.transpose(1, 2)?.contiguous()
    }
}

#[derive(Debug)]
pub(crate) struct Mlp {
    pub(crate) gate: Projection,
    pub(crate) up: Projection,
    pub(crate) down: Projection,
}

impl Mlp {
    /// `x` is `(rows·len, hidden)`.
    fn forward(&self, x: &Tensor, rows: usize, layer: usize, lora: &LoraBatch) -> Result<Tensor> {
        let [gate, up] = Projection::forward_many([&self.gate, &self.up], x, rows, layer, lora)?;
        self.down.forward(&ops::swiglu(gate, &up)?, rows, layer, lora)
    }
}

#[derive(Debug)]
pub(crate) struct DecoderLayer {
    pub(crate) index: usize,
    pub(crate) input_norm: Tensor,
    pub(crate) attention: Attention,
    pub(crate) post_attention_norm: Tensor,
    pub(crate) mlp: Mlp,
    pub(crate) rms_norm_eps: f64,
}

impl DecoderLayer {
    /// `x` is `(rows, len, hidden)`.
    pub(crate) fn forward(&self, x: &Tensor, lora: &LoraBatch, input: AttentionInput<'_>) -> Result<Tensor> {
        let (rows, len, hidden) = x.dims3()?;
        let normed = ops::rms_norm(x, &self.input_norm, self.rms_norm_eps)?;
        let attention = self.attention.forward(&normed, self.index, lora, input)?;
        let x = (x + attention)?;
        let normed = ops::rms_norm(&x, &self.post_attention_norm, self.rms_norm_eps)?.reshape((rows * len, hidden))?;
        let mlp = self.mlp.forward(&normed, rows, self.index, lora)?.reshape((rows, len, hidden))?;
        x + mlp
    }
}
