#!/usr/bin/env python3
"""Tests of scripts/cuda-evidence.py that need neither nvcc nor cuobjdump: the ptxas -v parser,
the SASS parser and loop finder, the ELF block size, the occupancy formula and the per-element
arithmetic. Fixtures (fixtures/cuda_evidence/) are real output of nvcc 13.0's ptxas and
cuobjdump 13.5 on kvq's kernels (sm_90), cut to a few functions; expected values come from
reading those listings by hand, from CUDA's occupancy rules worked by hand, or from the
source's formulas worked by hand (each test says which).

Runs under pytest, or alone (python3 tests/scripts/cuda_evidence_test.py: ctest's
scripts.cuda_evidence), so it needs no package beyond the standard library.
"""
import importlib.util
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIX = HERE / "fixtures" / "cuda_evidence"
_spec = importlib.util.spec_from_file_location("cuda_evidence",
                                               HERE.parents[1] / "scripts" / "cuda-evidence.py")
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)

AMAX_CHANNEL = "_ZN3kvq4cuda47_GLOBAL__N__ae23b6bd_14_fp8_kernels_cu_39f08c8c19amax_channel_kernelEPKflllPj"


def sass_text(lines, name="_Z4testv"):
    """A function in cuobjdump -sass's layout: one instruction a line at 16-byte addresses."""
    body = "".join("        /*%04x*/                   %s ;    /* 0x0 */\n" % (16 * i, t)
                   for i, t in enumerate(lines))
    return "\n\t\tFunction : %s\n\t.headerflags\t@\"EF_CUDA_SM90\"\n%s" % (name, body)


def loops_of(lines):
    instrs = ce.parse_sass(sass_text(lines))["_Z4testv"]
    return instrs, ce.find_loops(instrs)


# ---- ptxas -v (fixture: ptxas-v.txt, real lines of fp8_kernels.cu, kivi_kernels.cu and
# attention_mma.cu; the numbers are those printed in it) ------------------------------------------
def test_ptxas_registers_smem_and_barriers():
    p = ce.parse_ptxas((FIX / "ptxas-v.txt").read_text())
    assert len(p) == 4 and all(f["entry"] for f in p.values())
    f = p[AMAX_CHANNEL]
    assert (f["registers"], f["barriers"], f["smem"], f["stack"]) == (16, 0, 0, 0)
    head = p[AMAX_CHANNEL.replace("19amax_channel", "16amax_head")]
    assert (head["registers"], head["barriers"], head["smem"]) == (30, 1, 44)
    fp8 = [v for k, v in p.items() if "mma_fp8_split_kernelILi128" in k][0]
    assert (fp8["registers"], fp8["smem"], fp8["spill_stores"]) == (145, 16, 0)


def test_ptxas_spills_and_stack():
    p = ce.parse_ptxas((FIX / "ptxas-v.txt").read_text())
    q = [v for k, v in p.items() if "quantize_channel_kernelILi4" in k][0]
    assert (q["stack"], q["spill_stores"], q["spill_loads"], q["registers"]) == (16, 12, 24, 40)
    assert q["cumulative_stack"] == 16


def test_ptxas_non_entry_function_kept_apart():
    text = ("ptxas info    : Function properties for _Z6helperv\n"
            "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
            "ptxas info    : Compiling entry function '_Z1kv' for 'sm_90'\n"
            "ptxas info    : Function properties for _Z1kv\n"
            "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
            "ptxas info    : Used 20 registers, used 0 barriers, 360 bytes cmem[0]\n")
    p = ce.parse_ptxas(text)
    assert p["_Z6helperv"]["entry"] is False and p["_Z6helperv"]["spill_stores"] == 4
    assert p["_Z1kv"]["entry"] is True and p["_Z1kv"]["cmem"] == {0: 360}


