//! Safetensors checkpoints (single file or sharded with an index) → [`ModelWeights`].
//!
//! Files are read into daemon-owned memory (not mapped: a snapshot modified under a running
//! daemon must not kill it with SIGBUS); tensors are views into those buffers. Every header is
//! validated by
//! the `safetensors` crate (offsets contiguous, sizes consistent with dtype and shape, buffer
//! length exact) and every tensor is checked against the config before a view is built.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use safetensors::tensor::{Dtype, SafeTensors, TensorInfo};

use super::config::{DType, ModelConfig};
use super::error::ModelError;
use super::tensor_names::{expected_tensors, layer_prefix};
use super::weights::{
    Attention, DecoderLayer, Linear, Mlp, ModelWeights, Storage, Tensor, TensorError,
};

/// Name of the single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Name of the shard index.
pub const SHARD_INDEX: &str = "model.safetensors.index.json";

/// How to load.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// Touch every page of the weights at load so the first request does not pay for page
    /// faults (and a truncated or unreadable file fails now rather than mid-request).
    pub prefault: bool,
    /// Show a progress bar (only ever drawn when stderr is a terminal).
    pub progress: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            prefault: true,
            progress: true,
        }
    }
}

/// What loading the weights found, for logs and reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WeightsReport {
    /// Safetensors files mapped.
    pub files: usize,
    /// Bytes mapped (sum of file sizes).
    pub mapped_bytes: u64,
    /// Bytes of the tensors the model uses.
    pub weight_bytes: u64,
    /// Tensors whose data was not aligned to their element size and had to be copied.
    pub realigned_tensors: usize,
    /// Tensors in the files that the model does not use (ignored with a warning).
    pub ignored_tensors: Vec<String>,
}

/// One mapped file and its validated header.
struct Shard {
    path: PathBuf,
    storage: Arc<Storage>,
    /// Byte offset of the data section (8 + header length).
    data_start: usize,
}

struct Entry {
    shard: usize,
    info: TensorInfo,
}

/// All tensors of a checkpoint, by name, before they are checked against a config.
struct TensorCatalog {
    shards: Vec<Shard>,
    entries: BTreeMap<String, Entry>,
    report: WeightsReport,
}

/// Read a whole file into daemon-owned, word-aligned memory. A mapping would be faster to set
/// up, but a file truncated or replaced under the running daemon would turn the next weight
/// access into SIGBUS; owned memory costs the same resident bytes (the weights are read in
/// full at load anyway) and cannot change under us.
fn read_file(path: &Path) -> Result<Storage, ModelError> {
    use std::io::Read;
    let mut file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    let len = usize::try_from(file.metadata().map_err(|e| ModelError::io(path, e))?.len())
        .map_err(|_| safetensors_error(path, "file larger than the address space"))?;
    let mut words = vec![0u32; len.div_ceil(4)];
    // SAFETY: viewing initialized u32 words as bytes (no padding, every byte pattern valid);
    // the slice covers exactly the vector's allocation and is the only reference to it.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 4) };
    file.read_exact(&mut bytes[..len])
        .map_err(|e| ModelError::io(path, e))?;
    Ok(Storage::Read { words, len })
}

