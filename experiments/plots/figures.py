"""What every figure script here shares: reading a `kvq run` table, the commit for the footer,
the footer, PNG + PDF output."""
import csv
import os
import subprocess


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


def footer(fig, source):
    """The small grey line that says which script (and data) made the figure, and the commit."""
    fig.text(0.99, 0.005, f"{source}, kvq {commit()}", ha="right", fontsize=6, color="0.4")


def save(fig, out, name):
    """Writes OUT/NAME.png and OUT/NAME.pdf and says so."""
    os.makedirs(out, exist_ok=True)
    for ext in ("png", "pdf"):
        path = os.path.join(out, f"{name}.{ext}")
        fig.savefig(path, dpi=130)
        print("wrote", path)
