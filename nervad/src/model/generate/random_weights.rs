//! Random weights, generated lazily per tensor and streamed into safetensors files.
//!
//! Every tensor has its own random stream derived from (seed, tensor name, chunk index), so the
//! bytes do not depend on write order, sharding or the number of threads. Initialization is
//! chosen so logits are well spread (the parity gate needs clear top-2 margins):
//! - embeddings and an untied LM head ~ N(0, 1): logits have a standard deviation of about
//!   sqrt(hidden), margins between the top two tokens are large;
//! - projections ~ N(0, 1/fan_in): activations keep their scale through each layer;
//! - biases ~ N(0, 0.25²): clearly non-zero, so a backend that drops them fails parity;
//! - RMSNorm weights ~ 1 + N(0, 0.05²): near one but not exactly, so a backend that ignores
//!   them fails parity too.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::{Dtype, View};

use crate::model::config::DType;
use crate::model::error::ModelError;
use crate::model::safetensors_loader::{SHARD_INDEX, SINGLE_FILE};
use crate::model::tensor_names::{TensorRole, TensorSpec};

/// Elements per independent random stream (the unit of parallel work).
const CHUNK_ELEMENTS: usize = 1 << 20;

/// FNV-1a, a stable hash (std's hasher is randomized per process).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// SplitMix64 finalizer: decorrelates nearby seeds.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// (mean, standard deviation) of a tensor's entries.
fn distribution(role: TensorRole) -> (f64, f64) {
    match role {
        TensorRole::Embedding => (0.0, 1.0),
        TensorRole::Projection { fan_in } => (0.0, 1.0 / (fan_in as f64).sqrt()),
        TensorRole::Bias => (0.0, 0.25),
        TensorRole::Norm => (1.0, 0.05),
    }
}

/// Fill `out` with N(mean, std²) samples (Box–Muller on the chunk's own stream).
fn fill_normal(out: &mut [f32], seed: u64, mean: f64, std: f64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut pairs = out.chunks_exact_mut(2);
    let sample_pair = |rng: &mut ChaCha8Rng| {
        // u1 in (0, 1] so ln(u1) is finite.
        let u1 = 1.0 - rng.random::<f64>();
        let u2 = rng.random::<f64>();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
        ((mean + std * r * c) as f32, (mean + std * r * s) as f32)
    };
    for pair in &mut pairs {
        let (a, b) = sample_pair(&mut rng);
        pair[0] = a;
        pair[1] = b;
    }
    if let [last] = pairs.into_remainder() {
        *last = sample_pair(&mut rng).0;
    }
}

/// A tensor whose bytes are produced when the safetensors writer asks for them.
#[derive(Debug, Clone)]
pub struct GeneratedTensor {
    spec: TensorSpec,
    dtype: DType,
    seed: u64,
    /// Every entry is multiplied by this (1 but for the demo model's final norm).
    scale: f64,
}

impl GeneratedTensor {
    /// The tensor `spec` in `dtype`, drawn from the stream of `seed`.
    pub fn new(spec: TensorSpec, dtype: DType, seed: u64) -> Self {
        GeneratedTensor {
            spec,
            dtype,
            seed,
            scale: 1.0,
        }
    }

    /// The same draws multiplied by `factor` (a power of two keeps them exact in every dtype).
    pub fn scaled(self, factor: f64) -> Self {
        GeneratedTensor {
            scale: self.scale * factor,
            ..self
        }
    }

    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    fn numel(&self) -> usize {
        self.spec.shape.iter().product()
    }

    /// The tensor's bytes in its storage dtype. Chunks of [`CHUNK_ELEMENTS`] are drawn and
    /// converted in parallel, so memory is the output plus one f32 chunk per thread (the 8B
    /// preset's largest tensor is 1.2 GB in bf16, never 2.5 GB of f32 first).
    fn bytes(&self) -> Vec<u8> {
        let size = self.dtype.size();
        let mut out = vec![0u8; self.numel() * size];
        let (mean, std) = distribution(self.spec.role);
        let (mean, std) = (mean * self.scale, std * self.scale);
        let tensor_seed = mix(self.seed ^ fnv1a(self.spec.name.as_bytes()));
        let dtype = self.dtype;
        let fill = |group: Vec<(usize, &mut [u8])>| {
            let mut scratch = vec![0f32; CHUNK_ELEMENTS];
            for (i, bytes) in group {
                let values = &mut scratch[..bytes.len() / size];
                fill_normal(values, mix(tensor_seed ^ i as u64), mean, std);
                encode(values, bytes, dtype);
            }
        };
        let chunks: Vec<(usize, &mut [u8])> =
            out.chunks_mut(CHUNK_ELEMENTS * size).enumerate().collect();
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(chunks.len().max(1));
        let mut groups: Vec<Vec<(usize, &mut [u8])>> = (0..threads).map(|_| Vec::new()).collect();
        for (k, item) in chunks.into_iter().enumerate() {
            groups[k % threads].push(item);
        }
        if threads <= 1 {
            groups.into_iter().for_each(fill);
        } else {
            std::thread::scope(|scope| {
                for group in groups {
                    scope.spawn(|| fill(group));
                }
            });
        }
        out
    }
}

