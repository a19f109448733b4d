#!/usr/bin/env python3
"""The compile-time evidence for every CUDA kernel (issue 46, "With and without a GPU at hand"):
registers, spills, shared memory and the occupancy they allow on an H200 SM, and the SASS
instruction count of each loop, per stored element against the roofline budget for the decode
kernels' main loops. One command, no GPU needed:

    python3 scripts/cuda-evidence.py [--out FILE] [--json] [--loops all|innermost|main|none]

What it does, step by step:
 1. Reads the build's own compile commands (BUILD/compile_commands.json, default build/default)
    and takes every CUDA translation unit under kernels/cuda/ (the decode, quantize and model
    kernels). Each is compiled again, one at a time under `nice`, from its command's directory
    with the same flags, except: one target (--generate-code=arch=compute_90,code=[sm_90]),
    `-Xptxas -v`, and the object written to a temporary folder (the build's objects untouched).
 2. Parses ptxas's per-function lines ("Used N registers, ... bytes smem", "bytes stack frame,
    bytes spill stores, bytes spill loads") and demangles the names with c++filt.
 3. Runs `cuobjdump -sass` (the instructions) and `cuobjdump -elf` (EIATTR_MAX_THREADS: the block
    size __launch_bounds__ names) on the object.
 4. Per kernel: the block's threads (EIATTR_MAX_THREADS, else BLOCK_THREADS below: the launcher's
    block), static shared memory (ptxas) plus the dynamic shared memory the launcher asks
    (DYNAMIC_SMEM below: a formula copied from the source, with the source lines it mirrors; if
    any of those lines is no longer in the source, the figure reads "see launcher" instead of a
    stale number), and the occupancy these allow on an H200 SM (occupancy() below, the rules of
    CUDA's cuda_occupancy.h for sm_90).
 5. Per loop: a loop is a back edge of the SASS control-flow graph (a branch to an instruction
    that dominates it; as nvcc lays code out, a backward branch). Back edges to one header are
    one loop (a loop with two backward branches is one loop); a loop's instructions are its
    natural loop's, less those of the loops nested in it (nested loops are counted innermost:
    each instruction belongs to the innermost loop holding it). "warp-instr." is the static count
    of those instructions (both arms of a branch inside the loop: an upper bound on what one
    iteration issues when the body branches), with the HMMA, LDSM, LDS, LDG, LDGSTS (cp.async),
    LOP3 and PRMT among them.
 6. For the decode kernels' main loops (PER_ELEMENT below: the tensor-core split kernels, whose
    loops whose own instructions hold HMMAs, in address order, are the key loop and the value
    loop, as the source orders them): per stored element = warp-instr. x 32 / the elements a warp
    takes an iteration, against the budget at 90% of the H200's HBM peak (BUDGET below). A loop
    nested in one of them (a copy loop) counts once ("own + nested", figure marked "nested
    once"): how often it runs an iteration is not in the SASS. Other kernels' loops are listed
    without a per-element figure (their element mapping is not tabled here).

Output: a markdown table, one row per kernel instantiation (resources, occupancy, main loops),
then one per loop (--loops: "innermost" (default), "all" (outer loops too, with their own
instructions), "main" (the decode kernels' key / value loops only) or "none"); --json gives
the same as JSON. Rows are sorted by source file, then kernel name (numbers in numeric order).

Needs nvcc (the build's) and cuobjdump: --cuobjdump PATH, else cuobjdump on PATH, else
/tmp/cuvenv/lib/python3.11/site-packages/nvidia/cu13/bin/cuobjdump (PyPI's
nvidia-cuda-cuobjdump). Takes about 4 minutes on 2 cores (attention_kernels.cu, 81 kernel
instantiations, is most of it). --only REGEX limits the translation units (e.g. attention_mma).
"""
import argparse
import collections
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PIP_CUOBJDUMP = "/tmp/cuvenv/lib/python3.11/site-packages/nvidia/cu13/bin/cuobjdump"
ARCH_FLAG = "--generate-code=arch=compute_90,code=[sm_90]"

# ---- the H200 SM (sm_90), as CUDA 13.0's cuda_occupancy.h computes occupancy --------------------
H200 = {
    "regs_per_sm": 65536,
    "regs_per_block": 65536,
    "max_regs_per_thread": 255,
    "reg_unit": 256,  # registers go to a warp in units of 256 (cudaOccRegAllocationGranularity)
    "sub_partitions": 4,  # a warp's registers come from one of 4 sub-partitions (16,384 each)
    "smem_per_sm": 228 * 1024,
    "smem_per_block": 227 * 1024,  # the most a block may opt in to
    "smem_reserved": 1024,  # the driver's shared memory per block (reservedSharedMemPerBlock)
    "smem_unit": 128,  # cudaOccSMemAllocationGranularity for compute capability 9
    "max_warps": 64,
    "max_blocks": 32,
}

