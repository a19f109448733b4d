#!/usr/bin/env python3
"""Writes a Hugging Face checkpoint folder with SmolLM2-135M's shape and made-up bf16 weights, for
timing the model where the real weights cannot travel (scripts/device-check.sh's `kvq model bench
--backend cuda`): config.json (SmolLM2-135M-Instruct's shape: 30 layers, hidden 576, 9 heads, 3 kv
heads, ffn 1536, vocab 49152, tied embeddings), model.safetensors (bf16: every matrix a repeated
pattern of small values from a fixed LCG, norms 1.0; 269 MB) and the tiny fixture's tokenizer
(tests/fixtures/hf/smollm2: its ids lie below the vocabulary). Pure Python, no packages. The
weights mean nothing: use it for speed, never for quality.

    scripts/make-synthetic-checkpoint.py OUTDIR [--context N]

--context sets max_position_embeddings (default 8192, SmolLM2's): a longer one lets the bench
measure decode at depths the real model does not reach (issue 47's 32k goal); the weights, and so
the bytes a token reads, are the same.
"""
import json
import pathlib
import shutil
import struct
import sys

SHAPE = dict(hidden=576, ffn=1536, heads=9, kv_heads=3, layers=30, vocab=49152, context=8192)


def pattern(n=65536, seed=12345):
    """n bf16 values in [-0.03, 0.03] from an LCG, as bytes."""
    out = bytearray()
    x = seed
    for _ in range(n):
        x = (1103515245 * x + 12345) % (1 << 31)
        v = (x / (1 << 31) - 0.5) * 0.06
        out += struct.pack("<f", v)[2:4]  # the top half of a float32: bf16 by truncation
    return bytes(out)


def main():
    usage = "usage: scripts/make-synthetic-checkpoint.py OUTDIR [--context N]"
    args = sys.argv[1:]
    s = dict(SHAPE)
    if len(args) == 3 and args[1] == "--context":
        if not args[2].isdigit() or not 1 <= int(args[2]) <= 1 << 20:
            sys.exit(f"--context takes a whole number of tokens in [1, 1048576], got {args[2]!r}")
        s["context"] = int(args[2])
        args = args[:1]
    if len(args) != 1 or args[0].startswith("-"):
        sys.exit(usage)
    out = pathlib.Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    root = pathlib.Path(__file__).resolve().parent.parent
    head_dim = s["hidden"] // s["heads"]
    kvd = s["kv_heads"] * head_dim
    tensors = [("model.embed_tokens.weight", [s["vocab"], s["hidden"]], False),
               ("model.norm.weight", [s["hidden"]], True)]
    for l in range(s["layers"]):
        p = f"model.layers.{l}."
        tensors += [(p + "input_layernorm.weight", [s["hidden"]], True),
                    (p + "post_attention_layernorm.weight", [s["hidden"]], True),
                    (p + "self_attn.q_proj.weight", [s["hidden"], s["hidden"]], False),
                    (p + "self_attn.k_proj.weight", [kvd, s["hidden"]], False),
                    (p + "self_attn.v_proj.weight", [kvd, s["hidden"]], False),
                    (p + "self_attn.o_proj.weight", [s["hidden"], s["hidden"]], False),
                    (p + "mlp.gate_proj.weight", [s["ffn"], s["hidden"]], False),
                    (p + "mlp.up_proj.weight", [s["ffn"], s["hidden"]], False),
                    (p + "mlp.down_proj.weight", [s["hidden"], s["ffn"]], False)]
    header, offset = {}, 0
    for name, shape, _ in tensors:
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    pat = pattern()
    one = struct.pack("<f", 1.0)[2:4]
    tmp = out / "model.safetensors.tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, is_norm in tensors:
            n = 2
            for d in shape:
                n *= d
            if is_norm:
                f.write(one * (n // 2))
                continue
            while n > 0:
                k = min(n, len(pat))
                f.write(pat[:k])
                n -= k
    tmp.replace(out / "model.safetensors")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": s["hidden"], "intermediate_size": s["ffn"],
        "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"],
        "num_hidden_layers": s["layers"], "vocab_size": s["vocab"], "head_dim": head_dim,
        "max_position_embeddings": s["context"], "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
        "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
        "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    fixture = root / "tests" / "fixtures" / "hf" / "smollm2"
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (fixture / f).exists():
            shutil.copy(fixture / f, out / f)
    print(f"wrote {out}: SmolLM2-135M-shaped, {offset / 1e6:.0f} MB of made-up bf16 weights")


if __name__ == "__main__":
    main()
