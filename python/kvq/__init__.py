"""kvq: low-bit KV-cache quantization (KIVI-style 2-4 bit caches and FP8), from Python.

Every function runs the same C++ code as the ``kvq`` command line, so results agree with it bit
for bit. Schemes are named by the spec grammar the CLI uses (``kvq quant --help``)::

    fp32 | bf16 | fp16
    fp8_e4m3 | fp8_e4m3fnuz | fp8_e5m2 [:gran=tensor|head|token|channel, scale=dynamic|<num>|calib:FILE]
    int<B>:k=channel|token,v=channel|token[,g=G,r=R,sym]     B in 2, 3, 4, 8
    kivi<B>[:g=G,r=R,sym]      (= int<B>:k=channel,v=token with g=32, r=128)
    fp8 (= fp8_e4m3), int<B> (= int<B>:k=channel,v=token)

Arrays are numpy arrays of float32, float16 or float64 in C order (float16 and float64 are
converted to float32, float64 to the nearest float32 value, as ``kvq quant`` reads a float64 npy);
anything else raises kvq.Error saying how to convert. K/V tensors are [tokens, kv_heads, head_dim]
(or [tokens, head_dim] for one head).
Errors are kvq.Error (a ValueError) with the one-line message the CLI prints.

Example::

    import numpy as np, kvq
    k = np.random.default_rng(0).standard_normal((256, 8, 128), dtype=np.float32)
    k_hat, stats = kvq.quantize(k, "kivi2", role="key")
    print(stats["snr_db"], stats["effective_bits"])
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np

from . import _kvq

__all__ = [
    "Error", "DEFAULT_KV", "DEFAULT_MAX_TOKENS", "Spec", "parse_spec", "quantize", "compare", "Cache", "plan", "Model",
    "read_results", "read_text", "model_path", "backends", "cpu_paths", "schemes",
]
__version__ = "0.1.0"

Error = _kvq.Error
DEFAULT_KV: str = _kvq.default_kv  #: the scheme a call studies when kv is not given (as the CLI)
DEFAULT_MAX_TOKENS: int = _kvq.default_max_tokens  #: tokens of a text read when not given
Error.__doc__ = "A bad input or setting; the message names it and says what is allowed."
Error.__module__ = "kvq"


@dataclass(frozen=True)
class Spec:
    """A parsed scheme spec. ``str(spec)`` is the canonical spelling (every parameter explicit),
    the key kvq's result rows use.

    Example::

        >>> s = kvq.parse_spec("kivi2:g=32,r=128")
        >>> s.canonical, s.bits, s.key_axis, s.value_axis
        ('kivi2:g=32,r=128', 2, 'channel', 'token')
        >>> kvq.parse_spec("k=kivi2;v=fp8").value.gran       # keys and values apart
        'tensor'
    """

    canonical: str
    kind: str  #: fp32, bf16, fp16, fp8, int, or split (keys and values apart)
    bits: Optional[int] = None  #: int: bits per code
    key_axis: Optional[str] = None  #: int: statistics axis of keys (channel or token)
    value_axis: Optional[str] = None  #: int: statistics axis of values
    group: Optional[Union[int, str]] = None  #: int: group size G ("dim": the whole head_dim)
    residual: Optional[int] = None  #: int: recent tokens kept exact (R)
    sym: Optional[bool] = None  #: int: symmetric (no zero point)
    arith: Optional[str] = None  #: int: exact (kvq's rule) or fp16 (KIVI's own arithmetic)
    format: Optional[str] = None  #: fp8: fp8_e4m3, fp8_e4m3fnuz or fp8_e5m2
    gran: Optional[str] = None  #: fp8: tensor, head, token or channel
    scale: Optional[str] = None  #: fp8: dynamic, constant or calib
    rot: Optional[str] = None  #: any: "hadamard" or "hadamard:SEED" (rot=), else None
    sink: Optional[int] = None  #: any: the first S tokens kept exact (sink=S), else None
    key: Optional["Spec"] = None  #: split: the keys' scheme
    value: Optional["Spec"] = None  #: split: the values' scheme
    fields: dict = field(default_factory=dict, compare=False, repr=False)

    def __str__(self) -> str:
        return self.canonical


SpecLike = Union[str, Spec]


def _spec_text(spec: SpecLike, name: str = "spec") -> str:
    if isinstance(spec, Spec):
        return spec.canonical
    if isinstance(spec, str):
        return spec
    raise Error(f"{name}: expected a spec string such as 'kivi2' or a kvq.Spec, "
                f"got {type(spec).__name__}")


def parse_spec(text: SpecLike) -> Spec:
    """Parses a scheme spec; raises kvq.Error naming the bad part and what is allowed.

    Example::

        >>> kvq.parse_spec("fp8").canonical
        'fp8_e4m3:gran=tensor,scale=dynamic'
    """
    return _spec_of(json.loads(_kvq.spec_info(_spec_text(text))))


def schemes() -> list[dict]:
    """The scheme families of kvq's registry (core/schemes.h), in the order ``kvq quant --help``
    lists them: for each its ``family``, its ``kinds``, the ``names`` it parses, ``keys``: for the
    scheme of each example, the keys it takes after ``NAME:`` with their defaults (a flag such as
    ``sym``: False, off unless written), ``aliases`` (``name``, what it ``means``, and whether it
    ``rewrite``s the whole spec, as ``hf`` does), canonical ``examples`` (each parses to itself),
    and the ``keys_help`` and ``description`` lines of ``--help``.

    Example::

        >>> [f["family"] for f in kvq.schemes()]
        ['float', 'fp8', 'int']
        >>> kvq.schemes()[2]["keys"]["kivi2"]
        {'g': '32', 'r': '128', 'sym': False, 'arith': 'exact'}
    """
    return json.loads(_kvq.schemes())


def _spec_of(info: dict) -> Spec:
    names = {f for f in Spec.__dataclass_fields__ if f not in ("fields", "key", "value")}
    sides = {r: _spec_of(info[r]) for r in ("key", "value") if r in info}
    return Spec(**{k: v for k, v in info.items() if k in names}, **sides, fields=info)


def _array(a: Any, name: str, ndims: Sequence[int]) -> np.ndarray:
    """float32 C-order view of `a` (float16 and float64 are converted: the one copy), or
    kvq.Error. float64 rounds to the nearest float32, as the CLI reads a float64 npy; a finite
    value beyond float32's range would read as inf, and is refused here as the CLI refuses it."""
    if not isinstance(a, np.ndarray):
        raise Error(f"{name}: expected a numpy array, got {type(a).__name__} "
                    f"(np.asarray({name}, dtype=np.float32) converts it)")
    if a.dtype not in (np.float32, np.float16, np.float64):
        raise Error(f"{name}: dtype {a.dtype} is not supported; pass float32, float16 or float64 "
                    f"({name}.astype(np.float32))")
    if not a.flags.c_contiguous:
        raise Error(f"{name}: the array is not in C order (a transpose or a strided slice?); "
                    f"pass np.ascontiguousarray({name})")
    if a.ndim not in ndims:
        want = " or ".join(f"{d}-D" for d in ndims)
        raise Error(f"{name}: expected a {want} array, got shape {a.shape}")
    if a.dtype == np.float64:
        with np.errstate(over="ignore"):
            f = a.astype(np.float32)
        over = np.isinf(f) & np.isfinite(a)
        if over.any():
            i = np.unravel_index(int(np.argmax(over)), a.shape)
            raise Error(f"{name}: float64 value {float(a[i])!r} at index {tuple(map(int, i))} is "
                        "beyond float32's range (it would read as inf); KV caches must be finite")
        return f
    return a.astype(np.float32) if a.dtype == np.float16 else a