# ---- SASS and loops -----------------------------------------------------------------------------
def test_sass_parse_real_function():
    s = ce.parse_sass((FIX / "amax_channel_kernel.sass").read_text())
    ins = s[AMAX_CHANNEL]
    assert len(ins) == 72  # 0x000 .. 0x470 in the listing
    assert ins[0] == (0, "LDC R1, c[0x0][0x28]")
    assert ins[13] == (0xd0, "@P0 EXIT")
    assert ins[59] == (0x3b0, "BRA 0x3b0")


def test_loops_of_real_function():
    # Read by hand from the listing: a loop 0x160..0x1c0 (7 instructions: the REDG.E.MAX of a
    # column with no tokens), and a loop 0x210..0x390 holding a loop 0x240..0x310 (14: the
    # column's LDG, LOP3 |x|, VIMNMX); the outer one's own instructions 25 - 14 = 11. The
    # `BRA 0x3b0` to itself after the last EXIT is no loop (unreachable).
    ins = ce.parse_sass((FIX / "amax_channel_kernel.sass").read_text())[AMAX_CHANNEL]
    loops = ce.find_loops(ins)
    got = [(lp["header"], lp["back_branches"], len(lp["instructions"]), len(lp["own"]),
            lp["depth"], lp["innermost"]) for lp in loops]
    assert got == [(0x160, [0x1c0], 7, 7, 0, True),
                   (0x210, [0x390], 25, 11, 0, False),
                   (0x240, [0x310], 14, 14, 1, True)]
    count, ops = ce.loop_counts(ins, loops[2])
    assert count == 14 and ops["LDG"] == 1 and ops["LOP3"] == 1 and ops["HMMA"] == 0


def test_branch_kinds():
    assert ce._branch("@!P0 BRA 0x3470") == (0x3470, True, False)
    assert ce._branch("BRA 0x2b80") == (0x2b80, False, True)
    assert ce._branch("BRA.DIV UR4, 0x1230") == (0x1230, True, False)
    assert ce._branch("@P0 BRA P1, 0x40") == (0x40, True, False)
    assert ce._branch("@PT BRA 0x40") == (0x40, False, True)
    assert ce._branch("EXIT") == (None, False, True)
    assert ce._branch("@P0 EXIT") == (None, True, False)
    assert ce._branch("CALL.REL.NOINC 0xbb00") == (None, False, False)
    assert ce.opcode_base("@!P2 HMMA.16816.F32 R4, R8, R12, R4") == "HMMA"


def test_nested_loops_counted_innermost():
    lines = ["MOV R0, RZ",            # 0x00
             "MOV R1, RZ",            # 0x10  outer header
             "HMMA.16816.F32 R4, R8, R12, R4",  # 0x20  inner header
             "LDS R2, [R3]",          # 0x30
             "@P0 BRA 0x20",          # 0x40  inner back edge
             "LOP3.LUT R5, R5, 0x1, RZ, 0xc0, !PT",  # 0x50
             "@P1 BRA 0x10",          # 0x60  outer back edge
             "EXIT"]                  # 0x70
    ins, loops = loops_of(lines)
    assert [(lp["header"], len(lp["instructions"]), len(lp["own"]), lp["depth"])
            for lp in loops] == [(0x10, 6, 3, 0), (0x20, 3, 3, 1)]
    assert ce.loop_counts(ins, loops[0])[1]["LOP3"] == 1
    assert ce.loop_counts(ins, loops[0])[1]["HMMA"] == 0  # the HMMA is the inner loop's
    assert ce.loop_counts(ins, loops[1])[1]["HMMA"] == 1


def test_two_backward_branches_make_one_loop():
    lines = ["MOV R0, RZ",            # 0x00
             "IADD3 R0, R0, 0x1, RZ",  # 0x10 header
             "@P0 BRA 0x10",          # 0x20 back edge ("continue")
             "LDG.E R1, [R2.64]",     # 0x30
             "@P1 BRA 0x10",          # 0x40 back edge (the loop's end)
             "EXIT",                  # 0x50
             "BRA 0x60"]              # 0x60 the trap after EXIT
    _, loops = loops_of(lines)
    assert len(loops) == 1
    assert loops[0]["header"] == 0x10 and loops[0]["back_branches"] == [0x20, 0x40]
    assert len(loops[0]["own"]) == 4


