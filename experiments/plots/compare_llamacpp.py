#!/usr/bin/env python3
"""Checks kvq's Llama forward pass against an independent implementation: llama.cpp.

kvq's `kvq model logits` writes the next-token logits of every position of a text
(float32 npy [n, vocab], fp32 KV cache) and the token ids it used (JSON). This script
loads the same GGUF with PyPI's llama-cpp-python (llama.cpp built from source, CPU only),
evaluates exactly those ids (no BOS added) with logits for every position, and compares:

  * logits: max |diff| overall; per position its max, mean and 99th percentile; the
    same relative to the logits' scale (max |diff| / max |logit|, mean |diff| / std);
  * top-1 (argmax) agreement over positions;
  * mean KL(ours || llama.cpp) of the softmax distributions (nats), and its max;
  * perplexity of the text under each (logits of positions 0..n-2 predicting ids 1..n-1);
  * tokenization: llm.tokenize(text, add_bos=False, special=False) against kvq's ids.

llama.cpp multiplies Q4_1 weights by activations quantized to Q8_1 on the fly, while kvq
dequantizes the weights to fp32, so small logit differences are expected; a large mismatch
(top-1 agreement well under ~95%, ppl far apart) points to a bug in one forward pass.
By default llama.cpp's KV cache is set to f32 (type_k = type_v = GGML_TYPE_F32) to match
kvq's fp32 cache; --kv-type f16 gives llama.cpp's own default.

--dequantize takes the activation quantization out: llama.cpp's own quantizer
(llama_model_quantize, ftype ALL_F32, allow_requantize) first writes an all-F32 copy of the
GGUF (about 540 MB, in a temporary folder), whose weights are exactly the dequantized Q4_1 /
Q8_0 values kvq uses, and llama.cpp's F32 matmuls keep activations in f32. Then the two
forward passes should agree to float32 rounding (max |diff| ~1e-4, top-1 ~100%).

Run (from the repository root; the venv is throwaway, llama-cpp-python compiles llama.cpp):
    python3 -m venv /tmp/llamavenv
    CMAKE_BUILD_PARALLEL_LEVEL=1 \\
    CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF" \\
        /tmp/llamavenv/bin/pip install llama-cpp-python==0.3.36 numpy
    build/lead/experiments/kvq model logits --kv fp32 --text kjv --max-tokens 300 \\
        --out /tmp/ours.npy --ids-out /tmp/ids.json
    /tmp/llamavenv/bin/python experiments/plots/compare_llamacpp.py \\
        --case kjv=kjv:/tmp/ours.npy:/tmp/ids.json
Several --case NAME=TEXT:OURS_NPY:IDS_JSON may be given (TEXT: a file, or 'kjv' for
${KVQ_MODEL_DIR:-~/.cache/kvq}/kjv.txt). With --kvq BIN and a case written NAME=TEXT (no npy
and ids), the script runs `BIN model logits --kv fp32 --text TEXT --max-tokens N` itself into a
temporary folder. Other options: --model PATH, --threads N, --kv-type f32|f16, --dequantize,
--max-tokens N (for --kvq), --json OUT (all numbers as JSON). Prints a markdown summary.
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import llama_cpp


def model_dir() -> Path:
    return Path(os.environ.get("KVQ_MODEL_DIR") or Path.home() / ".cache" / "kvq")


def text_path(arg: str) -> Path:
    return model_dir() / "kjv.txt" if arg == "kjv" else Path(arg)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def compare_logits(ours: np.ndarray, theirs: np.ndarray, ids: list[int]) -> dict:
    n = ours.shape[0]
    diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
    per_pos_max = diff.max(axis=1)
    scale_max = float(np.abs(ours).max())
    kl = np.empty(n)
    nll_ours = np.empty(max(n - 1, 0))
    nll_theirs = np.empty(max(n - 1, 0))
    for a in range(0, n, 128):  # chunks keep the float64 copies small
        b = min(n, a + 128)
        lo, lt = log_softmax(ours[a:b]), log_softmax(theirs[a:b])
        kl[a:b] = (np.exp(lo) * (lo - lt)).sum(axis=1)
        for i in range(a, min(b, n - 1)):
            nll_ours[i] = -lo[i - a, ids[i + 1]]
            nll_theirs[i] = -lt[i - a, ids[i + 1]]
    top_o, top_t = ours.argmax(axis=1), theirs.argmax(axis=1)
    agree = top_o == top_t
    return {
        "positions": n,
        "max_abs_diff": float(diff.max()),
        "max_abs_diff_at": int(per_pos_max.argmax()),
        "per_pos_max_abs_diff": {"max": float(per_pos_max.max()), "mean": float(per_pos_max.mean()),
                                 "p99": float(np.percentile(per_pos_max, 99))},
        "mean_abs_diff": float(diff.mean()),
        "max_abs_logit_ours": scale_max,
        "logit_std_ours": float(ours.std()),
        "rel_max_diff": float(diff.max()) / scale_max,
        "rel_mean_diff": float(diff.mean()) / float(ours.std()),
        "top1_agree": float(agree.mean()),
        "top1_disagree_positions": [int(i) for i in np.nonzero(~agree)[0]],
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "kl_max_at": int(kl.argmax()),
        "ppl_ours": float(np.exp(nll_ours.mean())) if n > 1 else float("nan"),
        "ppl_llamacpp": float(np.exp(nll_theirs.mean())) if n > 1 else float("nan"),
        "nll_mean_abs_diff": float(np.abs(nll_ours - nll_theirs).mean()) if n > 1 else float("nan"),
    }


def compare_tokens(llm, text: str, ids: list[int]) -> dict:
    # Tokenize a prefix long enough to cover the ids (pre-tokenizer splits are local, so only the
    # last word of the prefix can differ from a whole-text tokenization), or the whole text.
    limit = max(200_000, 40 * len(ids))
    prefix = text if len(text) <= limit else text[:limit]
    t0 = time.perf_counter()
    theirs = llm.tokenize(prefix.encode("utf-8"), add_bos=False, special=False)
    secs = time.perf_counter() - t0
    if len(prefix) < len(text):
        theirs = theirs[:len(ids)]
    m = min(len(ids), len(theirs))
    first = next((i for i in range(m) if ids[i] != theirs[i]), None)
    if first is None and len(ids) != len(theirs):
        first = m
    out = {"n_ours": len(ids), "n_llamacpp": len(theirs), "identical": first is None,
           "whole_text": len(prefix) == len(text), "seconds": secs}
    if first is not None:
        a = max(0, first - 3)
        dec = lambda xs: [llm.detokenize([x]).decode("utf-8", "backslashreplace") for x in xs]
        out["first_mismatch"] = first
        out["ours_around"] = list(zip(ids[a:first + 5], dec(ids[a:first + 5])))
        out["llamacpp_around"] = list(zip(theirs[a:first + 5], dec(theirs[a:first + 5])))
    return out


def dequantize_model(src: str, dst: Path, threads: int) -> str:
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    p.allow_requantize = True
    p.nthread = threads
    rc = llama_cpp.llama_model_quantize(src.encode(), str(dst).encode(), ctypes.byref(p))
    if rc != 0:
        sys.exit(f"llama_model_quantize to F32 failed ({rc})")
    return str(dst)


def run_kvq(kvq: str, text: str, max_tokens: int, tmp: Path, name: str) -> tuple[Path, Path]:
    npy, ids = tmp / f"{name}.npy", tmp / f"{name}.json"
    subprocess.run([kvq, "model", "logits", "--kv", "fp32", "--text", text, "--max-tokens", str(max_tokens),
                    "--out", str(npy), "--ids-out", str(ids)], check=True, stdout=sys.stderr)
    return npy, ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", required=True,
                    help="NAME=TEXT:OURS_NPY:IDS_JSON, or NAME=TEXT with --kvq")
    ap.add_argument("--model", default=str(model_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-type", choices=["f32", "f16"], default="f32")
    ap.add_argument("--kvq", help="kvq binary, to produce the logits of cases given as NAME=TEXT")
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--json", help="write all numbers here")
    ap.add_argument("--dequantize", action="store_true",
                    help="compare against llama.cpp running an all-F32 copy of the model (exact weights)")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    model_name = Path(args.model).name
    if args.dequantize:
        args.model = dequantize_model(args.model, Path(tmp.name) / "model-f32.gguf", args.threads)

    kv_type = llama_cpp.GGML_TYPE_F32 if args.kv_type == "f32" else llama_cpp.GGML_TYPE_F16
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=args.model, logits_all=True, n_ctx=2048, n_batch=512,
                          n_threads=args.threads, n_threads_batch=args.threads,
                          type_k=kv_type, type_v=kv_type, verbose=False)
    load_s = time.perf_counter() - t0
    results = {"llama_cpp_python": llama_cpp.__version__, "kv_type": args.kv_type,
               "dequantized": args.dequantize,
               "threads": args.threads, "model": args.model, "load_seconds": load_s, "cases": {}}

    with tmp as tmpd:
        for spec in args.case:
            name, _, rest = spec.partition("=")
            parts = rest.split(":")
            if len(parts) == 1:
                if not args.kvq:
                    ap.error(f"case {name}: give OURS_NPY and IDS_JSON, or --kvq")
                npy, idp = run_kvq(args.kvq, parts[0], args.max_tokens, Path(tmpd), name)
            elif len(parts) == 3:
                npy, idp = Path(parts[1]), Path(parts[2])
            else:
                ap.error(f"bad --case {spec!r}")
            text = text_path(parts[0]).read_bytes().decode("utf-8")  # no newline translation
            ours = np.load(npy)
            ids = json.loads(idp.read_text())
            assert ours.shape == (len(ids), llm.n_vocab()), (ours.shape, len(ids), llm.n_vocab())
            assert len(ids) <= llm.n_ctx(), "raise n_ctx"

            llm.reset()
            t1 = time.perf_counter()
            llm.eval(ids)
            eval_s = time.perf_counter() - t1
            theirs = np.array(llm.scores[:len(ids)], dtype=np.float32)
            r = {"eval_seconds": eval_s, **compare_logits(ours, theirs, ids),
                 "tokenization": compare_tokens(llm, text, ids)}
            results["cases"][name] = r

    print(f"## kvq vs llama.cpp (llama-cpp-python {results['llama_cpp_python']}, "
          f"llama.cpp KV {args.kv_type}, {args.threads} threads, "
          f"{'all-F32 dequantized copy of ' if args.dequantize else ''}{model_name})\n")
    print("| text | tokens | max abs diff | per-pos max: mean / p99 / max | max diff / max logit "
          "| mean diff / std | top-1 agree | mean KL (max) | ppl ours | ppl llama.cpp | tokenization |")
    print("|---|---:|---:|---|---:|---:|---:|---|---:|---:|---|")
    for name, r in results["cases"].items():
        p, t = r["per_pos_max_abs_diff"], r["tokenization"]
        tok = "identical" if t["identical"] else f"differs at {t['first_mismatch']}"
        tok += f" ({t['n_ours']} vs {t['n_llamacpp']}{'' if t['whole_text'] else ', prefix'})"
        print(f"| {name} | {r['positions']} | {r['max_abs_diff']:.4f} (pos {r['max_abs_diff_at']}) "
              f"| {p['mean']:.4f} / {p['p99']:.4f} / {p['max']:.4f} | {r['rel_max_diff']:.2e} "
              f"| {r['rel_mean_diff']:.2e} | {100 * r['top1_agree']:.2f}% "
              f"| {r['kl_mean']:.2e} ({r['kl_max']:.2e} @ {r['kl_max_at']}) | {r['ppl_ours']:.4f} "
              f"| {r['ppl_llamacpp']:.4f} | {tok} |")
    for name, r in results["cases"].items():
        if r["top1_disagree_positions"]:
            print(f"\n{name}: top-1 differs at positions {r['top1_disagree_positions'][:20]}")
        t = r["tokenization"]
        if not t["identical"]:
            print(f"\n{name}: tokenization differs at {t['first_mismatch']}:\n  ours     {t['ours_around']}"
                  f"\n  llama.cpp {t['llamacpp_around']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