def _role(role: str) -> str:
    if role not in ("key", "value"):
        raise Error(f"role '{role}' is not known; use 'key' or 'value'")
    return role


def quantize(x: np.ndarray, spec: SpecLike, role: str = "key",
             layer: int = 0) -> tuple[np.ndarray, dict]:
    """Quantizes and dequantizes one layer's K or V tensor as the scheme's cache stores it.

    Returns the values read back (float32, x's shape) and the error report, the dict
    ``kvq quant`` prints (scheme, effective_bits, mse, nmse, snr_db, max_abs_err, cosine, ...).
    x is [tokens, kv_heads, head_dim] or [tokens, head_dim]; ``layer`` picks calib scales.

    Example::

        >>> k_hat, stats = kvq.quantize(k, "kivi2", role="key")
        >>> stats["effective_bits"]
        3.0
    """
    x = _array(x, "x", (2, 3))
    values, stats = _kvq.quantize(x, _spec_text(spec), _role(role), int(layer))
    return values, json.loads(stats)


def compare(x: np.ndarray, specs: Iterable[SpecLike], role: str = "key") -> list[dict]:
    """``quantize``'s report for each spec on the same tensor, one dict per spec (as
    ``kvq compare --json``). Every spec is parsed before any work.

    Example::

        >>> rows = kvq.compare(k, ["fp8", "kivi4", "kivi2"], role="key")
        >>> [(r["scheme"], round(r["snr_db"], 1)) for r in rows]
    """
    x = _array(x, "x", (2, 3))
    if isinstance(specs, (str, Spec)):
        specs = [specs]
    texts = [_spec_text(s, "specs") for s in specs]
    if not texts:
        raise Error("specs: give at least one scheme spec")
    return [json.loads(r) for r in _kvq.compare(x, texts, _role(role))]


