#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# check-te-info.py: te-info lists good and broken plugins (with reasons, exit 0), prints the
# effective config or the config error (exit 1), and emits valid JSON. TAP output.
# Usage: check-te-info.py TE_INFO TEST_PLUGIN_DIR
import json
import os
import subprocess
import sys
import tempfile

te_info, plugin_dir = sys.argv[1], sys.argv[2]
results = []


def check(name, cond, detail=""):
    results.append((name, bool(cond), detail))


def run(*args, env=None):
    return subprocess.run([te_info, *args], capture_output=True, text=True, timeout=60,
                          env=env, stdin=subprocess.DEVNULL)


# Listing: every module of the directory appears, good ones with caps, bad ones with reasons.
r = run("--json", "--plugin-path", plugin_dir)
check("listing exits 0 although some plugins are broken", r.returncode == 0, r.stderr)
try:
    doc = json.loads(r.stdout)
except ValueError as e:
    doc = {"plugins": []}
    check("--json output parses", False, str(e))
else:
    check("--json output parses", True)
by_name = {os.path.basename(p["path"]): p for p in doc.get("plugins", [])}
check("search_path is the given directory", doc.get("search_path") == [plugin_dir],
      doc.get("search_path"))
lb = by_name.get("loopback.so", {})
check("loopback loads with caps and devices",
      lb.get("code") == 0 and lb.get("name") == "loopback" and lb.get("abi", {}).get("major") == 1
      and "read" in lb.get("caps", {}).get("ops", []) and len(lb.get("devices", [])) >= 1, lb)
fg = by_name.get("fakegpu.so", {})
check("a memory-kind owner lists what it owns (ABI 1.2)",
      fg.get("caps", {}).get("owned_mem_types") == ["cuda"], fg)
mo = by_name.get("missing_op.so", {})
check("missing op is reported by name", mo.get("code", 0) < 0 and "submit" in mo.get("error", ""),
      mo)
wm = by_name.get("wrong_major_desc.so", {})
check("wrong ABI major is reported", wm.get("code", 0) < 0 and "ABI" in wm.get("error", ""), wm)
na = by_name.get("not_a_plugin.so", {})
check("a non-ELF .so is reported, not fatal", na.get("code", 0) < 0 and na.get("error"), na)
inf = by_name.get("init_fail.so", {})
check("init failure keeps name and ABI, and says why",
      inf.get("name") == "init_fail" and inf.get("code", 0) < 0 and inf.get("error"), inf)

# Text listing of one module given by path.
r = run(os.path.join(plugin_dir, "loopback.so"))
check("text listing of one module", r.returncode == 0 and "loopback" in r.stdout
      and "devices:" in r.stdout and r.stdout.count(".so\n") == 1, r.stdout + r.stderr)

# Plugin given by name, resolved through TE_PLUGIN_PATH.
env = dict(os.environ, TE_PLUGIN_PATH=plugin_dir)
r = run("loopback", env=env)
check("plugin by name through TE_PLUGIN_PATH", r.returncode == 0 and "loopback" in r.stdout,
      r.stdout + r.stderr)

# --config: effective YAML, or the error with file:line:column and exit 1.
with tempfile.TemporaryDirectory() as d:
    good = os.path.join(d, "good.yaml")
    bad = os.path.join(d, "bad.yaml")
    with open(good, "w") as f:
        f.write("engine:\n  name: info-test\n")
    with open(bad, "w") as f:
        f.write("engine:\n  name: x\n  no_such_key: 1\n")
    r = run("--config", good)
    check("--config prints the effective configuration",
          r.returncode == 0 and "info-test" in r.stdout and "transfer:" in r.stdout,
          r.stdout + r.stderr)
    r = run("--config", bad)
    check("--config error: exit 1 with file:line:column",
          r.returncode == 1 and "bad.yaml:3:" in r.stderr and "no_such_key" in r.stderr,
          r.stdout + r.stderr)
    r = run("--json", "--config", bad)
    try:
        j = json.loads(r.stdout)
        ok = r.returncode == 1 and j.get("code", 0) < 0 and "no_such_key" in j.get("error", "")
    except ValueError:
        ok = False
    check("--json --config error is JSON", ok, r.stdout + r.stderr)

r = run("--no-such-option")
check("unknown option: exit 2", r.returncode == 2, r.stderr)

print("1..%d" % len(results))
for i, (name, ok, detail) in enumerate(results, 1):
    print("%s %d - %s" % ("ok" if ok else "not ok", i, name))
    if not ok and detail != "":
        for line in str(detail).splitlines()[:20]:
            print("#   " + line)
sys.exit(0 if all(ok for _, ok, _ in results) else 1)