def test_branch_inside_loop_counts_both_arms_and_forward_loop_is_none():
    lines = ["MOV R0, RZ",            # 0x00
             "@P0 BRA 0x40",          # 0x10 forward: skips 0x20, 0x30 (not a loop)
             "FADD R1, R1, R1",       # 0x20
             "FADD R1, R1, R1",       # 0x30
             "ISETP.GE.AND P1, PT, R0, 0x4, PT",  # 0x40 header
             "@P1 BRA 0x70",          # 0x50 if
             "FMUL R2, R2, R2",       # 0x60 then-arm
             "IADD3 R0, R0, 0x1, RZ",  # 0x70
             "@!P2 BRA 0x40",         # 0x80 back edge
             "EXIT"]
    _, loops = loops_of(lines)
    assert [(lp["header"], len(lp["own"])) for lp in loops] == [(0x40, 5)]


def test_loop_entered_in_the_middle_has_its_entry_as_header():
    # The cycle 0x20 -> 0x30 -> 0x40 -> 0x20 is entered at 0x30 (from 0x00), so 0x30 dominates
    # the cycle and is its header; the back edge is 0x20's fall-through into 0x30, not the
    # backward branch at 0x40 (whose target 0x20 dominates nothing but itself).
    lines = ["@P0 BRA 0x30",          # 0x00
             "BRA 0x50",              # 0x10
             "FADD R1, R1, R1",       # 0x20
             "FADD R1, R1, R1",       # 0x30
             "@P1 BRA 0x20",          # 0x40
             "EXIT"]                  # 0x50
    ins, loops = loops_of(lines)
    assert [(lp["header"], lp["back_branches"], [ins[i][0] for i in lp["own"]])
            for lp in loops] == [(0x30, [0x20], [0x20, 0x30, 0x40])]


# ---- ELF -----------------------------------------------------------------------------------------
def test_max_threads_from_nv_info():
    t = ce.parse_max_threads((FIX / "amax_channel_kernel.nv_info.txt").read_text())
    assert t == {AMAX_CHANNEL: 256}  # Value: 0x100 0x1 0x1 in the fixture (kBlock = 256)


# ---- occupancy (hand-worked by cuda_occupancy.h's rules for sm_90) -------------------------------
def test_occupancy_register_limited():
    # 128 registers x 32 = 4096 a warp; 16384 per sub-partition / 4096 = 4 warps, x 4 = 16;
    # 4-warp blocks: 4. Shared memory 40 KB + 1 KB: 233472 / 41984 = 5. So 4, 16 / 64 warps.
    assert ce.occupancy(128, 40960, 128) == (4, "registers", 25.0)
    # 145 registers: 4640 a warp rounds up to 4864; 16384 / 4864 = 3 warps, 12 a SM: 3 blocks.
    assert ce.occupancy(145, 16 + 32768, 128) == (3, "registers", 18.75)


def test_occupancy_register_granularity_256_per_warp():
    # 41 registers: 1312 a warp, rounded to 1536: 16384 / 1536 = 10 warps a sub-partition,
    # 40 a SM, 10 four-warp blocks (without the rounding: 16384 / 1312 = 12, so 12 blocks).
    assert ce.occupancy(41, 0, 128) == (10, "registers", 62.5)
    # 40 registers: 1280, a multiple of 256: 12 warps a sub-partition, 48, 12 blocks.
    assert ce.occupancy(40, 0, 128) == (12, "registers", 75.0)
    # 100 registers, one-warp blocks: 3200 -> 3328; 16384 / 3328 = 4 a sub-partition, 16 blocks
    # (65536 / 3328 = 19 if registers were one pool).
    assert ce.occupancy(100, 0, 32) == (16, "registers", 25.0)