def backends() -> list[dict]:
    """The attention backends (kernels/backend.h's one table), in order: for each its ``name``,
    ``what`` it is, whether it runs ``decode`` / ``causal`` attention, the ``model``, ``rot=``,
    ``sink=`` and ``pre_rope``, whether its cache is in ``host_memory``, and ``unavailable``: empty
    when it can run here, else the one line why not (e.g. "backend cuda: no CUDA device (...)")."""
    return json.loads(_kvq.backends())


def cpu_paths() -> dict:
    """Backend cpu's CPU paths (README, "CPU paths"), as ``kvq --version``'s second line:
    ``compiled`` (the paths built in, widest last), ``supported`` (those this CPU runs),
    ``running`` (the one this process runs: the widest supported one, or the one the environment
    variable KVQ_CPU_PATH names, read at first use) and ``isa`` (its instruction sets). The
    model's weight products run the same path; every path gives the same results within the
    tolerances kernels/cpu/attention.h states (the products and quantizers bit for bit).

    Example::

        >>> kvq.cpu_paths()
        {'compiled': ['portable', 'avx2', 'avx512', 'avx512bf16'], 'supported': [...],
         'running': 'avx512bf16', 'isa': 'avx2+fma+f16c+vnni+avx512+amx'}
    """
    compiled, supported, running, isa = _kvq.cpu_paths()
    return {"compiled": compiled.split(", "), "supported": supported.split(", "),
            "running": running, "isa": isa}


class Cache:
    """One layer's streaming KV cache in any scheme: append K/V as they arrive, attend over what
    is stored (the codes are read directly, never dequantized first).

    ``backend`` is "cpu" (SIMD kernels, the default), "cpu-int8" (backend cpu with
    ``int_mode="int8"``), "ref" (the scalar reference) or "cuda" (the bytes in GPU memory, written
    by the CUDA quantize kernels; decode and causal attention, numpy in and out; bf16, fp8 with
    per-token or fixed scales, int/kivi; no sink=; a missing GPU is one error line); all store
    the same bytes. ``kvq.backends()`` lists what each one runs.
    ``int_mode="int8"`` (backend cpu) uses integer dot products on 2/4-bit codes:
    per-channel keys against int8 queries, per-token values against 8-bit softmax weights; and bf16
    dot products on FP8 codes (builds for CPUs with AVX-512 BF16 and VBMI, head_dim a multiple of
    32).
    ``threads`` 0 uses every core.

    Example::

        >>> c = kvq.Cache("kivi2", heads=8, head_dim=128)
        >>> c.append(k, v)                  # [n, 8, 128] each
        >>> o = c.attend(q)                 # q [32, 128]: decode, GQA 4 -> [32, 128]
        >>> o = c.attend(q_chunk)           # q [n, 32, 128]: causal over the last append
    """

    def __init__(self, spec: SpecLike, heads: int, head_dim: int, backend: str = "cpu",
                 layer: int = 0, int_mode: str = "exact", threads: int = 0):
        self._c = _kvq.Cache(_spec_text(spec), int(heads), int(head_dim), str(backend),
                             int(layer), str(int_mode), int(threads))

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """Appends n tokens: k and v are [n, heads, head_dim] ([n, head_dim] with one head).
        Tokens leave the residual window and are quantized as the scheme's rules say.

        Example::

            >>> c = kvq.Cache("kivi2", heads=8, head_dim=128)
            >>> c.append(k[:512], v[:512]); c.append(k[512:513], v[512:513]); c.tokens
            513
        """
        self._c.append(self._kv(k, "k"), self._kv(v, "v"))

    def attend(self, q: np.ndarray) -> np.ndarray:
        """softmax(q K^T / sqrt(head_dim)) V per query head (query head j reads kv head
        j // (q_heads // heads)).

        q [q_heads, head_dim]: one decode step over every token; returns [q_heads, head_dim].
        q [n, q_heads, head_dim]: causal attention for the last n tokens (all from the latest
        append); position t sees tokens 0..t exactly as a cache holding t + 1 tokens stores them
        (quantized outside the residual window), as chunked prefill does; returns [n, q_heads,
        head_dim].

        Example::

            >>> c.append(k_chunk, v_chunk)              # [256, 8, 128] each
            >>> c.attend(q_chunk).shape                  # q_chunk [256, 32, 128]: causal
            (256, 32, 128)
            >>> c.attend(q_chunk[-1]).shape              # decode at the last position
            (32, 128)
        """
        return self._c.attend(_array(q, "q", (2, 3)))

    def dequantize(self) -> tuple[np.ndarray, np.ndarray]:
        """The K and V values the cache reads back, [tokens, heads, head_dim] each.

        Example::

            >>> k_read, v_read = c.dequantize()
            >>> float(np.abs(k_read - k).max())          # the quantization error of the keys
        """
        return self._c.dequantize()

    def footprint(self) -> dict:
        """Bytes stored: {"key": {...}, "value": {...}} with code, scale, zero and residual bytes,
        effective bits (codes + scales + zeros per quantized element) and overall bits.

        Example::

            >>> c.footprint()["key"]["effective_bits"]   # kivi2, groups of 32: 2 + 2 x 16 / 32
            3.0
        """
        return json.loads(self._c.footprint())

    @property
    def tokens(self) -> int:
        """Tokens appended so far."""
        return self._c.tokens

    @property
    def spec(self) -> str:
        """The canonical spec."""
        return self._c.spec

    @property
    def backend(self) -> str:
        return self._c.backend

    def __len__(self) -> int:
        return self._c.tokens

    def __repr__(self) -> str:
        return (f"kvq.Cache('{self.spec}', heads={self._c.heads}, head_dim={self._c.head_dim}, "
                f"backend='{self.backend}', tokens={self.tokens})")

    def _kv(self, a: np.ndarray, name: str) -> np.ndarray:
        a = _array(a, name, (2, 3))
        if a.ndim == 2:
            if self._c.heads != 1:
                raise Error(f"{name}: a 2-D array is [n, head_dim] for a one-head cache; this "
                            f"cache has {self._c.heads} heads, so pass [n, {self._c.heads}, "
                            f"{self._c.head_dim}]")
            a = a.reshape(a.shape[0], 1, a.shape[1])
        return a


