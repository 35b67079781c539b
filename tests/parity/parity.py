#!/usr/bin/env python3
"""Parity of nervad against Hugging Face transformers on generated random-weight checkpoints.

For each preset:
  1. `nervad make-model --preset P --out WORK/P --seed S --force` writes the checkpoint;
  2. transformers loads it unchanged (no missing, unexpected or mismatched tensors) in float32;
  3. `nervad dump --model WORK/P --tokens ... --steps N --out WORK/P-dump` writes
     result.json ({"prompt_tokens", "greedy_tokens", "vocab_size", "positions"}) and
     logits.f32 (little-endian f32 [positions, vocab] teacher-forced logits of the prompt);
  4. the same is computed with transformers (eager attention, TF32 off, a manual greedy loop
     over the KV cache so eos cannot stop or bias it);
  5. gates: at every prompt position max|dlogit| <= 1e-3 * max|logit| (reference), and the
     greedy continuation identical for all steps, or, at the first divergence, the reference's
     top-2 margin below 1e-4 (a tie the two implementations may break differently; reported).

Prints a summary table last; exits non-zero if any preset fails.
Needs python3 with torch, transformers and safetensors; no network. See README.md.
"""

import argparse
import array
import json
import os
import subprocess
import sys
import time

TINY_PRESETS = ["tiny", "tiny-llama", "tiny-qwen2", "tiny-mistral"]
ALL_PRESETS = TINY_PRESETS + ["qwen2.5-0.5b", "qwen3-0.6b", "llama3-1b", "qwen3-8b"]

REL_LOGIT_TOL = 1e-3
TIE_MARGIN = 1e-4
# The CUDA backend computes in bf16 weights / bf16 KV with f32 accumulation: its gate is relative
# to the reference's largest logit, and a greedy divergence is accepted only where the
# reference's top-2 margin is below that same bound.
BF16_REL_TOL = 2e-2


# ----------------------------------------------------------------------------------------------
# Gates (pure python so they can be tested without torch: `parity.py --self-test`)
# ----------------------------------------------------------------------------------------------

def logit_errors(ours_rows, ref_rows):
    """Per position: (max |ours - ref|, max |ref|). Rows are sequences of floats."""
    out = []
    for ours, ref in zip(ours_rows, ref_rows):
        if len(ours) != len(ref):
            raise ValueError(f"row length {len(ours)} != {len(ref)}")
        diff = max(abs(a - b) for a, b in zip(ours, ref))
        scale = max(abs(b) for b in ref)
        out.append((diff, scale))
    return out


def logits_gate(errors, tol=REL_LOGIT_TOL):
    """(passed, worst relative error, position of the worst). NaN anywhere fails."""
    worst, worst_pos, passed = 0.0, -1, True
    for pos, (diff, scale) in enumerate(errors):
        if diff != diff or scale != scale:  # NaN
            return False, float("nan"), pos
        rel = diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))
        if rel > worst or worst_pos < 0:
            worst, worst_pos = rel, pos
        if diff > tol * scale:
            passed = False
    return passed, worst, worst_pos


def greedy_gate(ours, ref, ref_margins, tie=TIE_MARGIN):
    """Compare greedy continuations.

    ref_margins[k] is the reference's top-1 minus top-2 logit at step k (given the reference's
    own prefix, which equals ours up to the first divergence). Returns a dict with
    passed, agree (matching prefix length), first_divergence (or None), margin (at it).
    """
    n = min(len(ours), len(ref))
    first = next((k for k in range(n) if ours[k] != ref[k]), None)
    if first is None and len(ours) != len(ref):
        first = n
    if first is None:
        return {"passed": True, "agree": n, "first_divergence": None, "margin": None}
    margin = ref_margins[first] if first < len(ref_margins) else None
    passed = margin is not None and margin < tie
    return {"passed": passed, "agree": first, "first_divergence": first, "margin": margin}


