#!/usr/bin/env python3
"""Writes tests/fixtures/hf/<family>/: tiny random Hugging Face checkpoints of each architecture kvq
loads, real tokenizers trained on KJV, and what transformers computes with them (issue 49 item 3).

For each family (llama, llama3, mistral, qwen2, qwen3, smollm2, and qwen3_fp8: Qwen3 in the
block-scaled FP8 checkpoint format) it writes what a user's
checkpoint folder holds, as transformers' own save_pretrained writes it:
    config.json, generation_config.json, model.safetensors (or model-0000k-of-0000n.safetensors
    and model.safetensors.index.json), tokenizer.json, tokenizer_config.json, chat_template.jinja
and beside them, what the C++ tests compare against:
    expected.json         the prompt, its ids, the greedy continuation, how each value was made
    expected.safetensors  transformers' fp32 logits and K/V (names in tests/fixtures/hf/README.md)
    tokenizer_cases.json  strings with their ids and decodes from the `tokenizers` library
    quantized_cache.safetensors / .json  (families in QUANT_FAMILIES) transformers' QuantizedCache
                          (quanto backend) logits, one token per forward pass (see below)
    quantized_cache_hqq.safetensors / .json  (families in HQQ_FAMILIES) the same with
                          backend="hqq" (see below)
tests/fixtures/hf/README.md documents every file, key, dtype and shape.

Where each value comes from (independent of kvq's C++):
- Weights: random normal (seed SEED + family index) with std WEIGHT_STD for matrices and the
  embedding, 1 + NORM_STD * normal for RMSNorm weights (so a loader that skips a norm fails),
  BIAS_STD * normal for Qwen2's q/k/v biases; cast to the family's dtype and saved by
  `model.save_pretrained` (max_shard_size for the sharded family).
- config.json: as save_pretrained writes it (transformers 5 keys: "dtype", "rope_parameters"),
  except the families with legacy_config=True, whose config.json is rewritten into the keys the
  published hub checkpoints carry (transformers 4: "torch_dtype", "rope_theta", "rope_scaling";
  Qwen2's "use_sliding_window": false next to a "sliding_window" number, which must be
  ignored). transformers 5.25 loads both forms; the logits come from loading the folder as
  written, and the generator asserts that the rewritten config loads to the same model config.
- Tokenizers: BPE models trained with `tokenizers` on ~/.cache/kvq/kjv.txt, wrapped in the
  normalizer / pre-tokenizer / post-processor / decoder each family's published tokenizer.json
  declares (Llama-2: the legacy SentencePiece-style Prepend+Replace normalizer and byte
  fallback, as transformers' convert_slow_tokenizer.LlamaConverter writes it; Mistral: the
  non-legacy Metaspace(prepend_scheme="first", split=False) pre-tokenizer of the same converter
  with byte fallback; Llama-3: Split(regex) + ByteLevel, ignore_merges; Qwen2/Qwen3:
  NFC + Split(Qwen's regex) + ByteLevel; SmolLM2: GPT-2's Digits + ByteLevel(use_regex)),
  then saved through transformers' TokenizersBackend.save_pretrained. The ids in expected.json
  and tokenizer_cases.json come from `tokenizers.Tokenizer.from_file` on the SAVED
  tokenizer.json; transformers' AutoTokenizer is checked to agree (recorded per case).
- Logits: AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
  attn_implementation="eager") (the bf16/fp16 weights upcast exactly), one forward pass over
  the prompt with a DynamicCache() (fp32, every layer full length; the sliding window is a mask,
  kv_idx > q_idx - sliding_window, i.e. each query sees itself and the W-1 tokens before it).
  K/V: that cache's layers[0].keys / .values after the prompt: post-RoPE keys, shape
  [1, n_kv_heads, n, head_dim], as transformers' past_key_values hold them. Greedy: argmax
  decoding from the prompt logits with the same cache, one token per forward pass; the logits
  of each decode step are stored too.

How transformers' QuantizedCache (quanto backend) differs from KIVI and from kvq, read from
transformers 5.25 cache_utils.py (QuantizedLayer.update, QuantoQuantizedLayer) and optimum-quanto
0.2.7 (MaxOptimizer, tensor/grouped.py group(), quantize_affine, QBitsDequantizer); the full
statements are the QUANTO_VS_KIVI dict below, copied into each quantized_cache.json:
  - parameters stay in the cache dtype (float32 here): scale = (max - min) / (2^b - 1),
    shift = -min, code = clamp(round((x + shift) / scale), 0, 2^b - 1) in float32,
    x' = scale * code - shift. KIVI/kvq keep fp16 scale and min (kvq: exact quotient).
  - groups: axis=0 is G consecutive head_dim channels of one token (per token); axis=-1 is G
    consecutive rows of the flattened [batch * heads * seq] per channel (G tokens when G | seq),
    and raises unless G divides batch * heads * seq at every quantization.
  - the first update (the prefill) quantizes every token and keeps no residual, but attends the
    exact K/V; later tokens stay exact in a residual until residual + new >= residual_length,
    then the whole cache is quantized again from its dequantized values (after that step's
    attention). KIVI keeps a window of R exact tokens and never re-quantizes.
  - what can be matched: residual_length=1, one token per forward pass from token 0, per-token
    axes for K and V (kvq int<B>:k=token,v=token,g=G,r=1): the same tokens are quantized at
    every step. With quanto's parameters rounded to fp16 (the *_fp16params settings, a
    replaced MaxOptimizer) the codes equal kvq's unless a float32 quotient falls on the other
    side of a tie (min_tie_distance in quantized_cache.json bounds that) or kvq's own K/V
    (~1e-6 from torch's) lie closer than that to a code or fp16-parameter rounding boundary
    (min_boundary_margin records the codes' closest; tests/model/hf_quantized_cache_test.cpp
    states the tolerance this leaves). KIVI's own axes
    (per-channel keys) cannot be matched step for step; the kivi_* settings are stored for a
    distributional comparison.

How the hqq backend differs (transformers 5.25 HQQQuantizedLayer, hqq 0.2.8.post1
core/quantize.py Quantizer.quantize, core/optimize.py optimize_weights_proximal_legacy; the full
statements are the HQQ_VS_KIVI dict, copied into quantized_cache_hqq.json):
  - axes: axis=1 is G consecutive head_dim channels of one token (per token, quanto's axis 0);
    axis=0 is one channel at G tokens spaced heads*seq/G apart (strided, not KIVI's consecutive
    tokens). The same QuantizedLayer.update as quanto (exact prefill, flush, re-quantization).
  - optimize=False: scale_inv = (2^b - 1) / (max - min), zero = -min * scale_inv (float32, not
    rounded), code = round(x * scale_inv + zero): min/max with float32 parameters, as quanto.
  - optimize=True (hqq's default, what transformers calls): a proximal solver moves each group's
    zero (scale kept) by a fraction of a step to lower an l_0.7 error, stopping on the whole
    tensor's mean error. At axis 0 every flush regroups the keys and moves old tokens.
  - what can be matched: axis 1 for K and V, residual_length=1, one token per forward pass, with
    hqq's optimizer replaced by one returning kvq's fp16 min/max parameters (the *_fp16params
    settings; codes asserted equal to kvq's exact rule); the optimized settings (transformers'
    own call) are stored for a distributional comparison.

Run (from the repository root, with the pinned packages of requirements-hf-fixtures.txt in a
throwaway venv; no hub access is needed, nothing is downloaded):
    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install -r experiments/plots/requirements-hf-fixtures.txt
    /tmp/hfvenv/bin/python experiments/plots/make_hf_fixtures.py
Options: --kjv PATH (default ${KVQ_MODEL_DIR:-~/.cache/kvq}/kjv.txt), --out DIR (default
tests/fixtures/hf), --only FAMILY[,FAMILY], --no-quant (skip the QuantizedCache files).
"""

import argparse
import importlib.metadata
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

SEED = 4900
WEIGHT_STD = 0.16
NORM_STD = 0.1
BIAS_STD = 0.1
GREEDY_TOKENS = 10
SPM_VOCAB = 448  # Llama-2 / Mistral tokenizers: 3 specials + 256 byte tokens + 189 trained
BYTE_VOCAB = 448  # byte-level tokenizers: 256 bytes + trained merges, before special tokens

PINNED = {
    "torch": "2.15.0",
    "transformers": "5.25.0",
    "tokenizers": "0.23.3",
    "safetensors": "0.8.0",
    "numpy": "2.4.6",
    "optimum-quanto": "0.2.7",
    "accelerate": "1.16.0",  # transformers needs it to load (dequantize) the FP8 checkpoint
}