def plan(model: Optional[str] = None, gpu: Optional[str] = None,
         kv: Sequence[str] = ("bf16", "fp8", "kivi4", "kivi2"), ctx: int = 4096,
         batch: int = 64, decode_ctx: int = 2000, mem: Union[None, str, float] = None,
         weights_gb: Optional[float] = None, weights_dtype: str = "bf16",
         layers: Optional[int] = None, kv_heads: Optional[int] = None,
         head_dim: Optional[int] = None, params: Optional[float] = None,
         bandwidth: Optional[float] = None, full: bool = False) -> Union[list[dict], dict]:
    """``kvq plan``: KV-cache capacity and the decode-step bandwidth bound, one row per format.

    Arguments mirror the CLI flags (``kvq plan --help``): a model preset or custom dimensions
    (layers, kv_heads, head_dim, params in billions), a GPU preset or bandwidth in TB/s, ``mem``
    in GB ("80GiB" or a number; default 90% of the GPU minus the weights, or the design note's
    55 GB when neither model nor GPU is named). Returns the rows (dicts with bytes_per_token,
    tokens_in_mem, requests, decode_batch, step_ms, tokens_per_s, speedup_vs_bf16, ...), or the
    whole report (assumptions and notes too) with ``full=True``.

    Example::

        >>> rows = kvq.plan(model="llama-3.1-8b", gpu="h100-sxm", kv=["bf16", "kivi2"])
        >>> rows[0]["bytes_per_token"]
        131072.0
    """
    if isinstance(kv, str):
        kv = [kv]
    args = {"model": model, "gpu": gpu, "kv": [_spec_text(s, "kv") for s in kv],
            "ctx": _int(ctx, "ctx"), "batch": _int(batch, "batch"),
            "decode_ctx": _int(decode_ctx, "decode_ctx"), "mem": mem, "weights_gb": weights_gb,
            "weights_dtype": weights_dtype, "layers": _int(layers, "layers"),
            "kv_heads": _int(kv_heads, "kv_heads"), "head_dim": _int(head_dim, "head_dim"),
            "params": _num(params, "params"), "bandwidth": _num(bandwidth, "bandwidth")}
    if weights_gb is not None:
        args["weights_gb"] = _num(weights_gb, "weights_gb")
    if mem is not None and not isinstance(mem, str):
        args["mem"] = _num(mem, "mem")
    report = json.loads(_kvq.plan(json.dumps(args)))
    return report if full else report["rows"]


def _int(v: Any, name: str) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise Error(f"{name}: expected a whole number, got {v!r}")
    return int(v)


def _num(v: Any, name: str) -> Optional[float]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise Error(f"{name}: expected a number, got {v!r}")
    return float(v)


