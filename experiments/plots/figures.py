"""What every figure script here shares: the commit for the footer, the footer, PNG + PDF output."""
import os
import subprocess


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