# Llama-3's pre-tokenizer regex (meta-llama/Llama-3.2-1B tokenizer.json)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2/2.5/3's pre-tokenizer regex (Qwen/Qwen2.5-0.5B tokenizer.json): digits one at a time
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Bytes SmolLM2's real vocabulary has no token for (a subset), left out of its alphabet here
SMOLLM2_MISSING_BYTES = [0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xF1, 0xF2]

LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN3_EXTRA = ["<tool_call>", "</tool_call>", "<think>", "</think>"]  # added, not special
SMOLLM2_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<repo_name>",
    "<reponame>",
    "<file_sep>",
    "<filename>",
    "<gh_stars>",
    "<issue_start>",
    "<issue_comment>",
    "<issue_closed>",
    "<jupyter_start>",
    "<jupyter_text>",
    "<jupyter_code>",
    "<jupyter_output>",
    "<jupyter_script>",
    "<empty_output>",
]

# Chat templates: the essentials of each family's published template
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
MISTRAL_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + ' [/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
)
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# fmt: off
# Sizes: 2 layers, GQA 2:1, vocabulary ~450-580, intermediate 128: every folder is a few hundred
# KB. Llama-2 and Qwen2 keep hidden = heads * head_dim with no head_dim key, as published; the
# others carry head_dim in config.json (hidden 64, two heads of 64 or 128).
FAMILIES = {
    # Llama-2 (meta-llama/Llama-2-7b-hf): fp16 as published, untied, legacy SentencePiece BPE,
    # config.json without head_dim.
    "llama": dict(
        tokenizer="llama2", arch="llama", dtype=torch.float16, shard=None, legacy_config=True,
        drop_head_dim=True, tokenizer_class="LlamaTokenizer",
        config=dict(hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)),
    # Llama-3.2 (meta-llama/Llama-3.2-1B): bf16, tied, rope_scaling llama3, sharded into files.
    # original_max_position_embeddings is 32 so that all three llama3 bands occur at head_dim 64.
    "llama3": dict(
        tokenizer="llama3", arch="llama", dtype=torch.bfloat16, shard="200KB", legacy_config=True,
        drop_head_dim=False, tokenizer_class="PreTrainedTokenizerFast",
        config=dict(hidden_size=64, head_dim=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                    rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0, original_max_position_embeddings=32))),
    # Mistral-7B: bf16, untied, sliding_window (8 here, shorter than the prompt); head_dim in
    # config.json as Mistral-Nemo's (hidden 64 != 2 heads * 64).
    "mistral": dict(
        tokenizer="mistral", arch="mistral", dtype=torch.bfloat16, shard=None, legacy_config=True,
        drop_head_dim=False, tokenizer_class="LlamaTokenizer",
        config=dict(hidden_size=64, head_dim=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                    sliding_window=8)),
    # Qwen2.5-0.5B: bf16, tied, q/k/v biases, vocab padded past the tokenizer, no sliding window
    # (use_sliding_window false beside a sliding_window number, as published), no head_dim key.
    "qwen2": dict(
        tokenizer="qwen2", arch="qwen2", dtype=torch.bfloat16, shard=None, legacy_config=True,
        drop_head_dim=True, tokenizer_class="Qwen2Tokenizer", pad_vocab_to=64,
        config=dict(hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                    rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                    use_sliding_window=False, sliding_window=32768, max_window_layers=21)),
    # Qwen3-0.6B: q_norm/k_norm, head_dim 128 with hidden 64 (q dim 256 != hidden), tied, bf16;
    # transformers 5's own config.json keys.
    "qwen3": dict(
        tokenizer="qwen3", arch="qwen3", dtype=torch.bfloat16, shard=None, legacy_config=False,
        pad_vocab_to=64,
        config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                    max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    tie_word_embeddings=True)),
    # SmolLM2-135M: LlamaForCausalLM, tied, GPT-2-style byte-level BPE; fp32 here (the fp32
    # family); transformers 5's own config.json keys.
    "smollm2": dict(
        tokenizer="smollm2", arch="llama", dtype=torch.float32, shard=None, legacy_config=False,
        config=dict(hidden_size=64, head_dim=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                    rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True)),
    # Qwen3 as published in FP8 (Qwen/Qwen3-*-FP8, DeepSeek-V3's format): the attention and MLP
    # projections stored F8_E4M3 with a float32 `weight_scale_inv` per block of
    # fp8_block = [rows, cols] (the dequantized weight is fp8 * weight_scale_inv; published
    # checkpoints use [128, 128], 32 here so that every matrix has several blocks each way);
    # embeddings and norms bf16; "quantization_config" {"quant_method": "fp8", "fmt": "e4m3",
    # "activation_scheme": "dynamic", "weight_block_size"} in config.json. transformers on a CPU
    # dequantizes such a checkpoint at load (Fp8Dequantize: fp8.float() * scale, in float32).
    "qwen3_fp8": dict(
        tokenizer="qwen3", arch="qwen3", dtype=torch.bfloat16, shard=None, legacy_config=False,
        pad_vocab_to=64, fp8_block=[32, 32],
        config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                    max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    tie_word_embeddings=True)),
}
# fmt: on
QUANT_FAMILIES = ["llama", "qwen3"]

# The prompt: KJV Genesis 1:1-2a for every family (token counts per tokenizer in expected.json);
# mistral's is longer than its window of 8 either way.
PROMPT = (
    "In the beginning God created the heaven and the earth. And the earth was without form, "
    "and void;"
)

TOKENIZER_CASES = [
    ("kjv_verse", "In the beginning God created the heaven and the earth."),
    ("kjv_two_lines", None),  # Genesis 1:3-4 joined by a newline, filled from the KJV file
    ("leading_spaces", "   start"),
    ("trailing_spaces", "end   "),
    ("multiple_spaces", "a  b   c    d"),
    ("single_space", " "),
    ("empty", ""),
    ("newlines", "line1\nline2\n\nline3\n\n\n"),
    ("tabs", "\tindented\t\tcode\t"),
    ("mixed_whitespace", " \n \t\r\n x \r\n"),
    ("digits", "12345678 and 3.14 in 2024"),
    ("contractions", "It's the cat's toy; don't, they're, we've, I'm, you'll, he'd. IT'S DON'T"),
    ("accents", "café résumé naïve Zürich"),
    ("combining_marks", "cafe\u0301 n\u0303o A\u030a"),
    ("cjk", "中文分词测试，你好世界。"),
    ("emoji", "I love 🦀 and 👍🏽!"),
    ("unencodable_bytes", "x\x04y \x13\x1d z \U00050000 ok"),
    ("punctuation", "Wait... what?!?! --- ((x)) ;; <<>>"),
    ("code", "def f(x):\n    return x**2  # square\n"),
    ("special_text", None),  # the family's special tokens' text inside a string
    ("special_near_miss", None),
]


def kjv_lines(path):
    return Path(path).read_text(encoding="utf-8").splitlines()


def byte_token(b):
    return f"<0x{b:02X}>"


# ---------------------------------------------------------------------------------------------
# Tokenizers


def train_spm_bpe(lines, vocab_size):
    """A SentencePiece-style BPE (pieces start with '▁', never span words) trained on lines.
    Returns (vocab dict, merges list) with ids: <unk>, <s>, </s>, <0x00>..<0xFF>, then trained."""
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    alphabet = list("0123456789") + ["▁"]
    tr = trainers.BpeTrainer(
        vocab_size=vocab_size - 3 - 256, initial_alphabet=alphabet, show_progress=False
    )
    t.train_from_iterator(lines, tr)
    j = json.loads(t.to_str())
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[byte_token(b)] = len(vocab)
    for tok, _ in sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1]):
        vocab[tok] = len(vocab)
    merges = [tuple(m) for m in j["model"]["merges"]]
    return vocab, merges


def spm_tokenizer(lines, legacy):
    """Llama-2 (legacy=True) or Mistral (legacy=False) tokenizer.json structure, per
    transformers' convert_slow_tokenizer.LlamaConverter."""
    vocab, merges = train_spm_bpe(lines, SPM_VOCAB)
    t = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    )
    if legacy:
        t.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
        t.pre_tokenizer = None
    else:
        t.normalizer = None
        t.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first", split=False
        )
    t.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    t.add_special_tokens(
        [AddedToken(s, special=True, normalized=False) for s in ("<unk>", "<s>", "</s>")]
    )
    t.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return t


