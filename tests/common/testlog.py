# SPDX-License-Identifier: MIT
"""tests/common/testlog.py - reading meson's JSON test logs, shared by
tests/common/testlog-summary.py (scripts/test) and tests/gpu/gpu-summary.py
(scripts/gpu-check)."""
import json
import re

PASSED = ("OK", "EXPECTEDFAIL")
# The partial-skip marker (tests/common/README.md).
MARKER = re.compile(r"^EMM-PARTIAL:.*$", re.M)


def read_log(path):
    """The log's test records, in order; None if it cannot be read."""
    tests = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        tests.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        return None
    return tests


def split_name(full):
    """'emm:gpu+preload / runtime-static' -> ('gpu', 'runtime-static')."""
    suite, _, name = full.partition(" / ")
    suite = suite.split(":", 1)[-1].split("+")[0]
    return suite, name or full
