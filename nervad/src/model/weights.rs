//! Weights as stored in the checkpoint, named like the tensors they come from.
//!
//! A [`Tensor`] is a typed view over the checkpoint's bytes, read into daemon-owned memory at
//! load (or, for generated or re-aligned data, an owned buffer). Backends convert 16-bit values to f32 on
//! the fly; nothing here quantizes or copies weights into another precision.

use std::sync::Arc;

use super::config::DType;

/// Backing memory of one or more tensors.
#[derive(Debug)]
pub enum Storage {
    /// A safetensors file read into daemon-owned memory at load, as `u32` words so every
    /// f32/16-bit view is aligned; `len` is the file's exact byte length. Not a mapping: a file
    /// truncated or replaced under a running daemon cannot fault (SIGBUS) its weights.
    Read {
        /// The file's bytes, zero-padded to whole words.
        words: Vec<u32>,
        /// Bytes of the file.
        len: usize,
    },
    /// Owned bytes, stored as `u32` words so any f32/16-bit view is aligned.
    Owned(Vec<u32>),
}

impl Storage {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Storage::Read { words, len } => {
                // SAFETY: as for `Owned` below; `len` ≤ 4 × words.len() (set by the reader).
                let bytes = unsafe {
                    std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 4)
                };
                &bytes[..*len]
            }
            Storage::Owned(words) => {
                // SAFETY: u32 has no padding and any byte pattern is a valid u8; the slice
                // covers exactly the vector's initialized words.
                unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 4) }
            }
        }
    }
}

/// Error building a tensor view.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    /// The byte range does not match the shape and dtype, or lies outside the storage.
    #[error(
        "tensor of shape {shape:?} ({dtype:?}) needs {need} bytes at offset {offset}; storage has {have}"
    )]
    OutOfRange {
        /// Requested shape.
        shape: Vec<usize>,
        /// Requested dtype.
        dtype: DType,
        /// Bytes the shape needs.
        need: usize,
        /// Offset into the storage.
        offset: usize,
        /// Bytes in the storage.
        have: usize,
    },
    /// The data does not start on a multiple of the element size.
    #[error("tensor data at offset {offset} is not aligned to {align} bytes")]
    Misaligned {
        /// Offset into the storage.
        offset: usize,
        /// Required alignment.
        align: usize,
    },
}

/// A typed, shaped, row-major view into [`Storage`].
///
/// Invariant (checked in [`Tensor::new`]): `offset + numel * dtype.size() <= storage.len()` and
/// the data pointer is aligned to `dtype.size()`.
#[derive(Debug, Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    storage: Arc<Storage>,
    offset: usize,
}

impl Tensor {
    /// A view of `shape` elements of `dtype` starting at `offset` bytes into `storage`.
    pub fn new(
        storage: Arc<Storage>,
        offset: usize,
        dtype: DType,
        shape: Vec<usize>,
    ) -> Result<Self, TensorError> {
        let numel: usize = shape.iter().product();
        let need = numel * dtype.size();
        let have = storage.bytes().len();
        if offset.checked_add(need).is_none_or(|end| end > have) {
            return Err(TensorError::OutOfRange {
                shape,
                dtype,
                need,
                offset,
                have,
            });
        }
        let addr = storage.bytes().as_ptr() as usize + offset;
        if !addr.is_multiple_of(dtype.size()) {
            return Err(TensorError::Misaligned {
                offset,
                align: dtype.size(),
            });
        }
        Ok(Tensor {
            dtype,
            shape,
            storage,
            offset,
        })
    }

    /// An owned f32 tensor (tests, generated data).
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Self {
        assert_eq!(
            shape.iter().product::<usize>(),
            values.len(),
            "shape does not match data"
        );
        let words = values.iter().map(|v| v.to_bits()).collect();
        Tensor {
            dtype: DType::F32,
            shape,
            storage: Arc::new(Storage::Owned(words)),
            offset: 0,
        }
    }