def train_byte_bpe(lines, pre_tok, normalizer, n_merged, leading_specials=(), missing_bytes=()):
    """Byte-level BPE trained with the family's own pre-tokenizer. Returns (vocab, merges)."""
    t = Tokenizer(models.BPE())
    t.normalizer = normalizer
    t.pre_tokenizer = pre_tok
    byte_chars = bytes_to_unicode()
    missing = {byte_chars[b] for b in missing_bytes}
    alphabet = [c for c in byte_chars.values() if c not in missing]
    tr = trainers.BpeTrainer(
        vocab_size=n_merged + len(leading_specials),
        initial_alphabet=alphabet,
        special_tokens=list(leading_specials),
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    t.train_from_iterator(lines, tr)
    j = json.loads(t.to_str())
    vocab = dict(sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1]))
    for c in missing:
        assert c not in vocab, c
    merges = [tuple(m) for m in j["model"]["merges"]]
    return vocab, merges


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (what ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def llama3_tokenizer(lines):
    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    vocab, merges = train_byte_bpe(lines, pre, None, BYTE_VOCAB)
    t = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    t.normalizer = None
    t.pre_tokenizer = pre
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in LLAMA3_SPECIALS])
    bos = t.token_to_id("<|begin_of_text|>")
    t.post_processor = processors.Sequence(
        [
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                special_tokens=[("<|begin_of_text|>", bos)],
            ),
        ]
    )
    t.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    return t


def qwen_tokenizer(lines, qwen3):
    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    vocab, merges = train_byte_bpe(lines, pre, normalizers.NFC(), BYTE_VOCAB)
    t = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in QWEN_SPECIALS])
    if qwen3:
        t.add_tokens([AddedToken(s, special=False, normalized=False) for s in QWEN3_EXTRA])
    t.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    # Qwen's decoder is ByteLevel with all three flags false; `decoders.ByteLevel()` takes no
    # flags (they do not change decoding), so they are set in the JSON
    j = json.loads(t.to_str())
    j["decoder"] = dict(
        type="ByteLevel", add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    return Tokenizer.from_str(json.dumps(j))


def smollm2_tokenizer(lines):
    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    vocab, merges = train_byte_bpe(
        lines,
        pre,
        None,
        BYTE_VOCAB - len(SMOLLM2_MISSING_BYTES),
        leading_specials=SMOLLM2_SPECIALS,
        missing_bytes=SMOLLM2_MISSING_BYTES,
    )
    t = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    t.normalizer = None
    t.pre_tokenizer = pre
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SMOLLM2_SPECIALS])
    t.post_processor = processors.ByteLevel(
        add_prefix_space=True, trim_offsets=False, use_regex=True
    )
    t.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    return t


# Per tokenizer: the Tokenizer, the special-token arguments of tokenizer_config.json, template
def build_tokenizer(kind, lines):
    if kind == "llama2":
        return (
            spm_tokenizer(lines, legacy=True),
            dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>"),
            None,
        )
    if kind == "mistral":
        return (
            spm_tokenizer(lines, legacy=False),
            dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>"),
            MISTRAL_TEMPLATE,
        )
    if kind == "llama3":
        return (
            llama3_tokenizer(lines),
            dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"),
            LLAMA3_TEMPLATE,
        )
    if kind == "qwen2":
        return (
            qwen_tokenizer(lines, qwen3=False),
            dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
            QWEN_TEMPLATE,
        )
    if kind == "qwen3":
        return (
            qwen_tokenizer(lines, qwen3=True),
            dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
            QWEN3_TEMPLATE,
        )
    if kind == "smollm2":
        return (
            smollm2_tokenizer(lines),
            dict(
                bos_token="<|im_start|>",
                eos_token="<|im_end|>",
                unk_token="<|endoftext|>",
                pad_token="<|im_end|>",
            ),
            SMOLLM2_TEMPLATE,
        )
    raise ValueError(kind)


def special_strings(kind):
    """(special_text, special_near_miss) for the family's tokenizer cases."""
    if kind in ("llama2", "mistral"):
        return "<s>hello</s> <s> [INST] hi [/INST]</s><unk>", "<s >hello< /s> <s</s>x"
    if kind == "llama3":
        return (
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
            "<|begin_of_text |> <|eot_id| <|eot_id|>x",
        )
    if kind == "qwen3":
        return (
            "<|im_start|>user\nhi<|im_end|>\n<think>\nhmm\n</think>\n\nok<|endoftext|>",
            "<|im_start |> <|im_end| <|im_end|>x <think >",
        )
    return (
        "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><|endoftext|>",
        "<|im_start |> <|im_end| <|im_end|>x",
    )


# ---------------------------------------------------------------------------------------------
# Models