def read_logits(path, positions, vocab):
    data = array.array("f")
    with open(path, "rb") as f:
        data.frombytes(f.read())
    if sys.byteorder != "little":
        data.byteswap()
    if len(data) != positions * vocab:
        raise ValueError(f"{path}: {len(data)} floats, expected {positions} x {vocab}")
    return [data[p * vocab:(p + 1) * vocab] for p in range(positions)]


def prompt_tokens(vocab, count):
    """1, 5, 9, ...: ordinary tokens spread over the start of the vocabulary."""
    return [(1 + 4 * i) % vocab for i in range(count)]


# ----------------------------------------------------------------------------------------------
# Reference (transformers)
# ----------------------------------------------------------------------------------------------

def load_reference(model_dir, device, dtype_name="float32"):
    import torch
    from transformers import AutoModelForCausalLM

    # Exact float32: no TF32 on Ampere+ GPUs.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir,
        dtype=getattr(torch, dtype_name),
        attn_implementation="eager",
        output_loading_info=True,
    )
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise RuntimeError(f"transformers did not load {model_dir} unchanged: {problems}")
    return model.to(device).eval()


def reference_run(model, tokens, steps, device):
    """Teacher-forced logits [P][V] (lists of floats), greedy tokens and top-2 margins."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([tokens], dtype=torch.long, device=device)
        out = model(input_ids=ids, use_cache=True)
        logits = out.logits[0].float()
        teacher = [row.tolist() for row in logits.cpu()]
        past = out.past_key_values
        last = logits[-1]
        greedy, margins = [], []
        for step in range(steps):
            top2 = torch.topk(last, 2)
            next_id = int(top2.indices[0])
            greedy.append(next_id)
            margins.append(float(top2.values[0] - top2.values[1]))
            if step + 1 == steps:
                break
            step_ids = torch.tensor([[next_id]], dtype=torch.long, device=device)
            out = model(input_ids=step_ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            last = out.logits[0, -1].float()
    return teacher, greedy, margins


TOKENIZER_TEXTS = [
    "Hello, world! naïve café 🙂",
    "Numbers 0 1 42 128 65536 3.14159 and 1234567",
    "  two  spaces, a\ttab and\r\nnew lines  ",
    "日本語のテキスト。中文文本。한국어. Ελληνικά. Русский.",
    "decomposed e\u0301 versus composed \u00e9",
    "def f(x):\n    return {'a': [1, 2]}",
]


def check_tokenizer(model_dir, vocab):
    """transformers' AutoTokenizer loads the snapshot, covers every id, and encodes exactly like
    tokenizer.json run through the `tokenizers` library (what nervad uses). transformers 5
    rebuilds some tokenizers (Qwen2Tokenizer) from its own code instead of the file, so this
    catches a generated tokenizer.json that differs from the family's real pipeline."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if len(tok) != vocab:
        raise RuntimeError(f"tokenizer has {len(tok)} ids, config vocab_size is {vocab}")
    raw = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    for text in TOKENIZER_TEXTS:
        for special in (False, True):
            ours = raw.encode(text, add_special_tokens=special).ids
            theirs = tok(text, add_special_tokens=special)["input_ids"]
            if ours != theirs:
                raise RuntimeError(f"{type(tok).__name__} encodes {text!r} as {theirs[:12]}..., "
                                   f"tokenizer.json as {ours[:12]}...")
        ids = raw.encode(text, add_special_tokens=False).ids
        if tok.decode(ids) != raw.decode(ids, skip_special_tokens=False):
            raise RuntimeError(f"decode of {text!r} differs")
    return type(tok).__name__


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------

def run(cmd):
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return time.time() - started