fn safetensors_error(path: &Path, message: impl std::fmt::Display) -> ModelError {
    ModelError::Safetensors {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// The shard files named by an index, and which file each tensor lives in.
fn read_index(path: &Path) -> Result<BTreeMap<String, String>, ModelError> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    let index: Index = serde_json::from_str(&text).map_err(|e| ModelError::json(path, e))?;
    for file in index.weight_map.values() {
        // The index comes from the snapshot: never let it point outside the directory.
        let plain = Path::new(file)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain || file.is_empty() {
            return Err(ModelError::json(
                path,
                format!("weight_map names {file:?}, which is not a file in the snapshot directory"),
            ));
        }
    }
    Ok(index.weight_map)
}

impl TensorCatalog {
    fn open(dir: &Path) -> Result<Self, ModelError> {
        let index_path = dir.join(SHARD_INDEX);
        let single_path = dir.join(SINGLE_FILE);
        let (files, weight_map) = if index_path.is_file() {
            let map = read_index(&index_path)?;
            let mut files: Vec<String> = map.values().cloned().collect();
            files.sort();
            files.dedup();
            (files, Some(map))
        } else if single_path.is_file() {
            (vec![SINGLE_FILE.to_string()], None)
        } else {
            return Err(ModelError::MissingFile {
                path: single_path,
                what: "the weights (model.safetensors or model.safetensors.index.json)",
            });
        };

        let mut catalog = TensorCatalog {
            shards: Vec::with_capacity(files.len()),
            entries: BTreeMap::new(),
            report: WeightsReport::default(),
        };
        for file in &files {
            let path = dir.join(file);
            if !path.is_file() {
                return Err(ModelError::MissingFile {
                    path,
                    what: "a weight shard named by model.safetensors.index.json",
                });
            }
            let storage = read_file(&path)?;
            let (header_len, metadata) = SafeTensors::read_metadata(storage.bytes())
                .map_err(|e| safetensors_error(&path, e))?;
            catalog.report.mapped_bytes += storage.bytes().len() as u64;
            let shard = catalog.shards.len();
            for (name, info) in metadata.tensors() {
                if let Some(map) = &weight_map {
                    // Tensors the index does not assign to this file are not part of the model
                    // as transformers would load it.
                    if map.get(&name) != Some(file) {
                        catalog.report.ignored_tensors.push(name);
                        continue;
                    }
                }
                if catalog.entries.contains_key(&name) {
                    return Err(safetensors_error(
                        &path,
                        format!("tensor {name} appears in more than one file"),
                    ));
                }
                catalog.entries.insert(
                    name,
                    Entry {
                        shard,
                        info: info.clone(),
                    },
                );
            }
            catalog.shards.push(Shard {
                path,
                storage: Arc::new(storage),
                data_start: 8 + header_len,
            });
        }
        let absent = weight_map
            .as_ref()
            .and_then(|map| map.iter().find(|(n, _)| !catalog.entries.contains_key(*n)));
        if let Some((name, file)) = absent {
            return Err(safetensors_error(
                &dir.join(file),
                format!(
                    "model.safetensors.index.json puts tensor {name} in this file, but it is not there"
                ),
            ));
        }
        catalog.report.files = catalog.shards.len();
        Ok(catalog)
    }

    /// Remove `name` from the catalog and return a checked view of it.
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        let entry = self
            .entries
            .remove(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let dtype = match entry.info.dtype {
            Dtype::BF16 => DType::BF16,
            Dtype::F16 => DType::F16,
            Dtype::F32 => DType::F32,
            other => {
                return Err(ModelError::TensorDType {
                    name: name.to_string(),
                    found: format!("{other:?}"),
                });
            }
        };
        if entry.info.shape != shape {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: shape.to_vec(),
                found: entry.info.shape.clone(),
            });
        }
        let shard = &self.shards[entry.shard];
        let (start, end) = entry.info.data_offsets;
        let offset = shard.data_start + start;
        self.report.weight_bytes += (end - start) as u64;
        match Tensor::new(shard.storage.clone(), offset, dtype, shape.to_vec()) {
            Ok(t) => Ok(t),
            Err(TensorError::Misaligned { .. }) => {
                // Some writers do not pad the header to 8 bytes; a copy keeps the typed views sound.
                self.report.realigned_tensors += 1;
                let bytes = &shard.storage.bytes()[offset..shard.data_start + end];
                let mut words = vec![0u32; bytes.len().div_ceil(4)];
                for (word, chunk) in words.iter_mut().zip(bytes.chunks(4)) {
                    let mut le = [0u8; 4];
                    le[..chunk.len()].copy_from_slice(chunk);
                    *word = u32::from_le_bytes(le);
                }
                Tensor::new(Arc::new(Storage::Owned(words)), 0, dtype, shape.to_vec())
                    .map_err(|e| safetensors_error(&shard.path, format!("tensor {name}: {e}")))
            }
            Err(e) => Err(safetensors_error(
                &shard.path,
                format!("tensor {name}: {e}"),
            )),
        }
    }
}