def test_occupancy_shared_memory_limited():
    # 100 KB + 1 KB reserved = 103424 B: 233472 / 103424 = 2 blocks of 8 warps.
    assert ce.occupancy(32, 100 * 1024, 256) == (2, "shared memory", 25.0)
    # 113 KB: 115712 + 1024 = 116736 = 233472 / 2: 2 blocks; one byte more rounds up to 128 B
    # more: 1 block.
    assert ce.occupancy(32, 115712, 128)[0] == 2
    assert ce.occupancy(32, 115713, 128)[:2] == (1, "shared memory")
    assert ce.occupancy(32, 228 * 1024, 128)[0] == 0  # above the 227 KB a block may have


def test_occupancy_warp_and_block_limited():
    # 16 registers: 512 a warp, 32 a sub-partition, 128 a SM; 16-warp blocks: 64 / 16 = 4.
    assert ce.occupancy(16, 0, 512) == (4, "warps", 100.0)
    # one-warp blocks: at most 32 blocks a SM (50% of 64 warps).
    assert ce.occupancy(16, 0, 32) == (32, "blocks", 50.0)
    assert ce.occupancy(256, 0, 128)[0] == 0  # over 255 registers a thread


# ---- names, dynamic shared memory, per element ---------------------------------------------------
def test_short_name():
    d = ("void kvq::cuda::(anonymous namespace)::mma_fp8_split_kernel<128, (kvq::Fp8Format)1>"
         "(kvq::cuda::detail::SplitParams<kvq::cuda::Fp8SideView>)")
    assert ce.short_name(d, {"Fp8Format": {"0": "e4m3", "1": "e4m3fnuz", "2": "e5m2"}}) == \
        "mma_fp8_split_kernel<128, e4m3fnuz>"
    assert ce.short_name("kvq::cuda::(anonymous namespace)::copy_kernel(kvq::cuda::CopyTable)") == \
        "copy_kernel"
    assert ce.template_args("mma_int_split_kernel<128, 2, 4>") == [128, 2, 4]


def test_fp8_enums_from_the_source():
    assert ce.fp8_formats() == {"Fp8Format": {"0": "e4m3", "1": "e4m3fnuz", "2": "e5m2"},
                                "Granularity": {"0": "tensor", "1": "head", "2": "token",
                                                "3": "channel"}}


_TREES = []


def _tree_with_anchors(kernel, drop=None):
    """A made-up source tree holding exactly the source text a DYNAMIC_SMEM formula copies."""
    tmp = tempfile.TemporaryDirectory(prefix="cuda-evidence-test-")
    _TREES.append(tmp)  # removed at exit
    root = Path(tmp.name)
    for rel, text in ce.DYNAMIC_SMEM[kernel]["anchors"]:
        if text == drop:
            continue
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        with open(f, "a") as out:
            out.write(text + "\n")
    return root


def test_dynamic_smem_formulas_by_hand():
    # IntSmem<128, 4> (kKeyRuns 1): 4 staged key runs of kKeyRunWords = (128 / 4 + 4) x 4 x 4 = 576
    # words = 2304 words (9216 B) + 2 arrays x 4 runs x 2 x kKeyParamWords (4 x (16 + 4) = 80) = 640
    # halves x 2 B = 2560: 11776 a stage, x 2 stages = 23552 (> the 16384 B of output sums) + q'
    # 8 x 32 x 16 = 4096 + 32 B of mma constants + 4096 score floats x 4 = 16384: 44064.
    # IntSmem<64, 2> (kKeyRuns 2): 8 runs x (16 + 4) x 4 x 2 = 1280 words (5120 B) + 2 x 8 x 2 x 48
    # halves x 2 B = 3072: 8192 a stage, x 2 = 16384 > 8192 output sums; + 2048 + 32 + 16384 =
    # 34848. Fp8Smem<128>: max(2 x 8192, 16384) + 16384 = 32768.
    # Smem<128> (bf16): 2 x 64 x 128 x 2 = 32768 + 16384 = 49152.
    for kernel, short, want in [("mma_int_split_kernel", "mma_int_split_kernel<128, 4, 4>", 44064),
                                ("mma_int_split_kernel", "mma_int_split_kernel<64, 2, 2>", 34848),
                                ("mma_fp8_split_kernel", "mma_fp8_split_kernel<128, e5m2>", 32768),
                                ("mma_split_kernel", "mma_split_kernel<128>", 49152)]:
        root = _tree_with_anchors(kernel)
        assert ce.dynamic_smem(short, "extern __shared__", root)[0] == want, short