def parity_for_preset(args, preset):
    row = {"preset": preset, "status": "FAIL", "note": ""}
    model_dir = os.path.join(args.workdir, preset)
    if args.checkpoint_root:
        model_dir = os.path.join(args.checkpoint_root, preset)
    else:
        run([args.nervad, "make-model", "--preset", preset, "--out", model_dir,
             "--seed", str(args.seed), "--force"])
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    vocab = config["vocab_size"]
    row["arch"] = config["architectures"][0]
    tokens = prompt_tokens(vocab, args.positions)

    row["tokenizer"] = check_tokenizer(model_dir, vocab)
    if args.tokenizer_only:
        row.update(status="TOK-OK", note=f"{row['tokenizer']} agrees with tokenizer.json")
        return row
    model = load_reference(model_dir, args.device)
    started = time.time()
    teacher, ref_greedy, margins = reference_run(model, tokens, args.steps, args.device)
    row["ref_s"] = time.time() - started
    row["min_margin"] = min(margins)
    del model

    if args.reference_only:
        row.update(status="REF-OK", note=f"greedy head {ref_greedy[:6]}")
        return row

    dump_dir = os.path.join(args.workdir, preset + "-dump")
    row["dump_s"] = run([args.nervad, "dump", "--model", model_dir,
                         "--tokens", ",".join(map(str, tokens)),
                         "--steps", str(args.steps), "--out", dump_dir])
    with open(os.path.join(dump_dir, "result.json")) as f:
        result = json.load(f)
    if result["prompt_tokens"] != tokens:
        raise RuntimeError(f"dump prompt_tokens {result['prompt_tokens']} != {tokens}")
    if result["vocab_size"] != vocab or result["positions"] != len(tokens):
        raise RuntimeError(f"dump shape {result['positions']}x{result['vocab_size']} "
                           f"!= {len(tokens)}x{vocab}")
    ours = read_logits(os.path.join(dump_dir, "logits.f32"), len(tokens), vocab)
    ok_logits, worst, worst_pos = logits_gate(logit_errors(ours, teacher))
    greedy = greedy_gate(result["greedy_tokens"], ref_greedy, margins)
    row.update(rel_err=worst, worst_pos=worst_pos, agree=greedy["agree"])
    notes = []
    if not ok_logits:
        notes.append(f"logits off at position {worst_pos}")
    if greedy["first_divergence"] is not None:
        notes.append(f"diverged at step {greedy['first_divergence']} "
                     f"(ref margin {greedy['margin']:.3g}"
                     f"{' < tie, accepted' if greedy['passed'] else ''})")
    row["note"] = "; ".join(notes)
    row["status"] = "PASS" if ok_logits and greedy["passed"] else "FAIL"
    return row


def gate_row(name, ours_logits, ours_greedy, ref_logits, ref_greedy, margins, steps):
    """bf16 gates of one (ours, reference) pair: logits within BF16_REL_TOL of the reference's
    max |logit| at every position; teacher-forced argmax equal wherever the reference's top-2
    margin exceeds that bound; greedy identical up to the first step whose margin is below it."""
    scale = max(max(abs(v) for v in row) for row in ref_logits)
    bound = BF16_REL_TOL * scale
    worst = max(max(abs(a - b) for a, b in zip(o, r)) for o, r in zip(ours_logits, ref_logits))
    argmax_bad = 0
    for o, r in zip(ours_logits, ref_logits):
        order = sorted(range(len(r)), key=lambda i: -r[i])[:2]
        if r[order[0]] - r[order[1]] > bound and max(range(len(o)), key=lambda i: o[i]) != order[0]:
            argmax_bad += 1
    greedy = greedy_gate(ours_greedy, ref_greedy, margins, tie=bound)
    ok = worst == worst and worst <= bound and argmax_bad == 0 and greedy["passed"]
    notes = []
    if argmax_bad:
        notes.append(f"{argmax_bad} teacher-forced argmax differ above the margin")
    if greedy["first_divergence"] is not None:
        notes.append(f"greedy diverged at {greedy['first_divergence']} (ref margin "
                     f"{greedy['margin']:.3g}, bound {bound:.3g})")
    return {"preset": name, "status": "PASS" if ok else "FAIL", "rel_err": worst / scale,
            "agree": greedy["agree"], "min_margin": min(margins) if margins else 0.0,
            "note": "; ".join(notes)}


