# SPDX-License-Identifier: Apache-2.0
"""benchlib.py: what the bench scripts' Python parts share (compare-tcp.sh, compare-builds.sh):
a run's JSON row, sizes as te-bench writes them, the load average, a median (min-max) cell, and
writing a table to stdout and --md FILE."""
import json
import re
import statistics
import sys


def last_json(text):
    """The last line of @text that is a JSON value (a te-bench or tcp-raw-loop row), or None."""
    for line in text.splitlines()[::-1]:
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def size_of(s):
    """A size as te-bench takes it (4096, 4K, 1M, 2GiB: powers of 2) in bytes; ValueError if
    it is not one."""
    m = re.fullmatch(r"(\d+)([KMG]?)(?:i?B)?", s.strip(), re.I)
    if not m:
        raise ValueError(f"not a size: '{s.strip()}' (e.g. 4K, 1M)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def loadavg():
    """The 1, 5 and 15 minute load averages as one string ('?' when unknown)."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def host_cc():
    """The host's default TCP congestion control (net.ipv4.tcp_congestion_control), or '?'."""
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            return f.read().strip() or "?"
    except OSError:
        return "?"


def med(v, digits=3):
    """'median (min-max)' of @v with @digits decimals; the median alone for one value, '-' for
    none."""
    if not v:
        return "-"
    m = statistics.median(v)
    if len(v) == 1:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ({min(v):.{digits}f}-{max(v):.{digits}f})"


def emit(lines, md=None):
    """The table: @lines joined, to stdout and, with @md, to that file (replaced)."""
    text = "\n".join(lines).rstrip() + "\n"
    sys.stdout.write(text)
    if md:
        with open(md, "w") as f:
            f.write(text)