def test_dynamic_smem_says_see_launcher_when_the_source_moved():
    anchor = ce.DYNAMIC_SMEM["mma_int_split_kernel"]["anchors"][-1][1]
    root = _tree_with_anchors("mma_int_split_kernel", drop=anchor)
    got, note = ce.dynamic_smem("mma_int_split_kernel<128, 4, 4>", "extern __shared__", root)
    assert got is None and "out of date" in note
    assert ce.dynamic_smem("copy_kernel", "no shared memory here", root) == (0, "")
    assert ce.dynamic_smem("other_kernel", "extern __shared__ float s[];", root)[0] is None


def _main_loops(kernel, sizes, registers):
    """The record of an int kernel whose SASS is two innermost HMMA loops of `sizes` instructions
    (the key loop, then the value loop); returns the record and its main loops."""
    lines = ["MOV R0, RZ"]
    for n in sizes:
        head = 16 * len(lines)
        lines += ["HMMA.16816.F32 R4, R8, R12, R4"] + ["IADD3 R0, R0, 0x1, RZ"] * (n - 2)
        lines.append("@P0 BRA 0x%x" % head)
    lines.append("EXIT")
    ins = ce.parse_sass(sass_text(lines))["_Z4testv"]
    rec = ce.kernel_record("kernels/cuda/attention_mma.cu", "_Z4testv",
                           {"registers": registers, "smem": 16}, ins, 128,
                           "void kvq::cuda::(anonymous namespace)::%s"
                           "(kvq::cuda::detail::SplitParams<kvq::cuda::IntSideView>)" % kernel, {},
                           "", ce.REPO)
    return rec, [lp for lp in rec["loops"] if "role" in lp]


def test_per_element_against_the_budget():
    # Two innermost HMMA loops of 401 and 508 instructions in a kivi2 kernel at D 128: a warp
    # takes 32 tokens x 128 channels an iteration, so 401 x 32 / 4096 = 3.13 and 508 x 32 / 4096
    # = 3.97 thread-instructions an element, against kivi2's 2.9.
    rec, main = _main_loops("mma_int_split_kernel<128, 2, 4>", (401, 508), 128)
    assert [(lp["role"], lp["warp_instructions"], lp["per_element"], lp["budget"])
            for lp in main] == [("key", 401, 3.13, 2.9), ("value", 508, 3.97, 2.9)]
    assert main[1]["budget_ratio"] == 1.37
    assert (rec["blocks_per_sm"], rec["threads"]) == (4, 128)
    # At D 64 a warp's key iteration takes two 32-token runs (IntSmem::kKeyRuns): 361 x 32 /
    # (64 x 64) = 2.82; the value loop 32 tokens x 64 channels: 217 x 32 / 2048 = 3.39.
    rec, main = _main_loops("mma_int_split_kernel<64, 2, 2, true>", (361, 217), 107)
    assert [(lp["role"], lp["elements_per_warp_iteration"], lp["per_element"]) for lp in main] == [
        ("key", 4096, 2.82), ("value", 2048, 3.39)]


def test_budget_figures_are_the_device_runs():
    text = (ce.REPO / "docs/device-runs/2026-12-04-h200/README.md").read_text()
    for fmt, v in ce.BUDGET.items():
        assert "%s" % v in text, fmt