/// Little-endian `values` in `dtype` (round to nearest even for the 16-bit types).
fn encode(values: &[f32], out: &mut [u8], dtype: DType) {
    match dtype {
        DType::F32 => {
            for (v, b) in values.iter().zip(out.chunks_exact_mut(4)) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
        DType::BF16 => {
            for (v, b) in values.iter().zip(out.chunks_exact_mut(2)) {
                b.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes());
            }
        }
        DType::F16 => {
            for (v, b) in values.iter().zip(out.chunks_exact_mut(2)) {
                b.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
            }
        }
    }
}

impl View for GeneratedTensor {
    fn dtype(&self) -> Dtype {
        match self.dtype {
            DType::BF16 => Dtype::BF16,
            DType::F16 => Dtype::F16,
            DType::F32 => Dtype::F32,
        }
    }

    fn shape(&self) -> &[usize] {
        &self.spec.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.bytes())
    }

    fn data_len(&self) -> usize {
        self.numel() * self.dtype.size()
    }
}

/// Files written for the weights.
#[derive(Debug, Clone)]
pub struct WrittenWeights {
    /// The safetensors files, in order.
    pub files: Vec<PathBuf>,
    /// Bytes of tensor data.
    pub total_size: u64,
}

/// Write `tensors` into `dir` as `model.safetensors`, or as HF-style shards
/// (`model-00001-of-0000N.safetensors` + `model.safetensors.index.json`) when the data exceeds
/// `max_shard_bytes`. Each tensor's bytes exist in memory only while it is being written.
pub fn write_weights(
    dir: &Path,
    tensors: Vec<GeneratedTensor>,
    max_shard_bytes: u64,
    metadata: &BTreeMap<String, String>,
) -> Result<WrittenWeights, ModelError> {
    let total_size: u64 = tensors.iter().map(|t| t.data_len() as u64).sum();
    let mut shards: Vec<Vec<GeneratedTensor>> = vec![Vec::new()];
    let mut current = 0u64;
    for tensor in tensors {
        let size = tensor.data_len() as u64;
        let last = shards.last_mut().filter(|s| !s.is_empty());
        if last.is_some() && current + size > max_shard_bytes {
            shards.push(Vec::new());
            current = 0;
        }
        current += size;
        if let Some(shard) = shards.last_mut() {
            shard.push(tensor);
        }
    }
    let meta: std::collections::HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let count = shards.len();
    let mut files = Vec::with_capacity(count);
    let mut weight_map = BTreeMap::new();
    for (i, shard) in shards.into_iter().enumerate() {
        let name = if count == 1 {
            SINGLE_FILE.to_string()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", i + 1)
        };
        let path = dir.join(&name);
        for t in &shard {
            weight_map.insert(t.spec.name.clone(), name.clone());
        }
        let named = shard.into_iter().map(|t| (t.spec.name.clone(), t));
        safetensors::serialize_to_file(named, Some(meta.clone()), &path)
            .map_err(|e| ModelError::Generator(format!("{}: {e}", path.display())))?;
        // The crate writes through a private (0600) temporary file; a model cache is meant to
        // be readable like the other snapshot files.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
                .map_err(|e| ModelError::io(&path, e))?;
        }
        files.push(path);
    }
    if count > 1 {
        let index = serde_json::json!({
            "metadata": { "total_size": total_size },
            "weight_map": weight_map,
        });
        let path = dir.join(SHARD_INDEX);
        let text = serde_json::to_string_pretty(&index)
            .map_err(|e| ModelError::Generator(e.to_string()))?;
        std::fs::write(&path, text + "\n").map_err(|e| ModelError::io(&path, e))?;
    }
    Ok(WrittenWeights { files, total_size })
}
