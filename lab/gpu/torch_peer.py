#!/usr/bin/env python3
"""The PyTorch peer of `gpu_decode`: transformers bf16, static KV cache,
torch.compile(mode="reduce-overhead"), batch-1 greedy decode of a fixed prompt.

    python3 lab/gpu/torch_peer.py --model DIR [--prompt 128] [--tokens 256]

Prints one JSON line: tok/s over the timed decode (after a compile warm-up run), ms/token.
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, StaticCache


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--tokens", type=int, default=256)
    a = p.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).cuda().eval()
    vocab = model.config.vocab_size
    ids = torch.tensor([[(i * 2654435761 >> 7) % vocab for i in range(a.prompt)]], device="cuda")
    max_len = a.prompt + a.tokens + 8
    cache = StaticCache(config=model.config, max_cache_len=max_len)

    def decode_one(tok, pos):
        out = model(input_ids=tok, cache_position=pos, past_key_values=cache, use_cache=True)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    step = torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)

    def run(n):
        cache.reset()
        pos = torch.arange(a.prompt, device="cuda")
        with torch.no_grad():
            out = model(input_ids=ids, cache_position=pos, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(n):
                p_ = torch.tensor([a.prompt + i], device="cuda")
                tok = step(tok.clone(), p_)
            torch.cuda.synchronize()
            return time.perf_counter() - t0

    run(16)  # compile and capture
    run(16)
    dt = run(a.tokens)
    print(json.dumps({"model": a.model, "tok_s": a.tokens / dt, "ms_per_token": dt * 1e3 / a.tokens,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