def test_evidence_command_keeps_the_build_flags():
    cmd = ("/usr/local/cuda/bin/nvcc -forward-unknown-to-host-compiler -DFMT_SHARED --options-file "
           "CMakeFiles/kvq_kernels.dir/includes_CUDA.rsp -O3 -DNDEBUG "
           "--generate-code=arch=compute_90,code=[compute_90,sm_90] -Xcompiler=-fPIC "
           "-Xcompiler=-Wall,-Wextra -Werror=all-warnings -std=c++20 -x cu -c "
           "/work/main/kernels/cuda/attention_mma.cu -o CMakeFiles/kvq_kernels.dir/attention_mma.cu.o")
    got = ce.evidence_command(cmd, "/tmp/x.o")
    assert got[0] == "/usr/local/cuda/bin/nvcc" and got[-2:] == ["-o", "/tmp/x.o"]
    assert got.count("-o") == 1 and "-Xptxas" in got and "-v" in got
    assert [a for a in got if "generate-code" in a] == [ce.ARCH_FLAG]
    assert "-O3" in got and "-std=c++20" in got and "CMakeFiles/kvq_kernels.dir/includes_CUDA.rsp" in got


# ---- inputs: the build's commands, bad inputs ------------------------------------------------------
def _tmpdir():
    tmp = tempfile.TemporaryDirectory(prefix="cuda-evidence-test-")
    _TREES.append(tmp)
    return Path(tmp.name)


def test_translation_units_are_kernels_cuda_sources_only():
    build = _tmpdir()
    cc = [{"directory": str(build), "file": str(ce.REPO / f), "command": "nvcc -c %s" % f}
          for f in ("kernels/cuda/model_kernels.cu", "tests/cuda/fp8_kernel_test.cu",
                    "kernels/cuda/attention_mma.cu", "kernels/cuda/device_side.cpp",
                    "bench/bench_fp8_cuda.cu")]
    (build / "compile_commands.json").write_text(ce.json.dumps(cc))
    assert [t["rel"] for t in ce.translation_units(build, None)] == \
        ["kernels/cuda/attention_mma.cu", "kernels/cuda/model_kernels.cu"]
    assert [t["rel"] for t in ce.translation_units(build, "mma")] == ["kernels/cuda/attention_mma.cu"]


def test_commit_tree_moves_the_checkouts_paths_not_the_builds():
    build, root, tmp = _tmpdir(), _tmpdir(), _tmpdir()
    (build / "inc.rsp").write_text("-I%s -I%s/build/default/gen -isystem=/usr/local/cuda/include\n"
                                   % (ce.REPO, ce.REPO))
    args = ["nvcc", "--options-file", "inc.rsp", "-I%s/core" % ce.REPO, "-c",
            str(ce.REPO / "kernels/cuda/attention_mma.cu"), "-o", "/tmp/x.o"]
    got = ce.rewrite_for_tree(args, str(build), root, str(tmp))
    assert got[4:] == ["-c", str(root / "kernels/cuda/attention_mma.cu"), "-o", "/tmp/x.o"]
    assert got[3] == "-I%s/core" % root
    words = Path(got[2]).read_text().split()
    assert words == ["-I%s" % root, "-I%s/build/default/gen" % ce.REPO,
                     "-isystem=/usr/local/cuda/include"]


def test_bad_inputs_are_one_line_errors():
    import contextlib
    import io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert ce.main(["--build", str(_tmpdir()), "--cuobjdump", "/bin/true"]) == 1
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and "compile_commands.json not found" in lines[0]
    try:
        ce.find_cuobjdump("/no/such/cuobjdump")
        raise AssertionError("no error")
    except ce.EvidenceError as e:
        assert "not an executable" in str(e)
    saved_pip, saved_path = ce.PIP_CUOBJDUMP, ce.os.environ.get("PATH", "")
    try:
        ce.PIP_CUOBJDUMP = "/no/such/pip/cuobjdump"
        ce.os.environ["PATH"] = str(_tmpdir())
        ce.find_cuobjdump(None)
        raise AssertionError("no error")
    except ce.EvidenceError as e:
        assert "pip install nvidia-cuda-cuobjdump" in str(e)
    finally:
        ce.PIP_CUOBJDUMP = saved_pip
        ce.os.environ["PATH"] = saved_path
    try:
        ce.run_tool(["/no/such/nvcc", "-c", "x.cu"], what="nvcc on x.cu")
        raise AssertionError("no error")
    except ce.EvidenceError as e:
        assert "nvcc on x.cu: cannot run /no/such/nvcc" in str(e)


