#!/usr/bin/env python3
"""Nsight Compute's raw CSV (ncu --csv --page raw --metrics ... --log-file F) as a markdown table:
one row per profiled kernel launch with its registers, shared memory, occupancy, DRAM throughput,
issue slots busy and top stall. scripts/device-check.sh runs ncu with NCU_METRICS below.

Usage: python3 scripts/ncu_table.py NCU.csv      (python3 scripts/ncu_table.py --metrics: the
metric list device-check.sh passes to ncu)
"""
import csv
import re
import sys

# The metrics (device-check.sh passes these to --metrics; the stall reasons by regex).
NCU_METRICS = [
    "gpu__time_duration.sum",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__shared_mem_per_block_static",
    "sm__maximum_warps_per_active_cycle_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__inst_issued.avg.pct_of_peak_sustained_active",
    "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio",
]
STALL = re.compile(r"smsp__average_warps_issue_stalled_(.*)_per_issue_active\.ratio")


def number(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def short_name(name):
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(anonymous namespace\)::|kvq::cuda::|<unnamed>::|unnamed>::", "", name)
    depth, out = 0, []
    for ch in name:  # drop the parameter list, keep the template arguments
        if ch == "(" and depth == 0:
            break
        depth += ch == "<"
        depth -= ch == ">"
        out.append(ch)
    return "".join(out).strip()


def rows(path):
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        raise SystemExit(f"ncu_table: no CSV header (\"ID\",...) in {path}")
    reader = csv.reader(lines[start:])
    header = next(reader)
    out, units = [], {}
    for r in reader:
        if len(r) != len(header):
            continue  # a line that is not a record
        if not r[0].strip():
            units = dict(zip(header, r))  # the units row
        elif r[0].strip().isdigit():
            out.append(dict(zip(header, r)))
    return out, units


TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
         "second": 1e6, "s": 1e6}
TO_BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Kibyte": 1024, "KiB": 1024, "KB": 1e3}


def table(records, units):
    head = ("| # | kernel | us | regs | shared / block (kB) | theor. / achieved occupancy "
            "| DRAM % of peak | issue slots busy | top stall (cycles per issue) |")
    lines = [head, "|---:|---|---:|---:|---:|---|---:|---:|---|"]
    scale = TO_US.get(units.get("gpu__time_duration.sum", "nsecond").strip(), 1e-3)
    for i, r in enumerate(records):
        f = {k: number(v) for k, v in r.items()}
        stalls = sorted(((v, STALL.match(k).group(1)) for k, v in f.items()
                         if STALL.match(k) and v is not None and STALL.match(k).group(1) not in
                         ("selected", "not_selected")), reverse=True)
        top = f"{stalls[0][1]} ({stalls[0][0]:.1f})" if stalls else "-"
        smem = sum((f.get(k) or 0) * TO_BYTES.get(units.get(k, "byte").strip(), 1)
                   for k in ("launch__shared_mem_per_block_dynamic",
                             "launch__shared_mem_per_block_static"))
        dur = f.get("gpu__time_duration.sum")
        us = None if dur is None else dur * scale

        def pct(k):
            v = f.get(k)
            return "-" if v is None else f"{v:.1f}"

        lines.append("| {} | {} | {} | {} | {:.1f} | {} / {}% | {} | {}% | {} |".format(
            i, short_name(r.get("Kernel Name", "?")),
            "-" if us is None else f"{us:.1f}", pct("launch__registers_per_thread").split(".")[0],
            smem / 1e3, pct("sm__maximum_warps_per_active_cycle_pct"),
            pct("sm__warps_active.avg.pct_of_peak_sustained_active"),
            pct("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
            pct("sm__inst_issued.avg.pct_of_peak_sustained_active"), top))
    return "\n".join(lines)


def main(argv):
    if len(argv) != 1:
        print("usage: ncu_table.py NCU.csv | --metrics", file=sys.stderr)
        return 64
    if argv[0] == "--metrics":
        print(",".join(NCU_METRICS))
        return 0
    try:
        records, units = rows(argv[0])
    except OSError as e:
        print(f"ncu_table: {e}", file=sys.stderr)
        return 1
    if not records:
        print(f"ncu_table: no kernel records in {argv[0]}", file=sys.stderr)
        return 1
    print(table(records, units))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