# ---- the roofline budget ------------------------------------------------------------------------
# Thread-instructions per stored element at 90% of the H200's 4,814 GB/s, everything included:
# docs/device-runs/2026-12-04-h200/README.md, "The budget per SM" (= ../shared/gpu/h200-2026-12-04/
# README.md): 18.4 bytes per cycle per SM at peak (16.5 at 90%), 128 thread-instructions per cycle,
# so 128 / (16.5 / bytes per element): bf16 ~15.5, FP8 ~7.8, kivi4 (5 bits with its fp16 scale and
# minimum per 32) ~4.9, kivi2 (3 bits) ~2.9. (kivi at G = 64 stores 4.5 / 2.5 bits; its budget is
# read as G = 32's, the stricter.)
BUDGET = {"bf16": 15.5, "fp8": 7.8, "kivi4": 4.9, "kivi2": 2.9}
BUDGET_SOURCE = "docs/device-runs/2026-12-04-h200/README.md, \"The budget per SM\""

# ---- the decode kernels' main loops: elements a warp takes an iteration -------------------------
# (pattern on the short kernel name, format, elements per warp-iteration of the key loop and of
# the value loop from the match, source)
def _int_key_runs(d):
    return 2 if d == 64 else 1  # IntSmem<D, B>::kKeyRuns


PER_ELEMENT = [
    (re.compile(r"^mma_int_split_kernel<(\d+), (\d+), \d+(?:, \w+)*>$"),
     lambda m: "kivi%s" % m.group(2),
     lambda m: (32 * _int_key_runs(int(m.group(1))) * int(m.group(1)), 32 * int(m.group(1))),
     "key: 32 kKeyRuns tokens x D (IntSmem::kKeyRuns runs of mma_int::kSpan tokens a warp a "
     "tile: 2 at D 64, else 1), value: 32 tokens x D (attention_mma.cu)"),
    (re.compile(r"^mma_fp8_split_kernel<(\d+), \w+>$"),
     lambda m: "fp8", lambda m: (16 * int(m.group(1)),) * 2,
     "16 tokens x D (16 tokens a warp a tile, kTile = 16 kWarps)"),
    (re.compile(r"^mma_split_kernel<(\d+)>$"),
     lambda m: "bf16", lambda m: (16 * int(m.group(1)),) * 2,
     "16 tokens x D (16 tokens a warp a tile, kTile = 16 kWarps)"),
]

# ---- dynamic shared memory the launchers ask ----------------------------------------------------
# Per kernel (short name, template arguments stripped): the bytes as a function of the template
# arguments (the largest launch), what it is, and the source text the formula copies (file, text
# that must occur in it, runs of white space read as one space). If one of these texts is not in
# the source any more, the figure reads "see launcher" (the formula may be stale), not a number.
_MMA = "kernels/cuda/attention_mma.cu"
_MMA_COMMON = [
    (_MMA, "constexpr int kThreads = 128;"),
    (_MMA, "constexpr int kTile = 16 * kWarps;"),
    (_MMA, "constexpr int kStages = 2;"),
    (_MMA, "constexpr int kScoreFloats = 4096;"),
]
_SCORES = 4096 * 4  # nq * split_tokens <= kScoreFloats floats of scores (the largest split)


def _smem_bf16(d):
    stage_bytes = 2 * (64 * d) * 2  # kStages * kStageHalves * 2
    return stage_bytes + _SCORES


