#!/usr/bin/env python3
"""An independent float64 numpy forward pass of the four supported architectures, written
from transformers' modeling code (Qwen3, Llama incl. llama3/linear RoPE scaling, Qwen2 biases,
Mistral sliding window). For machines without torch (CI): it checks nervad's `dump` output the
same way parity.py does, against this re-implementation instead of transformers. It is a second
opinion, not a substitute for the transformers gate.

    python3 tests/parity/numpy_reference.py --nervad target/debug/nervad [--presets tiny,...]

Needs numpy only. Slow by design (full recomputation per greedy step): tiny presets only.
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402  (gates and table shared with the transformers script)


def load_safetensors(model_dir):
    files = ["model.safetensors"]
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    tensors = {}
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as f:
            data = f.read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        base = 8 + n
        for key, info in header.items():
            if key == "__metadata__":
                continue
            start, end = info["data_offsets"]
            raw = data[base + start:base + end]
            if info["dtype"] == "BF16":
                arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            elif info["dtype"] == "F16":
                arr = np.frombuffer(raw, dtype="<f2")
            elif info["dtype"] == "F32":
                arr = np.frombuffer(raw, dtype="<f4")
            else:
                raise ValueError(f"{key}: dtype {info['dtype']}")
            tensors[key] = arr.astype(np.float64).reshape(info["shape"])
    return tensors


class Model:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        self.arch = c["architectures"][0]
        self.c = c
        self.w = load_safetensors(model_dir)
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads") or self.heads
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        self.eps = c["rms_norm_eps"]
        self.layers = c["num_hidden_layers"]
        self.window = c.get("sliding_window") if self.arch == "MistralForCausalLM" else None
        self.inv_freq, self.pos_scale = self._rope()
        if c.get("tie_word_embeddings"):
            self.lm_head = self.w["model.embed_tokens.weight"]
        else:
            self.lm_head = self.w["lm_head.weight"]

    def _rope(self):
        c, d = self.c, self.head_dim
        params = c.get("rope_parameters") or c.get("rope_scaling") or {}
        theta = params.get("rope_theta", c.get("rope_theta", 10000.0))
        inv = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        kind = params.get("rope_type", params.get("type", "default"))
        if kind == "default":
            return inv, 1.0
        if kind == "linear":
            return inv / params["factor"], 1.0
        if kind == "llama3":
            factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
            old = params["original_max_position_embeddings"]
            low_wavelen, high_wavelen = old / low, old / high
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
            smooth = (old / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
            return np.where(medium, smoothed, scaled), 1.0
        raise ValueError(f"rope type {kind}")

    def rms(self, x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def linear(self, x, prefix):
        y = x @ self.w[prefix + ".weight"].T
        bias = self.w.get(prefix + ".bias")
        return y if bias is None else y + bias

    def rotate(self, x, positions):
        freqs = np.outer(positions, self.inv_freq)
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
        half = x.shape[-1] // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    def forward(self, tokens):
        """Logits [T, V] for every position of `tokens` (causal, full recomputation)."""
        t = len(tokens)
        positions = np.arange(t, dtype=np.float64)
        x = self.w["model.embed_tokens.weight"][tokens]
        mask = np.tril(np.ones((t, t), dtype=bool))
        if self.window:
            q_idx, k_idx = np.meshgrid(np.arange(t), np.arange(t), indexing="ij")
            mask &= k_idx > q_idx - self.window
        group = self.heads // self.kv_heads
        for i in range(self.layers):
            p = f"model.layers.{i}"
            h = self.rms(x, self.w[p + ".input_layernorm.weight"])
            q = self.linear(h, p + ".self_attn.q_proj").reshape(t, self.heads, self.head_dim)
            k = self.linear(h, p + ".self_attn.k_proj").reshape(t, self.kv_heads, self.head_dim)
            v = self.linear(h, p + ".self_attn.v_proj").reshape(t, self.kv_heads, self.head_dim)
            if p + ".self_attn.q_norm.weight" in self.w:
                q = self.rms(q, self.w[p + ".self_attn.q_norm.weight"])
                k = self.rms(k, self.w[p + ".self_attn.k_norm.weight"])
            q, k = self.rotate(q, positions), self.rotate(k, positions)
            k = np.repeat(k, group, axis=1)
            v = np.repeat(v, group, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.head_dim)
            scores = np.where(mask[None], scores, -np.inf)
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            attn = np.einsum("hqk,khd->qhd", probs, v).reshape(t, self.heads * self.head_dim)
            x = x + self.linear(attn, p + ".self_attn.o_proj")
            h = self.rms(x, self.w[p + ".post_attention_layernorm.weight"])
            gate = self.linear(h, p + ".mlp.gate_proj")
            up = self.linear(h, p + ".mlp.up_proj")
            x = x + self.linear(gate / (1 + np.exp(-gate)) * up, p + ".mlp.down_proj")
        x = self.rms(x, self.w["model.norm.weight"])
        return x @ self.lm_head.T


def reference(model, tokens, steps):
    teacher = model.forward(tokens)
    seq, greedy, margins = list(tokens), [], []
    last = teacher[-1]
    for step in range(steps):
        top = np.argsort(last)[-2:]
        greedy.append(int(top[1]))
        margins.append(float(last[top[1]] - last[top[0]]))
        if step + 1 == steps:
            break
        seq.append(greedy[-1])
        last = model.forward(seq)[-1]
    return teacher, greedy, margins


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nervad", required=True)
    p.add_argument("--presets", default=",".join(parity.TINY_PRESETS))
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--positions", type=int, default=40)
    p.add_argument("--workdir", default=None)
    args = p.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="nerva-numpy-parity-")
    rows = []
    for preset in [s for s in args.presets.split(",") if s]:
        row = {"preset": preset, "status": "FAIL", "note": ""}
        try:
            model_dir = os.path.join(work, preset)
            parity.run([args.nervad, "make-model", "--preset", preset, "--out", model_dir,
                        "--seed", str(args.seed), "--force"])
            model = Model(model_dir)
            row["arch"] = model.arch
            vocab = model.c["vocab_size"]
            tokens = parity.prompt_tokens(vocab, args.positions)
            teacher, ref_greedy, margins = reference(model, tokens, args.steps)
            row["min_margin"] = min(margins)
            dump = os.path.join(work, preset + "-dump")
            parity.run([args.nervad, "dump", "--model", model_dir, "--tokens",
                        ",".join(map(str, tokens)), "--steps", str(args.steps), "--out", dump])
            with open(os.path.join(dump, "result.json")) as f:
                result = json.load(f)
            ours = parity.read_logits(os.path.join(dump, "logits.f32"), len(tokens), vocab)
            ok, worst, pos = parity.logits_gate(parity.logit_errors(ours, teacher.tolist()))
            g = parity.greedy_gate(result["greedy_tokens"], ref_greedy, margins)
            row.update(rel_err=worst, agree=g["agree"])
            notes = [] if ok else [f"logits off at position {pos}"]
            if g["first_divergence"] is not None:
                notes.append(f"diverged at step {g['first_divergence']} (ref margin {g['margin']:.3g})")
            row["note"] = "; ".join(notes) + " [numpy float64 reference]"
            row["status"] = "PASS" if ok and g["passed"] else "FAIL"
        except Exception as e:
            row["note"] = f"error: {e}".replace("\n", " ")[:300]
        print(f"[{preset}] {row['status']} {row['note']}", flush=True)
        rows.append(row)
    parity.print_table(rows, args.steps)
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