def make_config(arch, family_cfg, vocab_size, bos_id, eos_id, pad_id):
    cfg = dict(family_cfg)
    cfg.update(vocab_size=vocab_size, bos_token_id=bos_id, eos_token_id=eos_id)
    if pad_id is not None:
        cfg["pad_token_id"] = pad_id
    rope_scaling = cfg.pop("rope_scaling", None)
    theta = cfg.pop("rope_theta")
    rope = {"rope_type": "default", "rope_theta": theta}
    if rope_scaling:
        rope = dict(rope_scaling, rope_theta=theta)
    cfg["rope_parameters"] = rope
    cls = {
        "llama": LlamaConfig,
        "mistral": MistralConfig,
        "qwen2": Qwen2Config,
        "qwen3": Qwen3Config,
    }
    return cls[arch](**cfg)


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + NORM_STD * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(BIAS_STD * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(WEIGHT_STD * torch.randn(p.shape, generator=gen))


def legacy_config(folder, arch, spec):
    """Rewrites config.json into the keys the published (transformers 4) checkpoints carry."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    rope_type = rope.get("rope_type", "default")
    cfg["rope_scaling"] = rope if rope_type != "default" else None
    cfg["torch_dtype"] = cfg.pop("dtype")
    cfg.pop("layer_types", None)
    if spec.get("drop_head_dim") and "head_dim" in cfg:
        assert cfg["head_dim"] * cfg["num_attention_heads"] == cfg["hidden_size"]
        del cfg["head_dim"]
    if arch == "qwen2":
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = spec["config"]["sliding_window"]
        cfg["max_window_layers"] = spec["config"]["max_window_layers"]
    cfg = dict(sorted(cfg.items()))
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def legacy_tokenizer_config(folder, spec, special_args, template):
    """Rewrites tokenizer_config.json into the keys the published checkpoints carry (transformers
    4: the tokenizer class the family names, add_bos_token, the chat template inline) and drops
    chat_template.jinja. tokenizer.json is untouched."""
    path = folder / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg.pop("backend", None)
    cfg["tokenizer_class"] = spec["tokenizer_class"]
    if spec["tokenizer"] in ("llama2", "mistral"):
        cfg["add_bos_token"] = True
        cfg["add_eos_token"] = False
        cfg["legacy"] = spec["tokenizer"] == "llama2"
    cfg["clean_up_tokenization_spaces"] = False
    jinja = folder / "chat_template.jinja"
    if template is not None:
        cfg["chat_template"] = jinja.read_text()
        jinja.unlink()
    path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2, ensure_ascii=False) + "\n")


FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def fp8_checkpoint(folder, block):
    """Rewrites model.safetensors with the projections in block-scaled F8_E4M3 (DeepSeek-V3 /
    Qwen3-FP8 layout) and adds quantization_config to config.json."""
    from safetensors import safe_open

    path = folder / "model.safetensors"
    tensors = {}
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
        for name in f.keys():
            tensors[name] = f.get_tensor(name)
    out = {}
    for name, w in tensors.items():
        if not (name.endswith(".weight") and name.split(".")[-2] in FP8_PROJECTIONS):
            out[name] = w
            continue
        rows, cols = w.shape
        br, bc = block
        assert rows % br == 0 and cols % bc == 0, (name, w.shape)
        x = w.float().reshape(rows // br, br, cols // bc, bc)
        amax = x.abs().amax(dim=(1, 3), keepdim=True)
        scale = amax / FP8_MAX  # float32, one per block
        q = (x / scale).to(torch.float8_e4m3fn)
        out[name] = q.reshape(rows, cols).contiguous()
        out[name + "_scale_inv"] = scale.reshape(rows // br, cols // bc).contiguous()
    save_file(out, str(path), metadata=metadata)
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": list(block),
    }
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def forward_and_greedy(model, ids):
    """fp32 prompt logits, the prompt's K/V per layer, greedy tokens and their step logits."""
    cache = DynamicCache()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    logits = out.logits[0].float().clone()
    kv = {}
    kv["k.0"] = cache.layers[0].keys.clone()
    kv["v.0"] = cache.layers[0].values.clone()
    greedy, step_logits = [], []
    nxt = int(logits[-1].argmax())
    for _ in range(GREEDY_TOKENS):
        greedy.append(nxt)
        with torch.no_grad():
            o = model(input_ids=torch.tensor([[nxt]]), cache=cache, use_cache=True)
        step_logits.append(o.logits[0, -1].float().clone())
        nxt = int(step_logits[-1].argmax())
    return logits, kv, greedy, torch.stack(step_logits)


# ---------------------------------------------------------------------------------------------


def tokenizer_cases(tok, hf_tok, kind, lines):
    special_text, near_miss = special_strings(kind)
    cases = []
    for name, text in TOKENIZER_CASES:
        if name == "kjv_two_lines":
            text = lines[2] + "\n" + lines[3]
        elif name == "special_text":
            text = special_text
        elif name == "special_near_miss":
            text = near_miss
        rec = {"name": name, "text": text}
        for add in (False, True):
            enc = tok.encode(text, add_special_tokens=add)
            key = "with_special" if add else "plain"
            rec[f"ids_{key}"] = enc.ids
            rec[f"tokens_{key}"] = enc.tokens
            rec[f"decode_{key}"] = tok.decode(enc.ids, skip_special_tokens=False)
            rec[f"decode_{key}_skip_special"] = tok.decode(enc.ids, skip_special_tokens=True)
            hf_ids = hf_tok(text, add_special_tokens=add)["input_ids"]
            rec[f"transformers_agrees_{key}"] = hf_ids == enc.ids
        cases.append(rec)
    return cases


def write_family(name, spec, index, lines, out_root, quant):
    folder = out_root / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    tok, special_args, template = build_tokenizer(spec["tokenizer"], lines)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, **special_args)
    if template is not None:
        hf_tok.chat_template = template
    hf_tok.save_pretrained(folder)
    if spec["legacy_config"]:
        legacy_tokenizer_config(folder, spec, special_args, template)
    # Ground truth: the tokenizer.json as saved
    saved = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert saved.to_str() == tok.to_str() or json.loads(saved.to_str()) == json.loads(tok.to_str())
    hf_loaded = AutoTokenizer.from_pretrained(folder)

    n_tok = saved.get_vocab_size(with_added_tokens=True)
    vocab_size = n_tok
    if spec.get("pad_vocab_to"):
        m = spec["pad_vocab_to"]
        vocab_size = (n_tok + m - 1) // m * m + m  # a padded tail, as Qwen's 151936 > 151665
    bos = special_args.get("bos_token")
    eos = special_args.get("eos_token")
    pad = special_args.get("pad_token")
    bos_id = saved.token_to_id(bos) if bos else None
    eos_id = saved.token_to_id(eos) if eos else None
    pad_id = saved.token_to_id(pad) if pad and spec["arch"] != "llama" else None
    cfg = make_config(spec["arch"], spec["config"], vocab_size, bos_id, eos_id, pad_id)
    cfg.dtype = spec["dtype"]
    gen = torch.Generator().manual_seed(SEED + index)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize(model, gen)
    model = model.to(spec["dtype"])
    kwargs = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
    model.save_pretrained(folder, **kwargs)
    if spec["legacy_config"]:
        before = model.config.to_dict()
        legacy_config(folder, spec["arch"], spec)
        after = type(model.config).from_pretrained(folder).to_dict()
        for k in ("rope_parameters", "sliding_window", "layer_types", "head_dim", "vocab_size"):
            assert before.get(k) == after.get(k), (name, k, before.get(k), after.get(k))

    if spec.get("fp8_block"):
        fp8_checkpoint(folder, spec["fp8_block"])

    # transformers' fp32 reference, loaded from the folder as written
    ref = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    ref.eval()
    enc_plain = saved.encode(PROMPT, add_special_tokens=False).ids
    enc_special = saved.encode(PROMPT, add_special_tokens=True).ids
    ids = enc_special
    logits, kv, greedy, step_logits = forward_and_greedy(ref, ids)
    # The same prompt through a config-built cache (sliding layers cropped) must agree
    with torch.no_grad():
        alt = ref(input_ids=torch.tensor([ids]), cache=DynamicCache(config=ref.config)).logits[0]
    assert torch.equal(alt.float(), logits), name
    # sdpa as a cross-check of the attention implementation (not stored)
    ref_sdpa = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="sdpa"
    )
    with torch.no_grad():
        sdpa_logits = ref_sdpa(input_ids=torch.tensor([ids])).logits[0]
    sdpa_diff = float((sdpa_logits - logits).abs().max())

    argmax = logits.argmax(-1)
    stats = {
        "logits_std": float(logits.std()),
        "logits_max_abs": float(logits.abs().max()),
        "distinct_argmax_over_positions": int(argmax.unique().numel()),
        "max_abs_diff_eager_vs_sdpa": sdpa_diff,
    }
    assert stats["logits_std"] > 0.5 and stats["distinct_argmax_over_positions"] >= 5, (name, stats)

    tensors = {"logits": logits.contiguous(), "greedy_logits": step_logits.contiguous()}
    for k, v in kv.items():
        tensors[k] = v.float().contiguous()
    tensors["prompt_ids"] = torch.tensor(ids, dtype=torch.int64)
    tensors["greedy_ids"] = torch.tensor(greedy, dtype=torch.int64)
    save_file(tensors, str(folder / "expected.safetensors"))

    cfgd = ref.config
    expected = {
        "family": name,
        "architecture": cfgd.architectures[0] if cfgd.architectures else None,
        "model_type": cfgd.model_type,
        "checkpoint_dtype": str(spec["dtype"]).replace("torch.", ""),
        "config_format": (
            "transformers-4 hub keys (torch_dtype, rope_theta, rope_scaling)"
            if spec["legacy_config"]
            else "transformers-5 save_pretrained keys (dtype, rope_parameters)"
        ),
        "sharded": bool(spec["shard"]),
        "vocab_size": cfgd.vocab_size,
        "tokenizer_size": n_tok,
        "head_dim": getattr(cfgd, "head_dim", cfgd.hidden_size // cfgd.num_attention_heads),
        "num_attention_heads": cfgd.num_attention_heads,
        "num_key_value_heads": cfgd.num_key_value_heads,
        "num_hidden_layers": cfgd.num_hidden_layers,
        "sliding_window": getattr(cfgd, "sliding_window", None),
        "sliding_window_rule": "query i attends key j iff i - sliding_window < j <= i "
        "(transformers 5 masking_utils.sliding_window_overlay: kv_idx > q_idx - sliding_window)",
        "prompt": PROMPT,
        "prompt_ids_plain": enc_plain,
        "prompt_ids_with_special": enc_special,
        "prompt_ids_used": "prompt_ids_with_special",
        "adds_bos": enc_special != enc_plain,
        "n_prompt": len(ids),
        "greedy_ids": greedy,
        "greedy_text": saved.decode(greedy, skip_special_tokens=False),
        "stats": stats,
        "how": {
            "ids": "tokenizers.Tokenizer.from_file(tokenizer.json).encode(prompt, "
            "add_special_tokens=False/True).ids",
            "logits": "AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32, "
            "attn_implementation='eager'); model(input_ids=[prompt_ids_with_special], "
            "cache=DynamicCache()).logits[0]; float32 [n_prompt, vocab_size]",
            "kv": "k.0 / v.0: that DynamicCache's layers[0].keys / .values after the prompt, "
            "float32 [1, num_key_value_heads, n_prompt, head_dim]; keys after RoPE",
            "greedy": "argmax of the last prompt logits, then one token per forward pass through "
            "the same fp32 DynamicCache; greedy_logits[s] are the logits of the pass that took "
            "greedy_ids[s] as input (so greedy_ids[s+1] = argmax greedy_logits[s])",
            "weights": f"normal(0, {WEIGHT_STD}) matrices/embeddings, 1 + normal(0, {NORM_STD}) "
            f"RMSNorm weights, normal(0, {BIAS_STD}) biases; torch.Generator seed {SEED + index}; "
            f"cast to {spec['dtype']} and written by save_pretrained"
            + (f"(max_shard_size='{spec['shard']}')" if spec["shard"] else ""),
        },
        "fp8_checkpoint": (
            (
                f"projections stored F8_E4M3 with float32 <name>.weight_scale_inv per block of "
                f"{spec['fp8_block']} (amax / 448 of the bf16 weight's block; fp8 = "
                "(w / scale).to(float8_e4m3fn), round to nearest even); transformers dequantized "
                "them at load to float32 fp8 * scale (Fp8Dequantize), the weights the logits were "
                "computed with"
            )
            if spec.get("fp8_block")
            else None
        ),
        "tolerance_hint": "fp32 arithmetic in different order: the generator's eager vs sdpa "
        "difference is stats.max_abs_diff_eager_vs_sdpa",
        "versions": versions(),
    }
    (folder / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")

    cases = tokenizer_cases(saved, hf_loaded, spec["tokenizer"], lines)
    chat = None
    if template is not None:
        msgs = [
            {"role": "user", "content": "Who created the heaven?"},
            {"role": "assistant", "content": "God created the heaven and the earth."},
            {"role": "user", "content": "And the earth?"},
        ]
        rendered = hf_loaded.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        chat = {
            "messages": msgs,
            "add_generation_prompt": True,
            "rendered": rendered,
            "ids": saved.encode(rendered, add_special_tokens=False).ids,
            "how": "transformers apply_chat_template(tokenize=False) with the saved template; "
            "ids: tokenizers encode(rendered, add_special_tokens=False)",
        }
    (folder / "tokenizer_cases.json").write_text(
        json.dumps(
            {
                "family": name,
                "how": "tokenizers.Tokenizer.from_file(tokenizer.json): ids_plain = "
                "encode(text, add_special_tokens=False).ids, ids_with_special = "
                "encode(text, add_special_tokens=True).ids; decode_* = decode(ids, "
                "skip_special_tokens=False/True); transformers_agrees_* compares "
                "AutoTokenizer.from_pretrained(dir)(text)['input_ids']",
                "cases": cases,
                "chat": chat,
                "versions": versions(),
            },
            indent=1,
            ensure_ascii=False,
        )
        + "\n"
    )
    if quant:
        rows = torch.cat([logits, step_logits])
        for q in write_quantized(folder, ref, ids, greedy, rows):
            print(
                f"  {q['name']}: max |logits - fp32| {q['max_abs_diff_vs_fp32_rows']:.3g}"
                + (
                    f", min tie distance {q['min_tie_distance']:.3g}"
                    if "min_tie_distance" in q
                    else ""
                )
            )
    if quant and name in HQQ_FAMILIES:
        for q in write_quantized_hqq(folder, ref, ids, greedy, rows):
            print(
                f"  {q['name']}: max |logits - fp32| {q['max_abs_diff_vs_fp32_rows']:.3g}, "
                f"re-quantization drift k {q['requant_drift_k_max']:.3g}"
            )
    print(f"{name}: n={len(ids)} vocab={cfgd.vocab_size} stats={stats} greedy={greedy}")


def versions(packages=PINNED):
    out = {}
    for p in packages:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = None
    return out


# QuantizedCache runs (transformers 5.25, quanto backend). "tokenwise" settings use
# axis_key=0, axis_value=0 (quanto's groups of G consecutive head_dim channels of one token and
# head, for keys and values: kvq's int<B>:k=token,v=token,g=G) with residual_length=1 and the
# sequence fed one token at a time from token 0: at every step the attention sees all older
# tokens quantized and the newest exact, which is kvq's r=1 window. "kivi" settings use KIVI's
# axes (axis_key=-1: groups of G consecutive tokens of one channel; axis_value=0), which quanto
# can only run with a prefill of a multiple of G tokens and residual_length a multiple of G.
QUANT_G_TOKENWISE = 32
QUANT_G_KIVI = 16
QUANT_ROWS = 16  # logits of the last QUANT_ROWS steps are stored
# (name, nbits, axis_key, axis_value, q_group_size, residual_length, prefill, fp16_params)
QUANT_SETTINGS = [
    ("tokenwise_b4_fp16params", 4, 0, 0, QUANT_G_TOKENWISE, 1, 1, True),
    ("tokenwise_b2_fp16params", 2, 0, 0, QUANT_G_TOKENWISE, 1, 1, True),
    ("tokenwise_b4", 4, 0, 0, QUANT_G_TOKENWISE, 1, 1, False),
    ("kivi_b4", 4, -1, 0, QUANT_G_KIVI, QUANT_G_KIVI, QUANT_G_KIVI, False),
    ("kivi_b2", 2, -1, 0, QUANT_G_KIVI, QUANT_G_KIVI, QUANT_G_KIVI, False),
]

QUANTO_VS_KIVI = {
    "source": "transformers 5.25.0 cache_utils.py (QuantizedLayer.update, QuantoQuantizedLayer), "
    "optimum-quanto 0.2.7 tensor/optimizers/max_optimizer.py, tensor/grouped.py, "
    "library/quantize.py (quantize_affine), tensor/qbits.py (QBitsDequantizer)",
    "parameters": "MaxOptimizer per group: rmin = amin, rmax = amax (in the cache dtype, float32 "
    "here); scale = (rmax - rmin) / (2^b - 1); shift = -rmin. Both stay float32: kvq stores "
    "fp16(scale) and fp16(min) (kivi/minmax.h) and computes codes with those.",
    "codes": "code = clamp(torch.round((x + shift) / scale), 0, 2^b - 1): float32 sum and "
    "quotient, round half to even. kvq: the exact quotient (x - min_h) / scale_h, ties to even.",
    "dequantize": "x' = scale * code - shift (float32 product, then float32 subtraction); kvq: "
    "code * scale_h + min_h (exact product, one rounding).",
    "zero_range_group": "scale 0 gives 0/0 = NaN codes in quanto; kvq stores scale 0, code 0, "
    "x' = min_h. (No such group occurs in these fixtures.)",
    "groups": "group(x, axis, G) on the [batch, kv_heads, seq, head_dim] tensor: axis=0 reshapes "
    "to [-1, G] (G consecutive head_dim channels of one token and head; needs G | head_dim to stay "
    "inside a head); axis=-1 reshapes to [(batch*heads*seq)/G, G, head_dim] (G consecutive rows "
    "of the flattened batch*heads*seq, per channel: G tokens of one channel when G | seq; it "
    "raises unless G divides batch*heads*seq at every quantization).",
    "prefill": "the first update() quantizes every token it is given and keeps no residual; that "
    "forward pass attends the exact K/V it was given. kvq's forward appends first and attends the "
    "cache as stored (tokens outside the window quantized), in prefill as in decode.",
    "residual_and_flush": "later updates keep new tokens exact in a residual; when residual + "
    "new >= residual_length the whole cache (dequantized old tokens + residual + new) is quantized "
    "again from scratch and the residual emptied, after this step's attention (which saw the "
    "residual and the new tokens exact). So the exact tail grows 1..R and resets (a sawtooth) "
    "and old tokens are re-quantized from their dequantized values (idempotent for the codes up "
    "to float32 rounding of the reconstructed maximum). kvq's per-token side keeps exactly the "
    "last R tokens (a sliding window) and its per-channel side quantizes floor(T/B)*B tokens "
    "(B = R or G), never re-quantizing.",
    "what_matches": "residual_length=1 with one token per forward pass from token 0: quanto "
    "attends all older tokens quantized and the newest exact at every step, as kvq's r=1 does; "
    "with tokenwise axes (kvq int<B>:k=token,v=token,g=G,r=1) the stored codes are the same "
    "except where float32 parameters round differently from kvq's fp16 ones. The "
    "*_fp16params settings replace quanto's MaxOptimizer by one returning fp16-rounded scale "
    "and min (scale_h = fp16(fp32((rmax - rmin) / (2^b - 1))), shift = -fp16(rmin)): kvq's stored "
    "parameters; then codes differ from kvq's only if a float32 quotient lands on the other side "
    "of a k + 1/2 tie than the exact one (min_tie_distance records how close any came).",
    "what_does_not": "KIVI's axes (per-channel keys) cannot be matched step for step: quanto's "
    "key grouping needs whole groups of G tokens at every quantization (so no residual_length=1), "
    "its exact tail is a sawtooth, and its prefill is exact. The kivi_* settings are stored as "
    "transformers computes them, for a distributional comparison (error against fp32 of the same "
    "order), not an elementwise one.",
}


def fp16_param_optimizer(tracker):
    """A quanto MaxOptimizer whose scale and shift are rounded to fp16 as kvq stores them;
    records in tracker['min_tie_distance'] how close any float32 quotient came to a tie (in code
    units) and in tracker['min_boundary_margin'] how close any K/V value came to a rounding
    boundary (in the value's units: a kvq K/V that differs from transformers' by less than this
    gets the same code)."""
    from optimum.quanto import MaxOptimizer

    class Fp16ParamMaxOptimizer(MaxOptimizer):
        def optimize(self, base, qtype, axis):
            scale, shift = super().optimize(base, qtype, axis)
            scale_h = scale.to(torch.float16).to(scale.dtype)
            min_h = (-shift).to(torch.float16).to(scale.dtype)
            q = ((base - min_h) / scale_h).double()
            frac = (q - q.floor() - 0.5).abs()
            tracker["min_tie_distance"] = min(tracker["min_tie_distance"], float(frac.min()))
            # the same in the input's units: how far any K/V value was from a rounding boundary
            margin = (frac * scale_h.double()).min()
            tracker["min_boundary_margin"] = min(tracker["min_boundary_margin"], float(margin))
            return scale_h, -min_h

    return Fp16ParamMaxOptimizer()


def quantized_cache(ref, backend, setting):
    """transformers' QuantizedCache for ref with a QUANT_SETTINGS / HQQ_SETTINGS entry's nbits,
    axes, group size and residual length."""
    from transformers import QuantizedCache

    _, bits, ak, av, g, r = setting[:6]
    return QuantizedCache(
        backend=backend,
        config=ref.config,
        nbits=bits,
        axis_key=ak,
        axis_value=av,
        q_group_size=g,
        residual_length=r,
    )


def feed_tokens(ref, cache, seq, prefill, rows_from, watch=None):
    """Feeds seq to ref with cache: the first prefill tokens in one forward pass, then one token
    per pass. Returns the logits after feeding seq[rows_from..] ([rows, vocab] float32) and, per
    decode step, [tokens attended quantized, tokens attended exact (including the new one)] as
    layer 0 holds them. watch(t, "before") / watch(t, "after") is called around each step."""
    rows, states = [], []
    with torch.no_grad():
        ref(input_ids=torch.tensor([seq[:prefill]]), cache=cache)
        for t in range(prefill, len(seq)):
            layer0 = cache.layers[0]
            resid = layer0.keys.shape[-2] if layer0.keys.dim() == 4 else 0
            states.append([layer0.cumulative_length - resid, resid + 1])
            if watch:
                watch(t, "before")
            out = ref(input_ids=torch.tensor([[seq[t]]]), cache=cache)
            if watch:
                watch(t, "after")
            if t >= rows_from:
                rows.append(out.logits[0, -1].float().clone())
    return torch.stack(rows), states


def setting_record(setting, backend, extra, states, logits, fp32_rows):
    """The json record of one QuantizedCache run: its parameters, extra, the states per step and
    the logits' differences from the fp32 cache's."""
    name, bits, ak, av, g, r, prefill = setting[:7]
    err = (logits - fp32_rows).abs()
    return {
        "name": name,
        "backend": backend,
        "nbits": bits,
        "axis_key": ak,
        "axis_value": av,
        "q_group_size": g,
        "residual_length": r,
        "prefill_tokens": prefill,
        **extra,
        "states": "per decode step t = prefill .. n-1: [tokens attended quantized, tokens "
        "attended exact (including the new one)], the same for keys and values and every layer",
        "state_per_step": states,
        "max_abs_diff_vs_fp32_rows": float(err.max()),
        "mean_abs_diff_vs_fp32_rows": float(err.mean()),
    }


def write_quantized(folder, ref, ids, greedy, ref_rows):
    """quantized_cache.safetensors / .json for the QUANT_SETTINGS (see QUANTO_VS_KIVI)."""
    seq = list(ids) + list(greedy)
    n = len(seq)
    tensors, settings = {}, []
    rows_from = n - QUANT_ROWS
    fp32_rows = ref_rows[rows_from:]  # logits after feeding seq[i], i >= rows_from
    for setting in QUANT_SETTINGS:
        name, bits, ak, av, g, r, prefill, fp16p = setting
        cache = quantized_cache(ref, "quanto", setting)
        tracker = {"min_tie_distance": 1.0, "min_boundary_margin": float("inf")}
        if fp16p:
            for layer in cache.layers:
                layer.optimizer = fp16_param_optimizer(tracker)
        logits, states = feed_tokens(ref, cache, seq, prefill, rows_from)
        tensors[f"{name}.logits"] = logits.contiguous()
        extra = {
            "fp16_params": fp16p,
            "kvq_spec": f"int{bits}:k=token,v=token,g={g},r=1" if ak == 0 else None,
        }
        rec = setting_record(setting, "quanto", extra, states, logits, fp32_rows)
        if fp16p:
            rec["min_tie_distance"] = tracker["min_tie_distance"]
            rec["min_boundary_margin"] = tracker["min_boundary_margin"]
            # |float32 quotient - exact quotient| <= ~2 ulps of the largest code: below this a
            # tie distance cannot flip a code
            rec["quotient_error_bound"] = 2.0 * 2.0**-23 * (2**bits - 1)
            assert rec["min_tie_distance"] > rec["quotient_error_bound"], rec
        settings.append(rec)
    # How far apart fp16 and fp32 parameters put the tokenwise 4-bit logits
    d = (tensors["tokenwise_b4_fp16params.logits"] - tensors["tokenwise_b4.logits"]).abs().max()
    tensors["fp32.logits"] = fp32_rows.contiguous()
    save_file(tensors, str(folder / "quantized_cache.safetensors"))
    doc = {
        "sequence_ids": seq,
        "sequence": "prompt_ids_with_special followed by greedy_ids (expected.json), fed to "
        "transformers with a QuantizedCache: the first prefill_tokens in one forward pass, then "
        "one token per forward pass",
        "rows_from": rows_from,
        "rows": f"<setting>.logits [{QUANT_ROWS}, vocab_size] float32: row i is the logits after "
        f"feeding sequence_ids[rows_from + i]; fp32.logits: the same rows with the fp32 "
        "DynamicCache (expected.safetensors logits/greedy_logits rows)",
        "model": "AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32, "
        "attn_implementation='eager'): cache tensors are float32",
        "settings": settings,
        "max_abs_diff_tokenwise_b4_fp16params_vs_fp32params": float(d),
        "quanto_vs_kivi": QUANTO_VS_KIVI,
        "versions": versions(),
    }
    (folder / "quantized_cache.json").write_text(json.dumps(doc, indent=1) + "\n")
    return settings


# QuantizedCache runs with backend="hqq" (transformers 5.25 HQQQuantizedLayer, hqq 0.2.8.post1).
# HQQ's axes are not quanto's: axis=1 reshapes the [batch, heads, seq, head_dim] tensor to
# [-1, G] (G consecutive head_dim channels of one token: per token, kvq k=token / v=token, and
# quanto's axis 0); axis=0 reshapes it to [G, -1] and takes statistics down the columns (G
# values N/G apart in the flattened tensor, N = batch*heads*seq*head_dim: one channel of G
# tokens spaced heads*seq/G apart when G | heads*seq, so KIVI's per-channel keys with strided,
# not consecutive, tokens). Its packing needs N/G divisible by 8/nbits at every quantization
# (a RuntimeError otherwise; 2 bits, one token at a time: G | heads*head_dim/4), hence G = 16.
HQQ_FAMILIES = ["llama"]
assert set(HQQ_FAMILIES) <= set(QUANT_FAMILIES)  # the fp32 rows are in quantized_cache.*
HQQ_PINNED = {"hqq": "0.2.8.post1"}
HQQ_G = 16
# (name, nbits, axis_key, axis_value, q_group_size, residual_length, prefill, mode, stored)
# mode: "fp16params" (optimize=True with HQQ's optimizer replaced by fp16-rounded min/max
# parameters: kvq's stored ones), "minmax" (HQQ's optimize=False: its float32 min/max
# parameters), "hqq" (transformers' call, HQQ's default optimize=True).
HQQ_SETTINGS = [
    ("hqq_tokenwise_b4_fp16params", 4, 1, 1, HQQ_G, 1, 1, "fp16params", True),
    ("hqq_tokenwise_b2_fp16params", 2, 1, 1, HQQ_G, 1, 1, "fp16params", True),
    ("hqq_tokenwise_b4_minmax", 4, 1, 1, HQQ_G, 1, 1, "minmax", False),
    ("hqq_tokenwise_b4", 4, 1, 1, HQQ_G, 1, 1, "hqq", True),
    ("hqq_tokenwise_b2", 2, 1, 1, HQQ_G, 1, 1, "hqq", True),
    ("hqq_kivi_b4", 4, 0, 1, HQQ_G, HQQ_G, HQQ_G, "hqq", True),
    ("hqq_kivi_b2", 2, 0, 1, HQQ_G, HQQ_G, HQQ_G, "hqq", True),
    ("hqq_kivi_b4_minmax", 4, 0, 1, HQQ_G, HQQ_G, HQQ_G, "minmax", False),
]

HQQ_VS_KIVI = {
    "source": "transformers 5.25.0 cache_utils.py (QuantizedLayer.update, HQQQuantizedLayer), "
    "hqq 0.2.8.post1 core/quantize.py (Quantizer.quantize / dequantize), core/optimize.py "
    "(optimize_weights_proximal = optimize_weights_proximal_legacy), core/bitpack.py",
    "call": "HQQQuantizedLayer._quantize calls Quantizer.quantize(tensor, axis, device, "
    "compute_dtype=cache dtype, nbits, group_size) with hqq's defaults optimize=True, "
    "round_zero=False, channel_wise=True; then casts scale and zero to the cache dtype (float32 "
    "here). axis_key / axis_value must be 0 or 1; nbits 1, 2, 3, 4 or 8.",
    "groups": "axis=1: W.reshape(-1, G), statistics per row: G consecutive head_dim channels of "
    "one token and head (kvq k=token / v=token, g=G; quanto's axis 0). axis=0: W.reshape(G, -1), "
    "statistics per column: G values N/G apart in the flattened [batch, heads, seq, head_dim] "
    "tensor; with G | heads*seq that is one channel at G tokens spaced heads*seq/G apart "
    "(strided, and crossing heads when heads > 1), regrouped at every re-quantization as seq "
    "grows. KIVI and kvq group G consecutive tokens of one head and channel; the two coincide "
    "only when G = heads*seq. When G does not divide heads*seq the columns mix channels.",
    "parameters_minmax": "scale_inv = (2^b - 1) / (max - min) in float32, replaced by 1 where "
    "max - min <= 1e-4 and clamped to <= 2e4; zero = -min * scale_inv (a real number of code "
    "units, not rounded: round_zero=False). optimize=False: code = clamp(round(W * scale_inv + "
    "zero), 0, 2^b - 1) in float32; stored scale = 1 / scale_inv; x' = (code - zero) * scale. "
    "With exact arithmetic this is kvq's rule (code = round((x - min) / scale), x' = code * scale "
    "+ min) with float32 instead of fp16 parameters.",
    "optimizer": "optimize=True (the default, and what transformers runs) keeps scale_inv and "
    "moves zero: up to 20 proximal iterations of W_q = clamp(round(W * s + z)), W_r = (W_q - z) / "
    "s, W_e = shrink_lp(W - W_r, beta, p=0.7) (beta 10, times 1.01 each iteration), z = mean over "
    "the group of (W_q - (W - W_e) * s); it stops at the first iteration whose mean |W - W_r| over "
    "the WHOLE tensor (every group of every head and token at once) did not improve, and returns "
    "the zero already updated from that iteration (not the best one). Codes are then round(W * s "
    "+ z) with the final zero. The solver runs in float32 on a CPU and in float16 on a CUDA "
    "device. So each group's grid keeps min/max's spacing and is shifted by a fraction of a step "
    "(zero_shift_*_code_units; codes_moved_share: the share of codes that differ from min/max's "
    "with the same scale); while the shift stays under 1/2 the group's min and max still get "
    "codes 0 and 2^b - 1 without being levels themselves.",
    "requantization": "as with quanto, QuantizedLayer re-quantizes the whole cache (dequantized old "
    "tokens + residual + new) whenever the residual fills. At axis 1 this gives back the same "
    "levels up to float32 rounding, with min/max parameters and with the optimizer alike (a "
    "group of dequantized values spans exactly 2^b - 1 steps while the shift is under 1/2, so "
    "scale and zero come back). At axis 0 the strided groups change as seq grows, so each flush "
    "regroups the keys and moves old tokens (requant_drift_k_max: the largest change of an "
    "already quantized layer-0 value from one step to the next; hqq_kivi_b4_minmax shows the "
    "regrouping alone does it).",
    "prefill": "the first update() quantizes what it is given and attends it exactly; later "
    "updates keep a residual of exact tokens flushed when residual + new >= residual_length "
    "(see quanto_vs_kivi in quantized_cache.json: the same QuantizedLayer.update).",
    "what_matches": "residual_length=1, one token per forward pass from token 0, axis 1 for K "
    "and V, optimize=False: every step attends the older tokens quantized with min/max per token "
    "group and the newest exact, kvq's int<B>:k=token,v=token,g=G,r=1. The *_fp16params settings "
    "replace hqq's optimizer (called because optimize=True) by one returning the fp16-rounded "
    "min/max parameters kvq stores (scale_h = fp16(fp32((max - min) / (2^b - 1))), min_h = "
    "fp16(min); scale_inv = 1 / scale_h, zero = -min_h * scale_inv, codes by HQQ's float32 "
    "formula round(W * scale_inv + zero)); codes_unlike_exact_rule counts codes that differ from "
    "kvq's exact rule round((x - min_h) / scale_h) (0 asserted), dequant_max_abs_diff_vs_exact "
    "how far HQQ's (code - zero) * (1 / scale_inv) lands from code * scale_h + min_h. What is "
    "left is the K/V themselves (kvq's fp32 K/V differ from torch's by ~1e-6): "
    "min_boundary_margin and min_param_margin say how close any value came to a code boundary "
    "and any min or scale to an fp16 rounding boundary (in the K/V's units), and kv_noise how far "
    "1e-6 noise on transformers' own K/V moves these logits.",
    "what_does_not": "HQQ's default optimizer is a different quantizer from KIVI's min/max "
    "(a shifted zero per group), and its axis 0 groups are strided tokens regrouped at every "
    "flush; the hqq_tokenwise_b* and hqq_kivi_b* settings (transformers' own call) are stored "
    "for a distributional comparison (error against the fp32 cache of the same order).",
}


def fp16_margin(v):
    """Distance of each float32 value from the nearest fp16 rounding boundary (the midpoint of
    two adjacent fp16 values), in the value's units; fp16 normal range."""
    v = v.double()
    _, e = torch.frexp(v)
    ulp = torch.ldexp(torch.ones_like(v), (e - 11).to(torch.int32))
    q = v / ulp
    return (q - q.floor() - 0.5).abs() * ulp


def hqq_quantizer(mode, tracker):
    """An hqq Quantizer for HQQQuantizedLayer.quantizer that runs hqq's Quantizer.quantize with
    optimize=False ("minmax"), its own optimizer ("hqq") or an optimizer returning kvq's fp16
    min/max parameters ("fp16params"), and records in tracker what it saw: the smallest group
    range (hqq replaces scale_inv by 1 below 1e-4 and clamps it to 2e4), and per mode the tie
    distances / boundary margins (fp16params) or how far the optimizer moved zero and how many
    codes it changed (hqq)."""
    from hqq.core.quantize import Quantizer

    original = Quantizer.optimize_weights

    def fp16params(tensor, scale, zero, min_max, axis, device):
        W = tensor
        mn = W.min(axis=axis, keepdim=True)[0]
        mx = W.max(axis=axis, keepdim=True)[0]
        scale_h = ((mx - mn) / min_max[1]).half().float()
        min_h = mn.half().float()
        assert bool((scale_h > 0).all()), "a zero-range group (kvq stores scale 0)"
        scale_inv = 1.0 / scale_h
        zero_h = -min_h * scale_inv
        W_q = torch.round(W * scale_inv + zero_h).clamp(min_max[0], min_max[1])
        q = (W.double() - min_h.double()) / scale_h.double()
        exact = torch.round(q).clamp(min_max[0], min_max[1])
        frac = (q - q.floor() - 0.5).abs()
        tracker["min_tie_distance"] = min(tracker["min_tie_distance"], float(frac.min()))
        margin = (frac * scale_h.double()).min()
        tracker["min_boundary_margin"] = min(tracker["min_boundary_margin"], float(margin))
        tracker["codes_unlike_exact_rule"] += int((W_q.double() != exact).sum())
        # how close min and the float32 scale came to an fp16 rounding boundary, in the K/V
        # value's units (a K/V change d moves min by d and the scale by up to 2d / (2^b - 1))
        param = torch.minimum(fp16_margin(mn), fp16_margin((mx - mn) / min_max[1]) * min_max[1] / 2)
        tracker["min_param_margin"] = min(tracker["min_param_margin"], float(param.min()))
        deq = (W_q - zero_h) * (1.0 / scale_inv)
        d = float((deq.double() - (exact * scale_h.double() + min_h.double())).abs().max())
        tracker["dequant_max_abs_diff_vs_exact"] = max(tracker["dequant_max_abs_diff_vs_exact"], d)
        return W_q, scale_inv, zero_h

    def tracked(tensor, scale, zero, min_max, axis, device):
        W_q, s, z = original(
            tensor=tensor, scale=scale, zero=zero, min_max=min_max, axis=axis, device=device
        )
        assert torch.equal(s, scale), "hqq's optimizer is expected to keep the scale"
        shift = (z - zero).abs()
        tracker["zero_shift_max"] = max(tracker["zero_shift_max"], float(shift.max()))
        tracker["zero_shift_sum"] += float(shift.sum())
        tracker["groups"] += shift.numel()
        plain = torch.round(tensor * scale + zero).clamp(min_max[0], min_max[1])
        tracker["codes_moved"] += int((plain != W_q).sum())
        tracker["codes"] += W_q.numel()
        return W_q, s, z

    class TrackedQuantizer(Quantizer):
        @classmethod
        def quantize(cls, tensor, axis=0, group_size=64, **kw):
            W = tensor.float()
            W = W.reshape([-1, group_size]) if axis == 1 else W.reshape([group_size, -1])
            rng = W.max(axis=axis)[0] - W.min(axis=axis)[0]
            tracker["min_group_range"] = min(tracker["min_group_range"], float(rng.min()))
            Quantizer.optimize_weights = {"fp16params": fp16params, "hqq": tracked}.get(
                mode, original
            )
            try:
                return Quantizer.quantize(
                    tensor, axis=axis, group_size=group_size, optimize=mode != "minmax", **kw
                )
            finally:
                Quantizer.optimize_weights = original

    return TrackedQuantizer


HQQ_NOISE = 1e-6  # K/V noise (absolute, normal) of the sensitivity runs: kvq's K/V vs torch's
HQQ_NOISE_TRIALS = 8


def run_hqq(ref, seq, rows_from, setting, noise_seed=None):
    """transformers with QuantizedCache(backend="hqq") for one HQQ_SETTINGS entry: the logits of
    rows rows_from.., [tokens attended quantized, exact] per step, the layer-0 re-quantization
    drift and the quantizer's tracker. With noise_seed, HQQ_NOISE * normal noise (that seed) is
    added to every layer's k_proj and v_proj output: how far K/V differences of the size of
    kvq's from torch's (summation order, ~1e-6) move transformers' own logits."""
    name, bits, ak, av, g, r, prefill, mode, stored = setting
    cache = quantized_cache(ref, "hqq", setting)
    tracker = {"min_group_range": float("inf")}
    if mode == "fp16params":
        tracker.update(
            min_tie_distance=1.0,
            min_boundary_margin=float("inf"),
            min_param_margin=float("inf"),
            codes_unlike_exact_rule=0,
            dequant_max_abs_diff_vs_exact=0.0,
        )
    if mode == "hqq":
        tracker.update(zero_shift_max=0.0, zero_shift_sum=0.0, groups=0, codes_moved=0, codes=0)
    for layer in cache.layers:
        layer.quantizer = hqq_quantizer(mode, tracker)
    hooks = []
    if noise_seed is not None:
        gen = torch.Generator().manual_seed(noise_seed)

        def add_noise(module, inputs, out):
            return out + HQQ_NOISE * torch.randn(out.shape, generator=gen)

        for lyr in ref.model.layers:
            hooks.append(lyr.self_attn.k_proj.register_forward_hook(add_noise))
            hooks.append(lyr.self_attn.v_proj.register_forward_hook(add_noise))
    drift = {"k": 0.0, "v": 0.0}
    before = []

    def watch(t, phase):
        layer0 = cache.layers[0]
        now = [layer0._dequantize(layer0._quantized_keys)]
        now.append(layer0._dequantize(layer0._quantized_values))
        if phase == "before":
            before[:] = now
            return
        for kv, b, a in zip("kv", before, now):
            m = b.shape[-2]
            drift[kv] = max(drift[kv], float((a[..., :m, :] - b).abs().max()))

    try:
        logits, states = feed_tokens(ref, cache, seq, prefill, rows_from, watch)
    finally:
        for h in hooks:
            h.remove()
    return logits, states, drift, tracker


def write_quantized_hqq(folder, ref, ids, greedy, ref_rows):
    """quantized_cache_hqq.safetensors / .json for the HQQ_SETTINGS (see HQQ_VS_KIVI)."""
    seq = list(ids) + list(greedy)
    n = len(seq)
    tensors, settings, all_logits = {}, [], {}
    rows_from = n - QUANT_ROWS
    fp32_rows = ref_rows[rows_from:]
    for setting in HQQ_SETTINGS:
        name, bits, ak, av, g, r, prefill, mode, stored = setting
        logits, states, drift, tracker = run_hqq(ref, seq, rows_from, setting)
        all_logits[name] = logits
        if stored:
            tensors[f"{name}.logits"] = logits.contiguous()
        extra = {
            "mode": mode,
            "logits_stored": stored,
            "kvq_spec": f"int{bits}:k=token,v=token,g={g},r=1" if ak == 1 and r == 1 else None,
            "kvq_spec_nearest": (
                f"int{bits}:k=token,v=token,g={g},r=1"
                if ak == 1
                else f"int{bits}:k=channel,v=token,g={g},r={r}"
            ),
        }
        rec = setting_record(setting, "hqq", extra, states, logits, fp32_rows)
        rec["min_group_range"] = tracker["min_group_range"]
        rec["requant_drift_k_max"] = drift["k"]
        rec["requant_drift_v_max"] = drift["v"]
        if mode == "fp16params":
            for k in (
                "min_tie_distance",
                "min_boundary_margin",
                "min_param_margin",
                "codes_unlike_exact_rule",
                "dequant_max_abs_diff_vs_exact",
            ):
                rec[k] = tracker[k]
            rec["quotient_error_bound"] = 2.0 * 2.0**-23 * (2**bits - 1)
            assert rec["codes_unlike_exact_rule"] == 0, rec
            # The same run with K/V noise of kvq's size: a value or fp16 parameter within ~1e-6
            # of a rounding boundary moves a group by a step in some trials
            effect = float((logits - fp32_rows).abs().max())
            trials = []
            for k in range(HQQ_NOISE_TRIALS):
                noisy = run_hqq(ref, seq, rows_from, setting, noise_seed=SEED + k)[0]
                d = (noisy - logits).abs()
                trials.append([float(d.mean()), float(d.max()) / effect])
            rec["kv_noise"] = {
                "how": f"{HQQ_NOISE_TRIALS} reruns with {HQQ_NOISE} * normal noise (torch.Generator "
                f"seeds {SEED}..{SEED + HQQ_NOISE_TRIALS - 1}) added to every k_proj and v_proj "
                "output; per trial [mean |logits - these logits|, max |...| / max |these logits "
                "- fp32 rows|]",
                "trials": trials,
                "mean_abs_diff_max": max(t[0] for t in trials),
                "max_share_of_effect_max": max(t[1] for t in trials),
            }
        if mode == "hqq":
            rec["zero_shift_max_code_units"] = tracker["zero_shift_max"]
            rec["zero_shift_mean_code_units"] = tracker["zero_shift_sum"] / tracker["groups"]
            rec["codes_moved_share"] = tracker["codes_moved"] / tracker["codes"]
        # hqq's own guards never apply here: no group range at or below 1e-4, none below
        # (2^b - 1) / 2e4 (where scale_inv would be clamped)
        assert rec["min_group_range"] > (2**bits - 1) / 2e4, rec
        settings.append(rec)
    diffs = {}
    for a, b in (
        ("hqq_tokenwise_b4_minmax", "hqq_tokenwise_b4_fp16params"),
        ("hqq_tokenwise_b4", "hqq_tokenwise_b4_minmax"),
        ("hqq_tokenwise_b4", "hqq_tokenwise_b4_fp16params"),
        ("hqq_tokenwise_b2", "hqq_tokenwise_b2_fp16params"),
    ):
        diffs[f"{a}_vs_{b}"] = float((all_logits[a] - all_logits[b]).abs().max())
    # fp32.logits: in quantized_cache.safetensors (the same rows; kvq reads every *.safetensors of
    # a folder without an index as weights, so no tensor name may repeat across the files)
    assert "fp32.logits" not in tensors
    save_file(tensors, str(folder / "quantized_cache_hqq.safetensors"))
    doc = {
        "sequence_ids": seq,
        "sequence": "prompt_ids_with_special followed by greedy_ids (expected.json), fed to "
        "transformers with a QuantizedCache(backend='hqq'): the first prefill_tokens in one "
        "forward pass, then one token per forward pass",
        "rows_from": rows_from,
        "rows": f"<setting>.logits [{QUANT_ROWS}, vocab_size] float32 (settings with "
        "logits_stored): row i is the logits after feeding sequence_ids[rows_from + i]; the "
        "same rows with the fp32 DynamicCache are fp32.logits in quantized_cache.safetensors "
        "(the same sequence_ids and rows_from as quantized_cache.json)",
        "model": "AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32, "
        "attn_implementation='eager'): cache tensors are float32",
        "settings": settings,
        "max_abs_diff_logits": diffs,
        "hqq_vs_kivi": HQQ_VS_KIVI,
        "versions": versions({**PINNED, **HQQ_PINNED}),
    }
    (folder / "quantized_cache_hqq.json").write_text(json.dumps(doc, indent=1) + "\n")
    return settings


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--kjv", default=os.path.join(os.environ.get("KVQ_MODEL_DIR", "~/.cache/kvq"), "kjv.txt")
    )
    ap.add_argument("--out", default="tests/fixtures/hf")
    ap.add_argument("--only", default="")
    ap.add_argument("--no-quant", action="store_true")
    args = ap.parse_args()
    for p, want in {**PINNED, **HQQ_PINNED}.items():
        have = versions({**PINNED, **HQQ_PINNED})[p]
        if have is None or not have.startswith(want):
            print(
                f"warning: {p} {have} installed, the fixtures were made with {want}",
                file=sys.stderr,
            )
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    lines = kjv_lines(os.path.expanduser(args.kjv))
    out = Path(args.out)
    only = set(args.only.split(",")) if args.only else set(FAMILIES)
    for i, (name, spec) in enumerate(FAMILIES.items()):
        if name in only:
            write_family(name, spec, i, lines, out, not args.no_quant and name in QUANT_FAMILIES)


if __name__ == "__main__":
    main()