fn linear(
    cat: &mut TensorCatalog,
    prefix: &str,
    rows: usize,
    cols: usize,
    bias: bool,
) -> Result<Linear, ModelError> {
    Ok(Linear {
        weight: cat.take(&format!("{prefix}.weight"), &[rows, cols])?,
        bias: if bias {
            Some(cat.take(&format!("{prefix}.bias"), &[rows])?)
        } else {
            None
        },
    })
}

/// Tensors some exporters add that carry nothing the model needs.
fn is_harmless_extra(name: &str) -> bool {
    name.ends_with(".rotary_emb.inv_freq")
}

/// Map the checkpoint in `dir`, check it against `config` and build the weights.
///
/// `config.dtype` is the dtype the config declares; tensors stored in another supported dtype
/// are accepted (each [`Tensor`] carries its own dtype) and counted in a warning.
pub fn load_weights(
    dir: &Path,
    config: &ModelConfig,
    options: LoadOptions,
) -> Result<(ModelWeights, WeightsReport), ModelError> {
    let started = Instant::now();
    let mut cat = TensorCatalog::open(dir)?;

    // Check the whole list first so a bad checkpoint fails before any page is touched, and with
    // the first problem in module order.
    for spec in expected_tensors(config) {
        let Some(entry) = cat.entries.get(&spec.name) else {
            return Err(ModelError::MissingTensor(spec.name));
        };
        if entry.info.shape != spec.shape {
            return Err(ModelError::TensorShape {
                name: spec.name,
                expected: spec.shape,
                found: entry.info.shape.clone(),
            });
        }
    }

    let h = config.hidden_size;
    let inter = config.intermediate_size;
    let (q, kv, hd) = (config.q_dim(), config.kv_dim(), config.head_dim);
    let embed_tokens = cat.take("model.embed_tokens.weight", &[config.vocab_size, h])?;
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for layer in 0..config.num_hidden_layers {
        let p = layer_prefix(layer);
        let input_layernorm = cat.take(&format!("{p}.input_layernorm.weight"), &[h])?;
        let self_attn = Attention {
            q_proj: linear(
                &mut cat,
                &format!("{p}.self_attn.q_proj"),
                q,
                h,
                config.attention_bias,
            )?,
            k_proj: linear(
                &mut cat,
                &format!("{p}.self_attn.k_proj"),
                kv,
                h,
                config.attention_bias,
            )?,
            v_proj: linear(
                &mut cat,
                &format!("{p}.self_attn.v_proj"),
                kv,
                h,
                config.attention_bias,
            )?,
            o_proj: linear(
                &mut cat,
                &format!("{p}.self_attn.o_proj"),
                h,
                q,
                config.o_proj_bias,
            )?,
            q_norm: if config.qk_norm {
                Some(cat.take(&format!("{p}.self_attn.q_norm.weight"), &[hd])?)
            } else {
                None
            },
            k_norm: if config.qk_norm {
                Some(cat.take(&format!("{p}.self_attn.k_norm.weight"), &[hd])?)
            } else {
                None
            },
        };
        let post_attention_layernorm =
            cat.take(&format!("{p}.post_attention_layernorm.weight"), &[h])?;
        let mlp = Mlp {
            gate_proj: linear(
                &mut cat,
                &format!("{p}.mlp.gate_proj"),
                inter,
                h,
                config.mlp_bias,
            )?,
            up_proj: linear(
                &mut cat,
                &format!("{p}.mlp.up_proj"),
                inter,
                h,
                config.mlp_bias,
            )?,
            down_proj: linear(
                &mut cat,
                &format!("{p}.mlp.down_proj"),
                h,
                inter,
                config.mlp_bias,
            )?,
        };
        layers.push(DecoderLayer {
            input_layernorm,
            self_attn,
            post_attention_layernorm,
            mlp,
        });
    }
    let norm = cat.take("model.norm.weight", &[h])?;
    let lm_head = if config.tie_word_embeddings {
        if cat.entries.remove("lm_head.weight").is_some() {
            // transformers ties the head to the embedding after loading, so a stored copy is
            // never used; we do the same.
            tracing::warn!("tie_word_embeddings is true: ignoring the stored lm_head.weight");
        }
        embed_tokens.clone()
    } else {
        cat.take("lm_head.weight", &[config.vocab_size, h])?
    };

    // Whatever is left is not part of the model.
    let leftovers: Vec<String> = std::mem::take(&mut cat.entries).into_keys().collect();
    for name in leftovers {
        if let Some(rest) = name.strip_prefix("model.layers.") {
            let index = rest.split('.').next().and_then(|i| i.parse::<usize>().ok());
            if index.is_some_and(|i| i >= config.num_hidden_layers) {
                return Err(ModelError::UnexpectedTensor {
                    name,
                    why: format!(
                        "config.json has num_hidden_layers = {}",
                        config.num_hidden_layers
                    ),
                });
            }
        }
        if !is_harmless_extra(&name) {
            cat.report.ignored_tensors.push(name);
        }
    }
    if !cat.report.ignored_tensors.is_empty() {
        let shown: Vec<&str> = cat
            .report
            .ignored_tensors
            .iter()
            .take(8)
            .map(String::as_str)
            .collect();
        tracing::warn!(
            count = cat.report.ignored_tensors.len(),
            first = ?shown,
            "checkpoint has tensors this architecture does not use; ignoring them"
        );
    }

    let weights = ModelWeights {
        embed_tokens,
        layers,
        norm,
        lm_head,
    };
    let off_dtype = count_off_dtype(&weights, config.dtype);
    if off_dtype > 0 {
        tracing::warn!(
            tensors = off_dtype,
            declared = ?config.dtype,
            "some tensors are stored in another dtype than config.json declares; using them as stored"
        );
    }
    if cat.report.realigned_tensors > 0 {
        tracing::warn!(
            tensors = cat.report.realigned_tensors,
            "tensor data not aligned to its element size in the file; copied those tensors"
        );
    }
    if options.prefault {
        prefault(&cat.shards, cat.report.mapped_bytes, options.progress);
    }
    tracing::info!(
        files = cat.report.files,
        mapped_bytes = cat.report.mapped_bytes,
        weight_bytes = cat.report.weight_bytes,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "weights loaded"
    );
    Ok((weights, cat.report))
}