    /// An owned 16-bit tensor from raw bit patterns (`DType::BF16` or `DType::F16`).
    pub fn from_bits16(dtype: DType, shape: Vec<usize>, bits: &[u16]) -> Self {
        assert_eq!(dtype.size(), 2, "from_bits16 takes a 16-bit dtype");
        assert_eq!(
            shape.iter().product::<usize>(),
            bits.len(),
            "shape does not match data"
        );
        let words = bits
            .chunks(2)
            .map(|pair| u32::from(pair[0]) | (u32::from(*pair.get(1).unwrap_or(&0)) << 16))
            .collect();
        Tensor {
            dtype,
            shape,
            storage: Arc::new(Storage::Owned(words)),
            offset: 0,
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Row-major shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.storage.bytes()[self.offset..self.offset + self.numel() * self.dtype.size()]
    }

    /// The elements as 16-bit patterns, if the dtype is BF16 or F16.
    pub fn as_bits16(&self) -> Option<&[u16]> {
        (self.dtype.size() == 2).then(|| {
            let bytes = self.bytes();
            // SAFETY: `new` checked the pointer is 2-byte aligned and the range in bounds;
            // every bit pattern is a valid u16; the storage outlives `self`'s borrow.
            unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<u16>(), bytes.len() / 2) }
        })
    }

    /// The elements as f32, if the dtype is F32.
    pub fn as_f32(&self) -> Option<&[f32]> {
        (self.dtype == DType::F32).then(|| {
            let bytes = self.bytes();
            // SAFETY: `new` (or `from_f32`) guarantees 4-byte alignment and bounds; every bit
            // pattern is a valid f32; the storage outlives `self`'s borrow.
            unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<f32>(), bytes.len() / 4) }
        })
    }

    /// Copy all elements out as f32 (tests and small vectors such as norms and biases).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self.dtype {
            DType::F32 => self.as_f32().map(<[f32]>::to_vec).unwrap_or_default(),
            DType::BF16 => self
                .as_bits16()
                .unwrap_or_default()
                .iter()
                .map(|&b| half::bf16::from_bits(b).to_f32())
                .collect(),
            DType::F16 => self
                .as_bits16()
                .unwrap_or_default()
                .iter()
                .map(|&b| half::f16::from_bits(b).to_f32())
                .collect(),
        }
    }
}

/// A dense projection `y = x W^T (+ b)`; `weight` is `[out_features, in_features]`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Tensor,
    /// `[out]`, when the architecture has one.
    pub bias: Option<Tensor>,
}

/// `model.layers.N.self_attn.*`
#[derive(Debug, Clone)]
pub struct Attention {
    /// `[num_heads*head_dim, hidden]`
    pub q_proj: Linear,
    /// `[num_kv_heads*head_dim, hidden]`
    pub k_proj: Linear,
    /// `[num_kv_heads*head_dim, hidden]`
    pub v_proj: Linear,
    /// `[hidden, num_heads*head_dim]`
    pub o_proj: Linear,
    /// `[head_dim]` RMSNorm weight applied per query head (Qwen3).
    pub q_norm: Option<Tensor>,
    /// `[head_dim]` RMSNorm weight applied per key head (Qwen3).
    pub k_norm: Option<Tensor>,
}

/// `model.layers.N.mlp.*`: SwiGLU, `down(silu(gate(x)) * up(x))`.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// `[intermediate, hidden]`
    pub gate_proj: Linear,
    /// `[intermediate, hidden]`
    pub up_proj: Linear,
    /// `[hidden, intermediate]`
    pub down_proj: Linear,
}

/// `model.layers.N.*`
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    /// `[hidden]` RMSNorm before attention.
    pub input_layernorm: Tensor,
    /// Attention block.
    pub self_attn: Attention,
    /// `[hidden]` RMSNorm before the MLP.
    pub post_attention_layernorm: Tensor,
    /// MLP block.
    pub mlp: Mlp,
}

/// Every weight of a decoder-only model.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    /// `model.embed_tokens.weight`, `[vocab, hidden]`.
    pub embed_tokens: Tensor,
    /// `model.layers.*`
    pub layers: Vec<DecoderLayer>,
    /// `model.norm.weight`, `[hidden]`.
    pub norm: Tensor,
    /// `lm_head.weight`, `[vocab, hidden]`; the same view as `embed_tokens` when tied.
    pub lm_head: Tensor,
}