def _smem_int(d, b):
    runs = _int_key_runs(d) * 4  # kKeyRuns kWarps staged key runs a stage
    words = runs * (d // 4 + 4) * 4 * b  # kKeyRunWords = kKeyClassWords * 4 B
    params = runs * 2 * 4 * (d // 8 + 4)  # halves: 2 kKeyParamWords a run
    stage = words * 4 + 2 * params * 2
    red = 4 * 8 * d * 4
    return max(2 * stage, red) + d // 16 * 32 * 16 + 32 + _SCORES  # + kConstBytes


def _smem_fp8(d):
    stage = 64 * d
    red = 4 * 8 * d * 4
    return max(2 * stage, red) + _SCORES


DYNAMIC_SMEM = {
    "mma_split_kernel": {
        "bytes": lambda a: _smem_bf16(a[0]),
        "what": "Smem<D>::bytes(nq x split_tokens), nq x split_tokens <= kScoreFloats (4096)",
        "anchors": _MMA_COMMON + [
            (_MMA, "static constexpr int kStageHalves = kTile * D;"),
            (_MMA, "static constexpr int kStageBytes = kStages * kStageHalves * 2;"),
            (_MMA, "return static_cast<size_t>(kStageBytes) + "
                   "static_cast<size_t>(score_floats) * 4;"),
        ],
    },
    "mma_int_split_kernel": {
        "bytes": lambda a: _smem_int(a[0], a[1]),
        "what": "IntSmem<D, B>::bytes(nq x split_tokens), nq x split_tokens <= kScoreFloats (4096)",
        "anchors": _MMA_COMMON + [
            (_MMA, "constexpr int kTileI = kWarps * mma_int::kSpan;  // tokens per int stage"),
            ("kernels/cuda/mma_int.h", "inline constexpr int kE = 4;"),
            ("kernels/cuda/mma_int.h", "inline constexpr int kSpan = 8 * kE;"),
            (_MMA, "static constexpr int kKeyRuns = D == 64 ? 2 : 1;"),
            (_MMA, "static constexpr int kWords = kKeyRuns * kWarps * mma_int::kKeyRunWords<D, B>;"),
            (_MMA, "static constexpr int kParams = kKeyRuns * kWarps * 2 * "
                   "mma_int::kKeyParamWords<D>;"),
            ("kernels/cuda/mma_int.h", "inline constexpr int kKeyClassWords = D / 4 + 4;"),
            ("kernels/cuda/mma_int.h",
             "inline constexpr int kKeyRunWords = kKeyClassWords<D> * 4 * B;"),
            ("kernels/cuda/mma_int.h", "inline constexpr int kKeyParamWords = 4 * (D / 8 + 4);"),
            (_MMA, "static constexpr int kStageBytes = kWords * 4 + 2 * kParams * 2;"),
            (_MMA, "static constexpr int kRedBytes = kWarps * 8 * D * 4;"),
            (_MMA, "static constexpr int kQBytes = D / 16 * 32 * 16;"),
            (_MMA, "static constexpr int kConstBytes = 32;"),
            (_MMA, "return static_cast<size_t>(kBytes + kQBytes + kConstBytes) + "
                   "static_cast<size_t>(score_floats) * 4;"),
        ],
    },
    "mma_fp8_split_kernel": {
        "bytes": lambda a: _smem_fp8(a[0]),
        "what": "Fp8Smem<D>::bytes(nq x split_tokens), nq x split_tokens <= kScoreFloats (4096)",
        "anchors": _MMA_COMMON + [
            (_MMA, "static constexpr int kStageBytes = kTile * D;"),
            (_MMA, "static constexpr int kRedBytes = kWarps * 8 * D * 4;"),
            (_MMA, "return static_cast<size_t>(kBytes) + static_cast<size_t>(score_floats) * 4;"),
        ],
    },
    # The baseline and tiled split kernels: q, scratch, scores and the tiled stage, sized per launch
    # from nq, D and the split (attention_kernels.cu, launch_split's `smem`): no single figure.
    "split_kernel": {"bytes": None, "what": "attention_kernels.cu launch_split: stage_offset(nq, D, "
                     "split_tokens) + kWarps x stage floats, per launch"},
}
# Every other kernel is launched with no dynamic shared memory; a kernel of a source with
# `extern __shared__` that is not in DYNAMIC_SMEM reads "see launcher".
NO_DYNAMIC = {"merge_kernel"}  # attention_kernels.cu: merge_kernel<<<grid, D, 0, stream>>>

# Block sizes of the kernels with no __launch_bounds__ (so no EIATTR_MAX_THREADS): the launcher's.
BLOCK_THREADS = {
    "merge_kernel": (128, "D threads (64 or 128): the larger"),
    "amax_to_scale_kernel": (256, "kBlock"),
    "gemm_reduce_kernel": (256, "kThreads"),
    "embed_kernel": (256, "kThreads"),
    "add_kernel": (256, "kThreads"),
    "rope_kernel": (256, "kThreads"),
    "silu_mul_kernel": (256, "kThreads"),
    "to_bf16_kernel": (256, "kThreads"),
}

COUNTED = ["HMMA", "LDSM", "LDS", "LDG", "LDGSTS", "LOP3", "PRMT"]


class EvidenceError(Exception):
    """A one-line error for the user (the script prints it and exits 1)."""


# ---- ptxas -v -----------------------------------------------------------------------------------
_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"ptxas info\s*: Used (\d+) registers(.*)$")


def parse_ptxas(text):
    """ptxas -v's lines -> {mangled name: {registers, barriers, smem, stack, spill_stores,
    spill_loads, cmem, entry}}. Functions that are not entries (called device functions) are kept
    with entry False."""
    out = {}
    entries = set()
    current = None
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            entries.add(m.group(1))
            current = m.group(1)
            out.setdefault(current, {})
            continue
        m = _PROPS.search(line)
        if m:
            current = m.group(1)
            out.setdefault(current, {})
            continue
        m = _STACK.search(line)
        if m and current is not None:
            out[current].update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                                spill_loads=int(m.group(3)))
            continue
        m = _USED.search(line)
        if m and current is not None:
            f = out[current]
            f["registers"] = int(m.group(1))
            f.setdefault("barriers", 0)
            f.setdefault("smem", 0)
            for part in m.group(2).split(","):
                part = part.strip()
                mb = re.fullmatch(r"used (\d+) barriers?", part)
                ms = re.fullmatch(r"(\d+) bytes smem", part)
                mc = re.fullmatch(r"(\d+) bytes cmem\[(\d+)\]", part)
                mk = re.fullmatch(r"(\d+) bytes cumulative stack size", part)
                if mk:
                    f["cumulative_stack"] = int(mk.group(1))
                elif mb:
                    f["barriers"] = int(mb.group(1))
                elif ms:
                    f["smem"] = int(ms.group(1))
                elif mc:
                    f.setdefault("cmem", {})[int(mc.group(2))] = int(mc.group(1))
    for name, f in out.items():
        f["entry"] = name in entries
        for k in ("stack", "spill_stores", "spill_loads"):
            f.setdefault(k, 0)
    return out


# ---- SASS ---------------------------------------------------------------------------------------
_FUNC = re.compile(r"^\s*Function : (\S+)\s*$", re.M)
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", re.M)


def parse_sass(text):
    """cuobjdump -sass -> {mangled name: [(address, instruction text)]} in address order."""
    out = {}
    parts = _FUNC.split(text)
    for i in range(1, len(parts), 2):
        out[parts[i]] = [(int(a, 16), t) for a, t in _INSTR.findall(parts[i + 1])]
    return out