def model_path(path: Optional[str] = None) -> str:
    """The model kvq uses: ``path`` (a GGUF file or a Hugging Face checkpoint folder), else
    SmolLM2-135M-Instruct.Q4_1.gguf in $KVQ_MODEL_DIR or ~/.cache/kvq (scripts/fetch-model.sh
    fetches it); kvq.Error when the path is missing.

    Example::

        >>> kvq.model_path()
        '/home/me/.cache/kvq/SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    return _kvq.model_path(path or "")


def read_text(source: str) -> str:
    """A text file's contents; "kjv" is the King James Bible (scripts/fetch-text.sh).

    Example::

        >>> kvq.read_text("kjv")[:30]
    """
    return _kvq.read_text(source)


def _backend_name(backend: Any) -> str:
    """A backend name for the C++ side (kernels/backend.h's parser checks it), or kvq.Error."""
    if not isinstance(backend, str):
        raise Error(f"backend: expected a name such as 'cpu' or 'cuda', "
                    f"got {type(backend).__name__}")
    return backend


class Model:
    """A Llama-family model with a KV cache in any scheme: a llama GGUF (default
    SmolLM2-135M-Instruct Q4_1; weights stay in their GGUF blocks) or a Hugging Face checkpoint
    folder (config.json, *.safetensors, tokenizer.json) of the families llama, mistral, qwen2,
    qwen3. ``weights`` says how a folder's F32/F16/BF16 weights are held: "mapped" (the default:
    multiplied where they lie in the mapped files, never copied), "packed" (copied into 16-bit or
    fp32 column panels) or "fp32" (the plain reference product); the same logits bit for bit.
    Logits are exact fp32 arithmetic.

    ``backend`` is the attention backend of every call that names none (each call's ``backend=``
    overrides it), by the CLI's names (``kvq.backends()``): "cpu" (the default), "cpu-int8",
    "ref", or "cuda": the whole model on the GPU (bf16 weights, prompts in chunks of 256 tokens,
    decode token by token, the cache in device memory; ppl / needle / ruler then measure against
    a bf16 cache, since backend cuda stores no fp32 ones, and their rows say so in
    ``reference``). Without a device or a CUDA build, ``backend="cuda"`` raises kvq.Error with
    the one line ``kvq.backends()`` gives as cuda's ``unavailable``, before the weights load.

    Example::

        >>> m = kvq.Model()
        >>> r = m.ppl(kvq.read_text("kjv"), kv=["kivi4", "kivi2"], ctx=512, max_tokens=2048)
        >>> [(x["kv"], round(x["kld"], 4)) for x in r]
        >>> m.generate("The capital of France is", n=8)
    """

    def __init__(self, path: Optional[str] = None, weights: str = "mapped", backend: str = "cpu"):
        self._m = _kvq.Model(path or "", weights, _backend_name(backend))
        self.backend: str = backend
        """the attention backend of every call that gives none (``kvq.backends()``)"""
        self.config: dict = json.loads(self._m.config())
        """layers, hidden, heads, kv_heads, head_dim, ffn, vocab, context, weights, path, family"""

    def _backend(self, backend: Optional[str]) -> str:
        return self.backend if backend is None else _backend_name(backend)

    def encode(self, text: str, max_tokens: int = 0, chat: bool = False) -> list[int]:
        """Token ids of ``text`` (the first ``max_tokens`` when > 0); ``chat`` wraps it in the
        instruct template as a user message.

        Example::

            >>> m.encode("In the beginning")
            [788, 260, 3616]
        """
        return self._m.encode(str(text), int(max_tokens), bool(chat))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids (``decode(encode(s)) == s``).

        Example::

            >>> m.decode(m.encode("In the beginning"))
            'In the beginning'
        """
        return self._m.decode([int(i) for i in ids])

    def ppl(self, text: Union[str, Sequence[int]], kv: Union[SpecLike, Sequence[SpecLike]] = DEFAULT_KV,
            ctx: int = 512, max_tokens: int = DEFAULT_MAX_TOKENS, stride: int = 0, chunk: int = 256,
            threads: int = 0, backend: Optional[str] = None) -> Union[dict, list[dict]]:
        """Perplexity with each scheme's cache, with KL divergence and top-1 agreement against
        the fp32 cache on the same windows (computed once for all schemes), as ``kvq model ppl``.

        ``text`` is a string (or token ids); windows of ``ctx`` tokens, ``stride`` apart
        (0: ctx), over the first ``max_tokens`` tokens (0: all; default 2,048, as the CLI). Returns a dict (one spec) or a
        list of dicts (kv, ppl, ppl_fp32, delta_ppl, kld, kld_p99, top1, windows, scored, seconds;
        X_lo and X_hi: the 95% interval of ppl, ppl_fp32, delta_ppl, kld and top1, a block
        bootstrap over the scored positions with ci_blocks blocks, None when unknown; quantized:
        the fraction of the attended K/V stored quantized, as ``kvq run``'s model rows).
        ``backend``: attention on "cpu" (SIMD kernels), "cpu-int8" (their reduced-precision dot
        products on 2/4-bit and FP8 codes), "ref" (the scalar reference) or "cuda" (the model on
        the GPU, against a bf16 reference cache), as ``kvq model --backend``; None: the Model's.
        Ctrl-C stops it between chunks.

        Example::

            >>> m.ppl(kvq.read_text("kjv"), kv="kivi2", ctx=512, max_tokens=2048)["kld"]
        """
        one = isinstance(kv, (str, Spec))
        specs = [_spec_text(kv, "kv")] if one else [_spec_text(s, "kv") for s in kv]
        if not specs:
            raise Error("kv: give at least one scheme spec")
        ids = self._ids(text, max_tokens)
        rows = [json.loads(r) for r in self._m.ppl(ids, specs, _int(ctx, "ctx"),
                                                   _int(stride, "stride"), _int(chunk, "chunk"),
                                                   _int(threads, "threads"),
                                                   self._backend(backend))]
        return rows[0] if one else rows

    def generate(self, prompt: str, n: int = 64, kv: SpecLike = DEFAULT_KV, chat: bool = False,
                 threads: int = 0, backend: Optional[str] = None) -> str:
        """Greedy continuation of ``prompt`` (up to ``n`` tokens, stopping at end-of-text) with
        the cache in scheme ``kv``; ``chat`` applies the instruct template. Ctrl-C stops it.

        Example::

            >>> m.generate("The capital of France is", n=4, kv="kivi2")
            ' Paris.\\n\\n'
        """
        ids = self.encode(prompt, chat=chat)
        if not ids:
            raise Error("the prompt is empty after tokenization")
        out = self._m.generate(ids, _int(n, "n"), _spec_text(kv, "kv"), _int(threads, "threads"),
                               self._backend(backend))
        if out and out[-1] == self._m.eos:
            out = out[:-1]
        return self.decode(out)

    def dump_kv(self, text: Union[str, Sequence[int]], max_tokens: int = DEFAULT_MAX_TOKENS,
                threads: int = 0) -> list[dict]:
        """Per-layer K and V of ``text`` from the forward pass (fp32 cache), as
        ``kvq model dump``: one dict per layer with "k" (post-RoPE), "k_pre" (pre-RoPE) and "v",
        float32 [tokens, kv_heads, head_dim]; feed them to quantize, compare or Cache.

        Example::

            >>> layers = m.dump_kv(kvq.read_text("kjv"), max_tokens=1024)
            >>> kvq.compare(layers[10]["k"], ["kivi2", "int2:k=token,v=token"])
        """
        ids = self._ids(text, max_tokens)
        return [{"k": k, "k_pre": kp, "v": v} for k, kp, v in self._m.dump_kv(ids, _int(threads, "threads"))]

    def logits(self, text: Union[str, Sequence[int]], kv: SpecLike = DEFAULT_KV,
               max_tokens: int = DEFAULT_MAX_TOKENS, threads: int = 0,
               backend: Optional[str] = None) -> np.ndarray:
        """Next-token logits of every position of ``text`` (a string or token ids; the first
        ``max_tokens``) with the cache in scheme ``kv``: float32 [tokens, vocab], bit-identical to
        the npy ``kvq model logits --kv KV --out l.npy`` writes. ``encode(text, max_tokens)``
        gives the ids (``--ids-out``). One forward pass: Ctrl-C waits for it.

        Example::

            >>> l = m.logits(kvq.read_text("kjv"), kv="fp32", max_tokens=300)
            >>> l.shape
            (300, 49152)
        """
        ids = self._ids(text, max_tokens)
        return self._m.logits(ids, _spec_text(kv, "kv"), _int(threads, "threads"),
                              self._backend(backend))

    def diverge(self, prompt: Union[str, Sequence[int]], kv: SpecLike = DEFAULT_KV,
                vs: SpecLike = "fp32", n: int = 64, chat: bool = False, threads: int = 0,
                backend: Optional[str] = None) -> dict:
        """Greedy outputs of the cache in ``vs`` (the reference) and in ``kv`` side by side, as
        ``kvq model diverge`` (its --json object): kv, vs, backend, prompt_tokens, ref and test
        (the generated token ids), first_diff (the first step where they differ, -1 if none) and
        top1 (teacher-forced agreement of the kv cache's argmax with the reference's next token).
        ``prompt`` is text (``chat`` wraps it in the instruct template) or token ids. Ctrl-C
        waits for the n steps.

        Example::

            >>> r = m.diverge("The capital of France is", kv="kivi2", n=32)
            >>> r["first_diff"], m.decode(r["test"])
        """
        if isinstance(prompt, str):
            ids = self.encode(prompt, chat=chat)
        else:
            ids = [int(i) for i in prompt]
        if not ids:
            raise Error("the prompt is empty after tokenization")
        return json.loads(self._m.diverge(ids, _spec_text(kv, "kv"), _spec_text(vs, "vs"),
                                          _int(n, "n"), _int(threads, "threads"),
                                          self._backend(backend)))

    def needle(self, kv: SpecLike = DEFAULT_KV,
               ctx: Union[int, Sequence[int]] = (1024, 2048, 4096, 8192),
               depth: Union[float, Sequence[float]] = (0.1, 0.5, 0.9), trials: int = 1,
               seed: int = 1, text: Optional[str] = None, threads: int = 0,
               backend: Optional[str] = None) -> list[dict]:
        """Passkey retrieval, as ``kvq model needle`` (the same prompts, keys and rows as its
        --json): a 5-digit pass key hidden at each ``depth`` (0 to 1) of a haystack of ``ctx``
        tokens (256 to the model's context), ``trials`` keys per cell from ``seed``, answered
        greedily with the fp32 cache and with ``kv``. One dict per case, in ctx x depth x trial
        order: ctx, depth, key, fp32_correct, fp32_logprob, correct, logprob (the mean
        log-probability of the key's tokens). ``text`` is the haystack (default: the King James
        Bible). Ctrl-C stops it between cases.

        Example::

            >>> rows = m.needle(kv="kivi2", ctx=[1024], depth=[0.5], trials=2)
            >>> sum(r["correct"] for r in rows), sum(r["fp32_correct"] for r in rows)
        """
        ctxs = [ctx] if isinstance(ctx, (int, np.integer)) else list(ctx)
        depths = [depth] if isinstance(depth, (int, float, np.number)) else list(depth)
        hay = read_text("kjv") if text is None else str(text)
        rows = self._m.needle(_spec_text(kv, "kv"), [_int(c, "ctx") for c in ctxs],
                              [_num(d, "depth") for d in depths], _int(trials, "trials"),
                              _int(seed, "seed"), hay, _int(threads, "threads"),
                              self._backend(backend))
        return [json.loads(r) for r in rows]

    def ruler_case(self, task: str, length: int, sample: int = 0, seed: int = 1,
                   haystack: str = "kjv") -> dict:
        """One case of the RULER-style suite, the one ``kvq run``'s [ruler] task builds for the
        same ``task`` (RULER's name: niah_single_1..3, niah_multikey_1..3, niah_multivalue,
        niah_multiquery, vt, cwe, fwe), ``length`` (tokens: prompt plus the task's generation
        budget), ``seed`` and ``sample``, from ``haystack`` ("kjv", "noise" or a text file). A dict:
        prompt (token ids, the chat template around the task with RULER's answer prefix),
        answers (what the output must contain) and gen_tokens (the task's budget).

        Example::

            >>> c = m.ruler_case("niah_multikey_1", 2048, sample=3)
            >>> len(c["prompt"]) + c["gen_tokens"], c["answers"]
        """
        prompt, answers, gen = self._m.ruler_case(str(task), _int(length, "length"),
                                                  _int(seed, "seed"), _int(sample, "sample"),
                                                  str(haystack))
        return {"prompt": list(prompt), "answers": list(answers), "gen_tokens": gen}

    def ruler(self, kv: SpecLike = DEFAULT_KV, task: Union[None, str, Sequence[str]] = None,
              length: Union[int, Sequence[int]] = (1024, 2048, 4096), samples: int = 5,
              seed: int = 1, haystack: str = "kjv", max_new: int = 0, threads: int = 0,
              backend: Optional[str] = None) -> list[dict]:
        """The RULER-style long-context suite, as ``kvq run``'s [ruler] task (the same cases,
        greedy outputs and scores as its rows): every ``length`` x ``task`` (default: all of
        them) x sample (``samples`` from ``seed``) answered with the fp32 cache and with ``kv``,
        scored by RULER's string_match_all. One dict per case in that order: length, task,
        sample, answers (a list), prompt_tokens, fp32_score, fp32_output, score, output,
        generated (``kv``'s tokens, the stop token included). ``max_new`` > 0 caps the generated
        tokens (``kvq run --smoke`` uses 4); ``haystack`` is "kjv", "noise" or a text file.
        Ctrl-C stops it between tokens.

        Example::

            >>> rows = m.ruler(kv="kivi2", task="niah_single_2", length=[1024, 4096], samples=2)
            >>> [(r["length"], r["score"], r["fp32_score"]) for r in rows]
        """
        # None: every task (the C++ side's list, RULER's order)
        tasks = [] if task is None else [task] if isinstance(task, str) else [str(t) for t in task]
        if task is not None and not tasks:
            raise Error("task: give at least one task name (or None for all of them)")
        lengths = [length] if isinstance(length, (int, np.integer)) else list(length)
        rows = self._m.ruler(_spec_text(kv, "kv"), tasks, [_int(x, "length") for x in lengths],
                             _int(samples, "samples"), _int(seed, "seed"), str(haystack),
                             _int(max_new, "max_new"), _int(threads, "threads"),
                             self._backend(backend))
        return [json.loads(r) for r in rows]

    def calibrate(self, text: Optional[str] = None, max_tokens: int = DEFAULT_MAX_TOKENS,
                  skip_tokens: int = 0, ctx: int = 1024, pre_rope: bool = False,
                  out: Union[None, str, os.PathLike] = None, text_name: Optional[str] = None,
                  threads: int = 0, backend: Optional[str] = None) -> dict:
        """Per-layer, per-head amax of K (post-RoPE; pre-RoPE with ``pre_rope``) and V over
        ``max_tokens`` tokens of ``text`` after the first ``skip_tokens``, in windows of ``ctx``
        tokens, as ``kvq model calibrate``: a dict with model, source, k_amax and v_amax (float32
        [layers, kv_heads]). With ``out`` it also writes the calibration file FP8
        ``scale=calib:FILE`` reads, byte for byte the CLI's (``text_name`` is how its source line
        names the text: default "kjv" for the default text, else "text"). Ctrl-C stops it
        between chunks.

        Example::

            >>> c = m.calibrate(skip_tokens=100000, max_tokens=8192, out="scales.json")
            >>> c["k_amax"].shape
            (30, 3)
            >>> m.ppl(kvq.read_text("kjv"), kv="fp8:gran=head,scale=calib:scales.json")
        """
        name = text_name if text_name is not None else ("kjv" if text is None else "text")
        body = read_text("kjv") if text is None else str(text)
        model, source, k, v = self._m.calibrate(
            body, str(name), _int(max_tokens, "max_tokens"), _int(skip_tokens, "skip_tokens"),
            _int(ctx, "ctx"), bool(pre_rope), _int(threads, "threads"), self._backend(backend),
            os.fspath(out) if out is not None else "")
        return {"model": model, "source": source, "k_amax": k, "v_amax": v}

    def _ids(self, text: Union[str, Sequence[int]], max_tokens: int) -> list[int]:
        if isinstance(text, str):
            return self.encode(text, _int(max_tokens, "max_tokens"))
        ids = [int(i) for i in text]
        return ids[:max_tokens] if max_tokens and max_tokens > 0 else ids

    def __repr__(self) -> str:
        c = self.config
        return (f"kvq.Model('{c['path']}': {c['layers']} layers, {c['kv_heads']} kv heads x "
                f"{c['head_dim']})")


def read_results(directory: Union[str, os.PathLike]) -> "pandas.DataFrame":
    """The rows of a ``kvq run`` output directory (every <task>.jsonl: synthetic, model, needle,
    throughput) as one pandas DataFrame, a row per result row, with a ``task`` column; nested
    objects are flattened into dotted columns as in the CSV files (``settings.ctx``,
    ``machine.cpu``, ...), and a column a task does not have is NaN in its rows. pandas is in the
    project's venv (python/requirements.txt).

    Example::

        >>> df = kvq.read_results("results/default")
        >>> df[df.task == "model"][["scheme", "settings.ctx", "kld"]]
    """
    try:
        import pandas as pd
    except ImportError:
        raise Error("read_results returns a pandas DataFrame: pip install pandas (the project's "
                    "venv has it, python/requirements.txt)") from None

    d = os.fspath(directory)
    if not os.path.isdir(d):
        raise Error(f"{d}: not a directory (give a kvq run output directory, e.g. results/default)")
    rows: list[dict] = []
    files = sorted(f for f in os.listdir(d) if f.endswith(".jsonl"))
    if not files:
        raise Error(f"{d}: no result rows (*.jsonl) here; is it a kvq run output directory?")
    for f in files:
        task = f[: -len(".jsonl")]
        with open(os.path.join(d, f), encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise Error(f"{os.path.join(d, f)}:{n}: not a JSON row ({e.msg})") from None
                if not isinstance(row, dict):
                    raise Error(f"{os.path.join(d, f)}:{n}: not a JSON object")
                rows.append({"task": task, **row})
    return pd.json_normalize(rows)
