"""What every figure script here shares: reading a `kvq run` table, the commit for the footer,
the footer, legends outside the panels, readable log axes, PNG + PDF output."""
import csv
import math
import os
import socket
import subprocess

import matplotlib.ticker


def results_table(results, task, config):
    """(path, rows) of RESULTS/TASK.csv from a `kvq run` (dicts of strings); exits with a line
    naming the config to run when the file is missing or empty."""
    path = os.path.join(results, f"{task}.csv")
    if not os.path.exists(path):
        raise SystemExit(f"{path}: not found (run: kvq run {config})")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"{path}: no rows yet (run: kvq run {config})")
    return path, rows


def interval(r, key, value=None, scale=1.0, floor=None):
    """(below, above): how far the 95% interval KEY_lo .. KEY_hi of a `kvq run` model row reaches
    below and above VALUE (default: the row's KEY), times SCALE; (0, 0) for a row without one (rows
    from before the intervals, or an interval that could not be estimated). FLOOR: the lowest
    value the axis can show (a log axis), where the bar stops. Rows may come from the .jsonl
    (numbers, None) or the .csv (strings, "null")."""
    def num(v):
        try:
            x = float(v)
        except (TypeError, ValueError):
            return None
        return x if x == x else None
    y = num(r.get(key)) if value is None else value
    lo, hi = num(r.get(f"{key}_lo")), num(r.get(f"{key}_hi"))
    if y is None or lo is None or hi is None:
        return 0.0, 0.0
    lo, hi = lo * scale, hi * scale
    y = y * scale if value is None else y
    if floor is not None:
        lo = max(lo, floor)
    return max(y - lo, 0.0), max(hi - y, 0.0)


def commit():
    """The checkout's commit (12 hex digits), or "unknown" outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def host(rows=None):
    """Where the figure's numbers were measured: the `machine` column of `kvq run` rows (host: CPU
    x cores, as the run recorded it), or, for rows without one, this machine, read the same way
    and marked as where the plot was drawn."""
    seen = list(dict.fromkeys(r.get("machine") for r in rows or [] if r.get("machine")))
    if seen:
        return "; ".join(seen)
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name") and ":" in line), cpu)
    except OSError:
        pass
    return f"plotted on {socket.gethostname() or 'unknown host'}: {cpu} x {os.cpu_count()}"


def footer(fig, source, rows=None):
    """The small grey line that says which script (and data) made the figure, the commit, and the
    host the numbers come from (host(rows))."""
    fig.text(0.99, 0.005, f"{source}, kvq {commit()}, {host(rows)}", ha="right", fontsize=6,
             color="0.4")


def legend_below(fig, ax, ncol=3):
    """One legend for the figure, under its panels (a legend inside an axes covers points); save()
    keeps the figure's tight bounding box, which takes it in."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), fontsize=7,
                   ncol=min(ncol, len(handles)), frameon=False)


def legend_right(ax, handles=None, labels=None):
    """The axes' legend outside it, on its right (a legend inside covers points)."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0,
              fontsize=7, frameon=False)


def log_axis(ax, axis="y"):
    """A log axis that labels enough ticks to be read: over less than two decades (with the data
    already drawn) the 2x and 5x ticks are labelled too, and every label is a plain number (a
    narrow range would otherwise show a single label)."""
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    a = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    if lo > 0 and math.log10(hi / lo) < 2:
        # over less than a decade, every minor tick (2x .. 9x) is labelled
        digits = (2, 5) if math.log10(hi / lo) >= 1 else tuple(range(2, 10))
        plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        a.set_major_formatter(plain)
        a.set_minor_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _: f"{v:g}" if round(v / 10 ** math.floor(math.log10(v) + 1e-9)) in digits
            else ""))


def pow2_axis(ax, values, axis="x"):
    """A log2 axis ticked at the values measured, as numbers (4096 -> 4k), not 2^12."""
    vals = sorted({int(v) for v in values})
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2)
    a = ax.xaxis if axis == "x" else ax.yaxis
    a.set_ticks(vals, [f"{v // 1024}k" if v >= 1024 and v % 1024 == 0 else str(v) for v in vals])
    a.set_minor_locator(matplotlib.ticker.NullLocator())


def save(fig, out, name):
    """Writes OUT/NAME.png and OUT/NAME.pdf and says so."""
    os.makedirs(out, exist_ok=True)
    for ext in ("png", "pdf"):
        path = os.path.join(out, f"{name}.{ext}")
        # tight: what lies outside the panels (a legend under them, long labels) is not cut off
        fig.savefig(path, dpi=130, bbox_inches="tight", pad_inches=0.08)
        print("wrote", path)