def split_instruction(text):
    """'@!P0 BRA.DIV UR4, 0x1230' -> (guard '@!P0' or '', opcode 'BRA.DIV', operands
    'UR4, 0x1230')."""
    guard = ""
    m = re.match(r"(@!?U?P(?:T|\d+))\s+", text)
    if m:
        guard = m.group(1)
        text = text[m.end():]
    op, _, rest = text.partition(" ")
    return guard, op, rest.strip()


def opcode_base(text):
    return split_instruction(text)[1].split(".")[0]


def _branch(text):
    """(target address or None, conditional, terminator) of one instruction."""
    guard, op, rest = split_instruction(text)
    base = op.split(".")[0]
    always = guard in ("", "@PT")
    if base in ("BRA", "JMP"):
        m = re.search(r"0x([0-9a-f]+)\s*$", rest)
        target = int(m.group(1), 16) if m else None
        # BRA.DIV / BRA.CONV, a guard, or a predicate operand ("P1, 0x...") make it conditional.
        pred_operand = re.match(r"!?U?P\d+\s*,", rest) is not None
        conditional = not always or op != base or pred_operand
        return target, conditional, not conditional
    if base in ("EXIT", "RET", "BRX", "JMX", "KILL"):
        return None, not always, always
    return None, False, False


def find_loops(instrs):
    """instrs: [(address, text)] of one function in address order. Returns its loops, header
    order: [{header, back_branches, blocks (instruction indices of the natural loop),
    own (indices not in a nested loop), depth, children}]. A loop is a back edge of the
    control-flow graph (u -> h where h dominates u); back edges to one header make one loop."""
    n = len(instrs)
    if n == 0:
        return []
    index = {a: i for i, (a, _) in enumerate(instrs)}
    info = [_branch(t) for _, t in instrs]
    leaders = {0}
    for i, (target, conditional, terminator) in enumerate(info):
        if target is not None and target in index:
            leaders.add(index[target])
        if (target is not None or terminator or conditional) and i + 1 < n:
            leaders.add(i + 1)
    starts = sorted(leaders)
    block_of = [0] * n
    blocks = []
    for bi, s in enumerate(starts):
        e = starts[bi + 1] if bi + 1 < len(starts) else n
        blocks.append((s, e))
        for i in range(s, e):
            block_of[i] = bi
    succ = [[] for _ in blocks]
    for bi, (s, e) in enumerate(blocks):
        target, conditional, terminator = info[e - 1]
        if target is not None and target in index:
            succ[bi].append(block_of[index[target]])
        if not terminator and e < n:
            succ[bi].append(bi + 1)
    # reachable blocks in reverse post-order from the entry
    order, seen, stack = [], {0}, [(0, iter(succ[0]))]
    while stack:
        node, it = stack[-1]
        for nxt in it:
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, iter(succ[nxt])))
                break
        else:
            order.append(node)
            stack.pop()
    rpo = order[::-1]
    pos = {b: i for i, b in enumerate(rpo)}
    pred = collections.defaultdict(list)
    for b in rpo:
        for s in succ[b]:
            pred[s].append(b)
    # dominators (Cooper, Harvey, Kennedy)
    idom = {rpo[0]: rpo[0]}

    def intersect(a, b):
        while a != b:
            while pos[a] > pos[b]:
                a = idom[a]
            while pos[b] > pos[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            ps = [p for p in pred[b] if p in idom]
            new = ps[0]
            for p in ps[1:]:
                new = intersect(p, new)
            if idom.get(b) != new:
                idom[b] = new
                changed = True

    def dominates(h, u):
        while True:
            if u == h:
                return True
            if idom[u] == u:
                return False
            u = idom[u]

    loops = {}
    for u in rpo:
        for h in succ[u]:
            if h in pos and dominates(h, u):
                body = loops.setdefault(h, {"header": h, "back": [], "body": {h}})
                body["back"].append(u)
                work = [u]
                while work:
                    x = work.pop()
                    if x not in body["body"]:
                        body["body"].add(x)
                        work.extend(pred[x])
    result = []
    for h in sorted(loops):
        lp = loops[h]
        children = [g for g in loops if g != h and g in lp["body"]]
        nested = set()
        for g in children:
            nested |= loops[g]["body"]
        depth = sum(1 for g in loops if g != h and h in loops[g]["body"])
        idx = sorted(i for b in lp["body"] for i in range(*blocks[b]))
        own = sorted(i for b in lp["body"] - nested for i in range(*blocks[b]))
        result.append({
            "header": instrs[blocks[h][0]][0],
            "back_branches": sorted(instrs[blocks[u][1] - 1][0] for u in lp["back"]),
            "instructions": idx,
            "own": own,
            "depth": depth,
            "innermost": not children,
        })
    return result


def loop_counts(instrs, loop):
    """Warp-instructions of one iteration (the loop's own instructions) and the counted opcodes."""
    ops = collections.Counter(opcode_base(instrs[i][1]) for i in loop["own"])
    counts = {k: ops.get(k, 0) for k in COUNTED}
    return len(loop["own"]), counts


# ---- occupancy ----------------------------------------------------------------------------------
def occupancy(registers, smem_bytes, threads, sm=H200):
    """Blocks per SM, the limiting resource and the occupancy (% of the SM's warps) for a kernel of
    `registers` per thread, `smem_bytes` of shared memory per block (static + dynamic) and
    `threads` per block, by cuda_occupancy.h's rules for sm_90: registers per warp rounded up to
    256, allocated within one of 4 sub-partitions; shared memory plus the driver's 1 KB per block
    rounded up to 128 bytes; at most 64 warps and 32 blocks."""
    warps = -(-threads // 32)
    limits = {"warps": sm["max_warps"] // warps, "blocks": sm["max_blocks"]}
    reg_warp = -(-registers * 32 // sm["reg_unit"]) * sm["reg_unit"]
    per_sub = sm["regs_per_sm"] // sm["sub_partitions"]
    assumed = reg_warp * (-(-warps // sm["sub_partitions"]) * sm["sub_partitions"])
    if registers > sm["max_regs_per_thread"] or reg_warp * warps > sm["regs_per_block"] or \
            assumed > sm["regs_per_block"]:
        limits["registers"] = 0
    elif reg_warp:
        limits["registers"] = (per_sub // reg_warp) * sm["sub_partitions"] // warps
    smem = -(-(smem_bytes + sm["smem_reserved"]) // sm["smem_unit"]) * sm["smem_unit"]
    if smem > sm["smem_per_block"] + sm["smem_reserved"]:
        limits["shared memory"] = 0
    else:
        limits["shared memory"] = sm["smem_per_sm"] // smem
    blocks = min(limits.values())
    limiter = "/".join(k for k in ("registers", "shared memory", "warps", "blocks")
                       if k in limits and limits[k] == blocks)
    return blocks, limiter, 100.0 * blocks * warps / sm["max_warps"]


# ---- names --------------------------------------------------------------------------------------
def demangle(names, cxxfilt="c++filt"):
    if not names:
        return {}
    r = subprocess.run([cxxfilt], input="\n".join(names) + "\n", capture_output=True, text=True,
                       check=True)
    return dict(zip(names, r.stdout.splitlines()))


def fp8_formats(repo=REPO):
    """{'Fp8Format': {'0': 'e4m3', ...}, 'Granularity': {'0': 'tensor', ...}} from the enums of
    schemes/fp8/params.h, so that template arguments read by name."""
    try:
        text = (Path(repo) / "schemes/fp8/params.h").read_text()
    except OSError:
        return {}
    out = {}
    for enum in ("Fp8Format", "Granularity"):
        m = re.search(r"enum class %s\s*\{([^}]*)\}" % enum, text)
        if m:
            out[enum] = {str(i): e.strip().lower()
                         for i, e in enumerate(m.group(1).split(",")) if e.strip()}
    return out


def short_name(demangled, formats=None):
    """'void kvq::cuda::(anonymous namespace)::f<128, (kvq::Fp8Format)1>(...)' ->
    'f<128, e4m3fnuz>'."""
    s = demangled
    if s.startswith("void "):
        s = s[5:]
    depth = 0  # cut the parameter list: the first '(' at template depth 0 after the name
    for i, c in enumerate(s):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0 and i > 0 and not s[:i].endswith("::"):
            s = s[:i]
            break
    s = s.replace("(anonymous namespace)::", "")
    s = re.sub(r"\bkvq::(cuda::)?(detail::)?", "", s)
    for enum, names in (formats or {}).items():
        s = re.sub(r"\(%s\)(\d+)" % enum, lambda m: names.get(m.group(1), m.group(0)), s)
    return s


def template_args(short):
    m = re.search(r"<(.*)>$", short)
    if not m:
        return []
    out = []
    for a in m.group(1).split(","):
        a = a.strip()
        out.append(int(a) if re.fullmatch(r"-?\d+", a) else a)
    return out


def natural_key(s):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


# ---- the ELF's block size -----------------------------------------------------------------------
def parse_max_threads(elf_text):
    """cuobjdump -elf -> {mangled name: threads per block from EIATTR_MAX_THREADS (x*y*z)}."""
    out = {}
    for sec in re.split(r"\n(?=\.nv\.info\.)", elf_text):
        m = re.match(r"\.nv\.info\.(\S+)", sec)
        if not m:
            continue
        t = re.search(r"EIATTR_MAX_THREADS\s*\n\s*Format:\s*\S+\s*\n\s*Value:\s*(0x[0-9a-f]+)\s+"
                      r"(0x[0-9a-f]+)\s+(0x[0-9a-f]+)", sec)
        if t:
            x, y, z = (int(v, 16) for v in t.groups())
            out[m.group(1)] = x * y * z
    return out


# ---- dynamic shared memory ----------------------------------------------------------------------
_source_cache = {}


def _source_lines(rel, repo):
    key = (str(repo), rel)
    if key not in _source_cache:
        try:
            text = (Path(repo) / rel).read_text()
        except OSError:
            text = ""
        _source_cache[key] = " ".join(text.split())
    return _source_cache[key]


def dynamic_smem(short, tu_source_text, repo=REPO):
    """(bytes or None, note) of the dynamic shared memory a kernel's launcher asks (the largest)."""
    base = short.split("<")[0].split("::")[-1]
    entry = DYNAMIC_SMEM.get(base)
    if entry is None:
        if base in NO_DYNAMIC or "extern __shared__" not in tu_source_text:
            return 0, ""
        return None, "uses extern __shared__; not in the script's DYNAMIC_SMEM table: see launcher"
    if entry["bytes"] is None:
        return None, "see launcher (%s)" % entry["what"]
    for rel, line in entry["anchors"]:
        if " ".join(line.split()) not in _source_lines(rel, repo):
            return None, ("see launcher (the formula table is out of date: %s no longer has `%s`)"
                          % (rel, line))
    return entry["bytes"](template_args(short)), entry["what"]


# ---- per kernel ---------------------------------------------------------------------------------
def per_element(short):
    for pattern, fmt, elements, note in PER_ELEMENT:
        m = pattern.match(short)
        if m:
            return fmt(m), elements(m), note
    return None


def kernel_record(tu, mangled, props, sass, max_threads, demangled, formats, tu_text, repo=REPO):
    short = short_name(demangled, formats)
    base = short.split("<")[0].split("::")[-1]
    threads, threads_from = max_threads, "__launch_bounds__"
    if threads is None:
        threads, how = BLOCK_THREADS.get(base, (None, ""))
        threads_from = "launcher: " + how if threads else "unknown"
    dyn, dyn_note = dynamic_smem(short, tu_text, repo)
    rec = {
        "source": tu,
        "kernel": short,
        "demangled": demangled,
        "threads": threads,
        "threads_from": threads_from,
        "registers": props.get("registers"),
        "spill_stores": props.get("spill_stores", 0),
        "spill_loads": props.get("spill_loads", 0),
        "stack": props.get("stack", 0),
        "smem_static": props.get("smem", 0),
        "smem_dynamic": dyn,
        "smem_dynamic_note": dyn_note,
    }
    if threads and rec["registers"] is not None:
        smem = rec["smem_static"] + (dyn or 0)
        blocks, limiter, occ = occupancy(rec["registers"], smem, threads)
        rec.update(blocks_per_sm=blocks, limiter=limiter, occupancy_pct=round(occ, 2),
                   occupancy_bound=dyn is None)
    loops = []
    for lp in find_loops(sass):
        count, ops = loop_counts(sass, lp)
        loops.append({"header": "0x%04x" % lp["header"],
                      "back_branches": ["0x%04x" % a for a in lp["back_branches"]],
                      "depth": lp["depth"], "innermost": lp["innermost"],
                      "warp_instructions": count, "body_instructions": len(lp["instructions"]),
                      **ops})
    pe = per_element(short)
    hmma = [lp for lp in loops if lp["HMMA"] > 0]
    if pe and len(hmma) == 2:
        fmt, per_role, note = pe
        for lp, role, elements in zip(hmma, ("key", "value"), per_role):
            # one iteration: the loop's own instructions plus each nested loop's once (how often a
            # nested loop runs an iteration is not in the SASS)
            v = lp["body_instructions"] * 32 / elements
            lp.update(role=role, elements_per_warp_iteration=elements, per_element=round(v, 2),
                      per_element_nested_once=not lp["innermost"], format=fmt,
                      budget=BUDGET[fmt], budget_ratio=round(v / BUDGET[fmt], 2))
        rec["elements_note"] = note
    elif pe:
        rec["elements_note"] = "expected 2 loops with HMMA (key, value), found %d" % len(hmma)
    rec["loops"] = loops
    return rec


# ---- compiling ----------------------------------------------------------------------------------
def evidence_command(command, out_obj):
    """The build's nvcc command with one sm_90 target, -Xptxas -v and the object at out_obj."""
    args = shlex.split(command)
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a.startswith("--generate-code") or a.startswith("-gencode") or a.startswith("-arch") \
                or a.startswith("--gpu-architecture"):
            if a in ("-gencode", "--generate-code", "-arch", "--gpu-architecture"):
                skip = True
            continue
        if a == "-o":
            skip = True
            continue
        out.append(a)
    return out[:1] + [ARCH_FLAG, "-Xptxas", "-v"] + out[1:] + ["-o", out_obj]


def find_cuobjdump(given):
    for c in ([given] if given else [shutil.which("cuobjdump"), PIP_CUOBJDUMP]):
        if c and os.access(c, os.X_OK):
            return c
    if given:
        raise EvidenceError("--cuobjdump %s: not an executable" % given)
    raise EvidenceError("cuobjdump not found (PATH, %s): python3 -m venv V && V/bin/pip install "
                        "nvidia-cuda-cuobjdump, then --cuobjdump V/lib/python3.*/site-packages/"
                        "nvidia/cu13/bin/cuobjdump" % PIP_CUOBJDUMP)


def translation_units(build, only):
    cc = build / "compile_commands.json"
    if not cc.is_file():
        raise EvidenceError("%s not found: configure the build first (cmake --preset default) or "
                            "pass --build DIR" % cc)
    try:
        entries = json.loads(cc.read_text())
    except ValueError as e:
        raise EvidenceError("%s: not JSON (%s)" % (cc, e))
    tus = {}
    for e in entries:
        f = Path(e["file"])
        try:
            rel = f.resolve().relative_to(REPO)
        except ValueError:
            continue
        if rel.parts[:2] == ("kernels", "cuda") and rel.suffix == ".cu" and \
                (only is None or re.search(only, str(rel))):
            tus.setdefault(str(rel), e)
    if not tus:
        raise EvidenceError("no CUDA translation unit of kernels/cuda/ in %s%s (a build with CUDA "
                            "on has them)" % (cc, " matching --only %s" % only if only else ""))
    return [tus[k] | {"rel": k} for k in sorted(tus)]


def run_tool(cmd, cwd=None, what=""):
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except OSError as e:
        raise EvidenceError("%s: cannot run %s (%s)" % (what or cmd[0], cmd[0], e.strerror))
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise EvidenceError("%s failed (exit %d): %s" % (what or cmd[0], r.returncode,
                                                         " | ".join(tail)))
    return r


def rewrite_for_tree(args, cwd, root, tmp):
    """The compile arguments with the checkout's paths (REPO, outside the build folder) moved to
    root, a copy of the sources of one commit; options files are copied with the same change."""
    def move(path):
        p = Path(path)
        if not p.is_absolute():
            return path
        s = str(p)
        if s == str(REPO) or (s.startswith(str(REPO) + "/") and
                              not str(p.resolve()).startswith(str(REPO / "build"))):
            return str(Path(root) / os.path.relpath(s, REPO))
        return path

    out = []
    for i, a in enumerate(args):
        prev = args[i - 1] if i else ""
        if prev == "--options-file":
            text = (Path(cwd) / a).read_text()
            words = [re.sub(r"^(-I|-isystem=?)?(/.*)$",
                            lambda m: (m.group(1) or "") + move(m.group(2)), w)
                     for w in shlex.split(text)]
            rsp = os.path.join(tmp, "options-%d.rsp" % len(os.listdir(tmp)))
            Path(rsp).write_text(" ".join(shlex.quote(w) for w in words) + "\n")
            out.append(rsp)
        elif a.startswith("-I/"):
            out.append("-I" + move(a[2:]))
        else:
            out.append(move(a))
    return out


def source_tree(commit, tmp):
    """REPO itself (commit None), or a copy of commit's tree (git archive) under tmp."""
    if commit is None:
        return REPO
    root = Path(tmp) / "src"
    root.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True)
    if archive.returncode != 0:
        raise EvidenceError("git archive %s failed: %s" % (commit, archive.stderr.decode().strip()))
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    return root


def describe_source(commit):
    """What the table reads: a commit, or HEAD plus the uncommitted kernels/cuda/ files."""
    def git(*a):
        r = subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""
    if commit is not None:
        return "commit %s" % (git("rev-parse", "--short", commit) or commit)
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "kernels/cuda", "schemes")
    if dirty:
        return "the working tree at %s, with uncommitted changes to %s" % (
            head, ", ".join(line[3:] for line in dirty.splitlines()))
    return "commit %s (the working tree, no uncommitted changes under kernels/cuda/)" % head


def collect(build, cuobjdump, only=None, commit=None, log=sys.stderr):
    records = []
    with tempfile.TemporaryDirectory(prefix="cuda-evidence-") as tmp:
        root = source_tree(commit, tmp)
        formats = fp8_formats(root)
        for tu in translation_units(build, only):
            obj = os.path.join(tmp, Path(tu["rel"]).stem + ".o")
            cmd = evidence_command(tu["command"], obj)
            if commit is not None:
                cmd = rewrite_for_tree(cmd, tu["directory"], root, tmp)
            print("compiling %s for sm_90 ..." % tu["rel"], file=log, flush=True)
            r = run_tool(["nice", "-n", "10"] + cmd, cwd=tu["directory"],
                         what="nvcc on " + tu["rel"])
            props = parse_ptxas(r.stdout + "\n" + r.stderr)
            entries = sorted(k for k, v in props.items() if v["entry"])
            if not entries:
                continue
            sass = parse_sass(run_tool([cuobjdump, "-sass", obj], what="cuobjdump -sass").stdout)
            elf = run_tool([cuobjdump, "-elf", obj], what="cuobjdump -elf").stdout
            threads = parse_max_threads(elf)
            names = demangle(entries)
            tu_text = (root / tu["rel"]).read_text()
            for m in entries:
                if m not in sass:
                    raise EvidenceError("%s: ptxas names %s, cuobjdump -sass does not"
                                        % (tu["rel"], m))
                records.append(kernel_record(tu["rel"], m, props[m], sass[m], threads.get(m),
                                             names[m], formats, tu_text, root))
    records.sort(key=lambda r: (r["source"], natural_key(r["kernel"])))
    return records


# ---- output -------------------------------------------------------------------------------------
def _kb(b):
    return "%.1f KB" % (b / 1024) if b >= 1024 else "%d B" % b


def _loop_size(lp):
    if lp["innermost"]:
        return "%d" % lp["warp_instructions"]
    return "%d own + %d nested" % (lp["warp_instructions"],
                                   lp["body_instructions"] - lp["warp_instructions"])


def _per_element(lp):
    nested = " (nested once)" if lp["per_element_nested_once"] else ""
    verdict = "within" if lp["budget_ratio"] <= 1 else "**over, %.2fx**" % lp["budget_ratio"]
    return "%.2f%s / %.1f, %s" % (lp["per_element"], nested, lp["budget"], verdict)


def _main_loops(rec):
    parts = ["%s %s (%d HMMA): %s" % (lp["role"], _loop_size(lp), lp["HMMA"], _per_element(lp))
             for lp in rec["loops"] if "role" in lp]
    if parts:
        return "; ".join(parts)
    inner = sorted((lp["warp_instructions"] for lp in rec["loops"] if lp["innermost"]),
                   reverse=True)
    note = " (%s)" % rec["elements_note"] if "elements_note" in rec else ""
    if not inner:
        return "no loop" + note
    n = len(rec["loops"])
    return "%d loop%s (%d innermost), largest: %s%s" % (
        n, "" if n == 1 else "s", len(inner),
        ", ".join(map(str, inner[:3])) + (", ..." if len(inner) > 3 else ""), note)


def markdown(records, loops_mode, header_note=""):
    out = []
    if header_note:
        out.append(header_note)
        out.append("")
    out.append("| source | kernel | threads | registers | spills st / ld (stack) | smem static + dynamic "
               "| blocks / SM (limit) | occupancy | loops: warp-instr.; main loops: per element / "
               "budget |")
    out.append("|---|---|---:|---:|---|---|---|---:|---|")
    for r in records:
        spill = "%d / %d (%d)" % (r["spill_stores"], r["spill_loads"], r["stack"])
        if r["spill_stores"] or r["spill_loads"]:
            spill = "**" + spill + "**"
        if r["smem_dynamic"] is None:
            smem = "%s + dynamic: see launcher" % _kb(r["smem_static"])
        elif r["smem_dynamic"]:
            smem = "%s + <= %s" % (_kb(r["smem_static"]), _kb(r["smem_dynamic"]))
        else:
            smem = _kb(r["smem_static"])
        if "blocks_per_sm" in r:
            bound = "<= " if r["occupancy_bound"] else ""
            blocks = "%s%d (%s)" % (bound, r["blocks_per_sm"], r["limiter"])
            occ = "%s%.2f%%" % (bound, r["occupancy_pct"])
        else:
            blocks = occ = "?"
        threads = str(r["threads"]) if r["threads"] else "?"
        if r["threads_from"].startswith("launcher"):
            threads += "*"
        out.append("| %s | `%s` | %s | %d | %s | %s | %s | %s | %s |" % (
            Path(r["source"]).name, r["kernel"], threads, r["registers"], spill, smem, blocks, occ,
            _main_loops(r)))
    if loops_mode != "none":
        out.append("")
        out.append("| source | kernel | loop header | back branches | depth | warp-instr. | "
                   + " | ".join(COUNTED) + " | per element (budget) |")
        out.append("|---|---|---|---|---:|---:|" + "---:|" * len(COUNTED) + "---|")
        for r in records:
            for lp in r["loops"]:
                if loops_mode == "innermost" and not lp["innermost"]:
                    continue
                if loops_mode == "main" and "role" not in lp:
                    continue
                pe = "%s: %s" % (lp["role"], _per_element(lp)) if "role" in lp else ""
                out.append("| %s | `%s` | %s | %s | %d | %s | %s | %s |" % (
                    Path(r["source"]).name, r["kernel"], lp["header"], " ".join(lp["back_branches"]),
                    lp["depth"], _loop_size(lp),
                    " | ".join(str(lp[k]) for k in COUNTED), pe))
    return "\n".join(out) + "\n"


def legend():
    return ("H200 SM: 65,536 registers (256 a warp's unit, 4 sub-partitions), 228 KB shared memory "
            "(+1 KB a block reserved), 64 warps, 32 blocks. threads* = the launcher's block (no "
            "__launch_bounds__). Dynamic shared memory: the largest the launcher asks (nq x "
            "split_tokens <= 4096 score floats), so blocks / SM is the fewest; \"<=\": dynamic "
            "shared memory not counted (sized per launch). Loops: own instructions (nested loops "
            "counted innermost), static count. Per element = warp-instr. x 32 / elements a warp "
            "takes an iteration (int: 32 x D, the key loop at D 64 64 x D: two runs a warp; fp8 and "
            "bf16: 16 x D), budget from %s." % BUDGET_SOURCE)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(REPO / "build/default"),
                    help="the build folder whose compile_commands.json gives the flags "
                    "(default: %(default)s)")
    ap.add_argument("--cuobjdump", help="cuobjdump to use (default: PATH, then %s)" % PIP_CUOBJDUMP)
    ap.add_argument("--only", help="regex: only the translation units whose path matches")
    ap.add_argument("--loops", choices=["all", "innermost", "main", "none"], default="innermost",
                    help="which loops the second table lists (default: %(default)s)")
    ap.add_argument("--commit", help="compile the sources of this commit (git archive; the build's "
                    "flags) instead of the working tree")
    ap.add_argument("--json", action="store_true", help="JSON instead of markdown")
    ap.add_argument("--out", help="write to FILE instead of stdout")
    args = ap.parse_args(argv)
    try:
        cuobjdump = find_cuobjdump(args.cuobjdump)
        if not shutil.which("c++filt"):
            raise EvidenceError("c++filt not found on PATH (binutils)")
        records = collect(Path(args.build), cuobjdump, args.only, args.commit)
        source = describe_source(args.commit)
    except EvidenceError as e:
        print("cuda-evidence: %s" % e, file=sys.stderr)
        return 1
    if args.json:
        text = json.dumps({"source": source, "sm": H200, "budget": BUDGET,
                           "budget_source": BUDGET_SOURCE,
                           "kernels": records}, indent=1, sort_keys=True) + "\n"
    else:
        text = markdown(records, args.loops, "Reads %s. %s" % (source, legend()))
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