/// Every tensor of `weights` (the tied head once).
pub fn all_tensors(weights: &ModelWeights) -> Vec<&Tensor> {
    let mut out = vec![&weights.embed_tokens, &weights.norm, &weights.lm_head];
    for layer in &weights.layers {
        out.push(&layer.input_layernorm);
        out.push(&layer.post_attention_layernorm);
        let a = &layer.self_attn;
        let m = &layer.mlp;
        for lin in [
            &a.q_proj,
            &a.k_proj,
            &a.v_proj,
            &a.o_proj,
            &m.gate_proj,
            &m.up_proj,
            &m.down_proj,
        ] {
            out.push(&lin.weight);
            out.extend(lin.bias.as_ref());
        }
        out.extend(a.q_norm.as_ref());
        out.extend(a.k_norm.as_ref());
    }
    out
}

fn count_off_dtype(weights: &ModelWeights, declared: DType) -> usize {
    all_tensors(weights)
        .into_iter()
        .filter(|t| t.dtype() != declared)
        .count()
}

/// Read one byte per page of every mapping, with a progress bar on a terminal.
fn prefault(shards: &[Shard], total: u64, progress: bool) {
    const PAGE: usize = 4096;
    const CHUNK: usize = 64 << 20;
    let bar = (progress && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "loading weights {bar:40} {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut checksum = 0u8;
    for shard in shards {
        let bytes = shard.storage.bytes();
        for chunk in bytes.chunks(CHUNK) {
            for page in chunk.iter().step_by(PAGE) {
                checksum ^= *page;
            }
            if let Some(bar) = &bar {
                bar.inc(chunk.len() as u64);
            }
        }
    }
    // Keep the reads from being optimized away.
    std::hint::black_box(checksum);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
}