def cuda_parity_for_preset(args, preset):
    """The CUDA backend against the CPU reference and against transformers in f32 and bf16."""
    model_dir = os.path.join(args.checkpoint_root or args.workdir, preset)
    if not args.checkpoint_root:
        run([args.nervad, "make-model", "--preset", preset, "--out", model_dir,
             "--seed", str(args.seed), "--force"])
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    vocab = config["vocab_size"]
    tokens = prompt_tokens(vocab, args.positions)
    dumps = {}
    for backend in ["cuda", "cpu"]:
        out = os.path.join(args.workdir, f"{preset}-{backend}-dump")
        run([args.nervad, "dump", "--model", model_dir, "--tokens", ",".join(map(str, tokens)),
             "--steps", str(args.steps), "--out", out, "--backend", backend])
        with open(os.path.join(out, "result.json")) as f:
            result = json.load(f)
        dumps[backend] = (read_logits(os.path.join(out, "logits.f32"), len(tokens), vocab),
                          result["greedy_tokens"])
    ours_logits, ours_greedy = dumps["cuda"]
    rows = []
    refs = []
    for dtype in args.ref_dtypes.split(","):
        model = load_reference(model_dir, args.device, dtype)
        teacher, ref_greedy, margins = reference_run(model, tokens, args.steps, args.device)
        del model
        refs.append((f"hf-{dtype}", teacher, ref_greedy, margins))
    # The CPU reference's greedy margins: those of transformers f32 on the same prefix.
    f32_margins = next((r[3] for r in refs if r[0] == "hf-float32"), refs[0][3] if refs else [])
    cpu_logits, cpu_greedy = dumps["cpu"]
    rows.append(gate_row(f"{preset} vs cpu", ours_logits, ours_greedy, cpu_logits, cpu_greedy,
                         f32_margins, args.steps))
    for name, teacher, ref_greedy, margins in refs:
        rows.append(gate_row(f"{preset} vs {name}", ours_logits, ours_greedy, teacher, ref_greedy,
                             margins, args.steps))
    return rows


def print_table(rows, steps, bf16=False):
    head = f"{'preset':<14} {'architecture':<20} {'max rel err':>12} {'greedy':>8} " \
           f"{'min margin':>11} {'status':>7}  note"
    if bf16:
        print("\nParity summary (bf16 gates: |dlogit| <= %g x max |logit|, argmax and greedy "
              "equal wherever the reference's top-2 margin exceeds that bound, %d steps)"
              % (BF16_REL_TOL, steps))
    else:
        print("\nParity summary (gate: rel err <= %g, greedy %d steps or tie < %g)"
              % (REL_LOGIT_TOL, steps, TIE_MARGIN))
    print(head)
    print("-" * len(head))
    for r in rows:
        rel = f"{r['rel_err']:.3e}" if "rel_err" in r else "-"
        agree = f"{r['agree']}/{steps}" if "agree" in r else "-"
        margin = f"{r['min_margin']:.3g}" if "min_margin" in r else "-"
        print(f"{r['preset']:<14} {r.get('arch', '-'):<20} {rel:>12} {agree:>8} "
              f"{margin:>11} {r['status']:>7}  {r['note']}")