# CUDA's own occupancy calculator (the header-only cuda_occupancy.h of the toolkit), compiled on
# the host with an H200's properties: the independent implementation occupancy() must equal.
_OCC_CPP = r"""
#include <cstdio>
#include "cuda_occupancy.h"
int main() {
  cudaOccDeviceProp p;
  p.computeMajor = 9; p.computeMinor = 0; p.maxThreadsPerBlock = 1024;
  p.maxThreadsPerMultiprocessor = 2048; p.regsPerBlock = 65536; p.regsPerMultiprocessor = 65536;
  p.warpSize = 32; p.sharedMemPerBlock = 49152; p.sharedMemPerMultiprocessor = 233472;
  p.numSms = 132; p.sharedMemPerBlockOptin = 232448; p.reservedSharedMemPerBlock = 1024;
  int regs, threads; long smem;
  while (scanf("%d %ld %d", &regs, &smem, &threads) == 3) {
    cudaOccFuncAttributes a;
    a.maxThreadsPerBlock = 1024; a.numRegs = regs; a.sharedSizeBytes = 0;
    a.partitionedGCConfig = PARTITIONED_GC_OFF;
    a.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN; a.maxDynamicSharedSizeBytes = 232448;
    a.numBlockBarriers = 1;
    cudaOccDeviceState s;
    cudaOccResult r;
    cudaOccError e = cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &a, &s, threads, smem);
    printf("%d\n", e == CUDA_OCC_SUCCESS ? r.activeBlocksPerMultiprocessor : 0);
  }
}
"""


def test_occupancy_equals_cuda_occupancy_h():
    import itertools
    import os
    import shutil
    import subprocess
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    cxx = shutil.which("c++") or shutil.which("g++")
    if not os.path.isfile(os.path.join(home, "include", "cuda_occupancy.h")) or not cxx:
        print("skipped: no %s/include/cuda_occupancy.h or no C++ compiler" % home)
        return
    tmp = _tmpdir()
    (tmp / "occ.cpp").write_text(_OCC_CPP)
    subprocess.run([cxx, "-std=c++17", "-I" + os.path.join(home, "include"), str(tmp / "occ.cpp"),
                    "-o", str(tmp / "occ")], check=True)
    # registers around the 256-a-warp units, blocks of 1-32 warps, shared memory up to the
    # 227 KB a block may opt in to (and past it), around the 1 KB reservation and 128 B units
    cases = list(itertools.product(
        [16, 24, 32, 40, 41, 48, 64, 72, 73, 96, 100, 110, 128, 145, 168, 200, 255],
        [0, 16, 1000, 16384, 40960, 49152, 100000, 115712, 115713, 200000, 231424, 232448,
         232449],
        [32, 64, 96, 128, 256, 512, 1024]))
    out = subprocess.run([str(tmp / "occ")], input="".join("%d %d %d\n" % c for c in cases),
                         capture_output=True, text=True, check=True).stdout.split()
    assert len(out) == len(cases)
    wrong = [(c, int(o), ce.occupancy(c[0], c[1], c[2])[0]) for c, o in zip(cases, out)
             if int(o) != ce.occupancy(c[0], c[1], c[2])[0]]
    assert not wrong, wrong[:5]


def main():
    failed = 0
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    for name, f in tests:
        try:
            f()
        except Exception:  # noqa: BLE001 - report every failing test
            failed += 1
            print("FAIL %s\n%s" % (name, traceback.format_exc()))
    print("%d tests, %d failed" % (len(tests), failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
