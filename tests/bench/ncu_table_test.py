"""Tests for scripts/ncu_table.py on a raw-page CSV in ncu's format (tests/bench/fixtures/ncu_raw.csv:
the header, the units row and one record, values as the first H200 profile reported them for the
tiled kivi2 kernel; docs/device-runs/2026-12-04-h200/README.md). Run: python3 tests/bench/ncu_table_test.py
"""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "ncu_table.py")
FIXTURE = os.path.join(ROOT, "tests", "bench", "fixtures", "ncu_raw.csv")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


class NcuTable(unittest.TestCase):
    def test_one_row_per_kernel_with_units_applied(self):
        p = run(FIXTURE)
        self.assertEqual(p.returncode, 0, p.stderr)
        row = p.stdout.strip().splitlines()[-1]
        cells = [c.strip() for c in row.strip("|").split("|")]
        self.assertEqual(cells[1], "split_kernel<128, IntPolicy<2>, true, 4>")
        self.assertEqual(cells[2], "2561.3")   # usecond, thousands separator dropped
        self.assertEqual(cells[3], "139")
        self.assertEqual(cells[4], "43.0")     # 43.01 Kbyte + 0 byte
        self.assertEqual(cells[5], "18.8 / 18.2%")
        self.assertEqual(cells[8], "long_scoreboard (4.2)")  # "selected" is not a stall

    def test_no_csv_is_one_line_and_exit_1(self):
        with tempfile.NamedTemporaryFile("w", suffix=".csv") as f:
            f.write("==PROF== nothing profiled\n")
            f.flush()
            p = run(f.name)
        self.assertNotEqual(p.returncode, 0)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)


if __name__ == "__main__":
    unittest.main()