def self_test():
    """The gate logic on synthetic data (runs without torch)."""
    ref = [[1.0, -2.0, 3.0], [0.5, 0.25, -4.0]]
    close = [[1.0 + 1e-4, -2.0, 3.0], [0.5, 0.25, -4.0 - 3e-3]]
    far = [[1.0, -2.0, 3.1], [0.5, 0.25, -4.0]]
    ok, worst, pos = logits_gate(logit_errors(close, ref))
    assert ok and pos == 1 and abs(worst - 3e-3 / 4.0) < 1e-9, (ok, worst, pos)
    ok, worst, pos = logits_gate(logit_errors(far, ref))
    assert not ok and pos == 0, (ok, worst, pos)
    ok, _, _ = logits_gate(logit_errors([[float("nan"), 0, 0], ref[1]], ref))
    assert not ok
    g = greedy_gate([1, 2, 3], [1, 2, 3], [5.0, 5.0, 5.0])
    assert g["passed"] and g["agree"] == 3 and g["first_divergence"] is None
    g = greedy_gate([1, 9, 3], [1, 2, 3], [5.0, 5e-5, 5.0])
    assert g["passed"] and g["first_divergence"] == 1 and g["margin"] == 5e-5
    g = greedy_gate([1, 9, 3], [1, 2, 3], [5.0, 0.5, 5.0])
    assert not g["passed"] and g["agree"] == 1
    g = greedy_gate([1, 2], [1, 2, 3], [5.0, 5.0, 5.0])
    assert not g["passed"] and g["first_divergence"] == 2
    assert prompt_tokens(1024, 4) == [1, 5, 9, 13]
    tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"parity-self-test-{os.getpid()}.f32")
    array.array("f", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).tofile(open(tmp, "wb"))
    rows = read_logits(tmp, 2, 3)
    os.unlink(tmp)
    assert list(rows[1]) == [4.0, 5.0, 6.0]
    print_table([{"preset": "fake", "arch": "FakeForCausalLM", "rel_err": 1e-7, "agree": 3,
                  "min_margin": 0.5, "status": "PASS", "note": ""}], 3)
    print("self-test passed")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nervad", help="path of a prebuilt nervad binary")
    p.add_argument("--presets", default=",".join(TINY_PRESETS),
                   help=f"comma-separated, from: {', '.join(ALL_PRESETS)} (default: the tiny ones)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--steps", type=int, default=64, help="greedy steps")
    p.add_argument("--positions", type=int, default=40,
                   help="prompt length (> the tiny-mistral window of 32)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where transformers runs the reference")
    p.add_argument("--workdir", default=None, help="default: a fresh directory under /tmp")
    p.add_argument("--checkpoint-root", default=None,
                   help="use existing checkpoints ROOT/<preset> instead of running make-model")
    p.add_argument("--reference-only", action="store_true",
                   help="only check that transformers loads and runs the checkpoints")
    p.add_argument("--tokenizer-only", action="store_true",
                   help="only check config and tokenizer loading (needs transformers, not torch)")
    p.add_argument("--self-test", action="store_true", help="test the gate logic and exit")
    p.add_argument("--backend", choices=["cpu", "cuda"], default="cpu",
                   help="nervad backend under test: cpu (1e-3 gates vs transformers f32) or cuda "
                        "(bf16 gates vs the CPU reference and transformers)")
    p.add_argument("--ref-dtypes", default="float32,bfloat16",
                   help="transformers dtypes the CUDA backend is compared with")
    args = p.parse_args()

    if args.self_test:
        self_test()
        return 0
    presets = [s for s in args.presets.split(",") if s]
    unknown = [s for s in presets if s not in ALL_PRESETS]
    if unknown:
        p.error(f"unknown presets {unknown}")
    only_reference = args.reference_only or args.tokenizer_only
    needs_nervad = not only_reference or not args.checkpoint_root
    if needs_nervad and not (args.nervad and os.access(args.nervad, os.X_OK)):
        p.error("--nervad must name an executable nervad binary")
    if args.workdir is None:
        import tempfile
        args.workdir = tempfile.mkdtemp(prefix="nerva-parity-")
    os.makedirs(args.workdir, exist_ok=True)

    rows = []
    for preset in presets:
        print(f"[{preset}] running ...", flush=True)
        try:
            if args.backend == "cuda":
                got = cuda_parity_for_preset(args, preset)
            else:
                got = [parity_for_preset(args, preset)]
        except Exception as e:  # report every preset, then fail overall
            got = [{"preset": preset, "status": "FAIL", "note": f"error: {e}".replace("\n", " ")[:300]}]
        for row in got:
            print(f"[{row['preset']}] {row['status']} {row['note']}", flush=True)
        rows.extend(got)
    print_table(rows, args.steps, bf16=args.backend == "cuda")
    failed = [r for r in rows if r["status"] == "FAIL"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
