#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# check-te-info.py: te-info lists good and broken plugins (with reasons, exit 0), prints the
# effective config or the config error (exit 1), and emits valid JSON; with TINFO_DIR, also
# its findings on flawed modules (tests/plugins/tinfo) and its survival of crashing ones.
# TAP output.
# Usage: check-te-info.py TE_INFO TEST_PLUGIN_DIR [TINFO_DIR]
import json
import os
import socket
import subprocess
import sys
import tempfile

te_info, plugin_dir = sys.argv[1], sys.argv[2]
tinfo_dir = sys.argv[3] if len(sys.argv) > 3 else None
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

# A plugin named on the command line that is not found or does not load: exit 1, with why.
r = run("--plugin-path", plugin_dir, "no_such_plugin")
check("unknown plugin name: exit 1, the reason listed",
      r.returncode == 1 and "no_such_plugin.so: plugin not found" in r.stdout,
      r.stdout + r.stderr)
r = run("--json", "--plugin-path", plugin_dir, "no_such_plugin", "loopback")
try:
    ps = json.loads(r.stdout)["plugins"]
except (ValueError, KeyError):
    ps = []
check("--json unknown plugin name: exit 1, JSON with the reason and the other plugin",
      r.returncode == 1 and len(ps) == 2 and ps[0].get("code", 0) < 0
      and "not found" in ps[0].get("error", "") and ps[1].get("code") == 0, r.stdout + r.stderr)
r = run(os.path.join(plugin_dir, "not_a_plugin.so"))
check("a named module file that does not load: exit 1", r.returncode == 1
      and "error:" in r.stdout, r.stdout + r.stderr)
r = run(os.path.join(plugin_dir, "init_fail.so"))
check("a named module that loads but fails init: listed, exit 0",
      r.returncode == 0 and "init:" in r.stdout, r.stdout + r.stderr)

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

    # --json --config: the effective configuration as a JSON object, typed, secret redacted.
    secret = os.path.join(d, "secret.yaml")
    with open(secret, "w") as f:
        f.write("engine:\n  name: info-test\nauth:\n  secret: \"0123456789abcdef-xyz\"\n"
                "transfer:\n  fallback: yes\n")
    r = run("--json", "--config", secret)
    try:
        eff = json.loads(r.stdout).get("effective")
    except ValueError:
        eff = None
    check("--json --config: 'effective' is an object, not YAML text",
          r.returncode == 0 and isinstance(eff, dict)
          and eff.get("engine", {}).get("name") == "info-test"
          and eff.get("engine", {}).get("advertise", 0) is None, r.stdout + r.stderr)
    eff = eff if isinstance(eff, dict) else {}
    check("--json --config: numbers and booleans typed, sizes and words as strings",
          eff.get("transfer", {}).get("retries") == 3
          and eff.get("transfer", {}).get("fallback") is True
          and eff.get("metadata", {}).get("endpoints") == []
          and eff.get("control", {}).get("max_frame") == "16M"
          and eff.get("log", {}).get("level") == "warn"
          and eff.get("transports", [{}])[0].get("required") is True, eff)
    check("--json --config: the secret stays redacted",
          eff.get("auth", {}).get("secret") == "<redacted secret>"
          and "0123456789abcdef-xyz" not in r.stdout, r.stdout)

r = run("--no-such-option")
check("unknown option: exit 2", r.returncode == 2, r.stderr)

# Declared options (ABI 1.2): listed with type, range or choices, default and help.
r = run(os.path.join(plugin_dir, "declared.so"))
lines = [l.strip() for l in r.stdout.splitlines()]
for want in ["options:  9 declared",
             "progress: choice (auto, manual), default auto -- auto: worker threads complete "
             "slices; manual: progress() does",
             "workers: int 1..64, default 1 -- worker threads",
             "slice_size: size 1..1T, default 64K -- slice size advertised to the core",
             "verbose: bool, default false -- log more (a boolean for tests)",
             "bias: int -100..100, default -1 -- a signed integer for tests",
             'label: string, default "lo" -- a string for tests',
             "note: string, no default -- a string without default for tests"]:
    check("te-info declared.so lists '%s'" % want.split(":")[0] if ":" in want else want,
          r.returncode == 0 and want in lines, r.stdout + r.stderr)
r = run(os.path.join(plugin_dir, "declared_req.so"))
check("a required option is listed as such",
      "token: string, required -- a required string for tests" in
      [l.strip() for l in r.stdout.splitlines()], r.stdout + r.stderr)
r = run(os.path.join(plugin_dir, "loopback.so"))
check("a plugin without declarations says so",
      "options:  none declared (free-form)" in [l.strip() for l in r.stdout.splitlines()],
      r.stdout)
r = run("--json", os.path.join(plugin_dir, "declared.so"), os.path.join(plugin_dir, "loopback.so"))
try:
    ps = {p["name"]: p for p in json.loads(r.stdout)["plugins"]}
except (ValueError, KeyError) as e:
    ps = {}
    check("--json of declared.so parses", False, str(e) + r.stdout)
opts = {o["name"]: o for o in ps.get("declared", {}).get("options", [])}
check("--json: declared options with type, default, range, choices, help",
      ps.get("declared", {}).get("options_declared") is True and len(opts) == 9
      and opts.get("workers") == {"name": "workers", "type": "int", "default": "1", "min": 1,
                                  "max": 64, "required": False, "help": "worker threads"}
      and opts.get("progress", {}).get("choices") == ["auto", "manual"]
      and opts.get("note", {}).get("default", 0) is None
      and "min" not in opts.get("label", {}), ps.get("declared"))
check("--json: no declarations", ps.get("loopback", {}).get("options_declared") is False
      and ps.get("loopback", {}).get("options") == [], ps.get("loopback"))
r = run(os.path.join(plugin_dir, "bad_decl.so"))
check("broken declarations: the module is refused naming the option (exit 1: named)",
      r.returncode == 1 and "option 'workers': default \"0\" is invalid: value 0 out of range "
      "1..64" in r.stdout, r.stdout + r.stderr)

# --config checks declared options with the engine's error text; defaults show as effective.
with tempfile.TemporaryDirectory() as d:
    def cfg(name, text):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        return path
    bad = cfg("bad-opt.yaml", "transports:\n  - name: loopback\n    required: true\n"
              "  - name: declared\n    required: false\n    options:\n      workers: 65\n")
    r = run("--plugin-path", plugin_dir, "--config", bad)
    check("--config: a bad declared option (optional transport): exit 1, file:line:col",
          r.returncode == 1 and r.stderr.strip().splitlines()[-1:] ==
          ["te-info: %s:7:16: transports[1].options.workers: value 65 out of range 1..64" % bad],
          r.stdout + r.stderr)
    r = run("--json", "--plugin-path", plugin_dir, "--config", bad)
    try:
        j = json.loads(r.stdout)
    except ValueError:
        j = {}
    check("--json --config: the same error",
          r.returncode == 1 and j.get("error") ==
          "%s:7:16: transports[1].options.workers: value 65 out of range 1..64" % bad, r.stdout)
    typo = cfg("typo.yaml", "transports:\n  - name: declared\n    options: {lable: x}\n")
    r = run("--plugin-path", plugin_dir, "--config", typo)
    check("--config: an unknown option with a suggestion",
          r.returncode == 1 and '%s:3:15: transports[0].options.lable: unknown option of plugin '
          'declared (did you mean "label"?)' % typo in r.stderr, r.stdout + r.stderr)
    good = cfg("good-opt.yaml", "transports:\n  - name: declared\n    options: {verbose: on}\n"
               "  - name: not_installed_here\n    options: {x: 1}\n")
    r = run("--plugin-path", plugin_dir, "--config", good)
    check("--config: effective options with defaults, absent plugin noted",
          r.returncode == 0 and '"verbose": "true"' in r.stdout and '"workers": "1"' in r.stdout
          and '"x": "1"' in r.stdout and "not_installed_here" in r.stderr
          and "options not checked" in r.stderr, r.stdout + r.stderr)


# --check FILE: what would stop or cripple an engine from FILE on this host. One line per check
# on stderr (ok/note/warning/error), exit 1 at the first error, and on any warning.
def free_port():
    """A loopback TCP port nobody listens on (closed again at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unassigned_test_net():
    """A TEST-NET address (RFC 5737) this host does not have: binding it fails. None if all."""
    for addr in ("192.0.2.1", "198.51.100.1", "203.0.113.1"):
        with socket.socket() as s:
            try:
                s.bind((addr, 0))
            except OSError:
                return addr
    return None


def levels(stderr):
    return [l.split(":", 1)[0] for l in stderr.splitlines()
            if l.startswith(("ok:", "note:", "warning:", "error:"))]


tcp_dir = os.path.join(os.path.dirname(os.path.abspath(te_info)), "..", "plugins", "tcp")
with tempfile.TemporaryDirectory() as d:
    def cfg(name, text):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def check_run(path, *extra, plugins=plugin_dir):
        return run("--plugin-path", plugins, "--check", path, *extra)

    good = cfg("good.yaml", "engine:\n  listen: \"127.0.0.1:0\"\ntransports:\n"
               "  - name: loopback\n    required: true\n  - name: declared\n"
               "    options: {workers: 4}\n  - name: not_installed_here\n")
    r = check_run(good)
    lv = levels(r.stderr)
    check("--check good file: exit 0, one ok line per check, the absent optional plugin a note",
          r.returncode == 0 and lv.count("ok") >= 6 and "error" not in lv and "warning" not in lv
          and any(l.startswith("note: transports[2] (not_installed_here): absent on this host")
                  for l in r.stderr.splitlines())
          and not r.stdout, r.stdout + r.stderr)
    r = check_run(good, "--json")
    try:
        j = json.loads(r.stdout)
    except ValueError:
        j = {}
    check("--check --json good file: ok, every check listed",
          r.returncode == 0 and j.get("ok") is True and j.get("code") == 0
          and {c.get("level") for c in j.get("checks", [])} == {"ok", "note"}
          and any(c.get("key") == "engine.listen" for c in j.get("checks", []))
          and any(c.get("key") == "metadata.type" for c in j.get("checks", [])), r.stdout)

    def check_error(name, text, want, plugins=plugin_dir, code=None):
        """FILE with TEXT fails the check: exit 1, its last line the error WANT (% path)."""
        path = cfg(name, text)
        r = check_run(path, plugins=plugins)
        last = r.stderr.strip().splitlines()[-1:] or [""]
        check("--check %s: exit 1, '%s'" % (name, want % "FILE"),
              r.returncode == 1 and last[0].startswith("error: " + want % path),
              r.stdout + r.stderr)
        r = check_run(path, "--json", plugins=plugins)
        try:
            j = json.loads(r.stdout)
        except ValueError:
            j = {}
        check("--check --json %s: the same error" % name,
              r.returncode == 1 and j.get("ok") is False
              and j.get("error", "").startswith(want % path)
              and j.get("checks", [{}])[-1].get("level") == "error"
              and (code is None or j.get("code") == code), r.stdout + r.stderr)
        return r

    check_error("syntax.yaml", "engine:\n  name: x\n  no_such_key: 1\n",
                "%s:3:3: engine.no_such_key: unknown key")
    check_error("bad-option.yaml", "transports:\n  - name: declared\n    required: true\n"
                "    options:\n      workers: 65\n",
                "%s:5:16: transports[0].options.workers: value 65 out of range 1..64")
    check_error("misspelled.yaml", "transports:\n  - name: loopbak\n    required: true\n",
                "%s:2:11: transports[0].name: transport 'loopbak' (required): loopbak.so: "
                "plugin not found")
    check_error("optional-bad-option.yaml", "transports:\n  - name: loopback\n"
                "  - name: declared\n    required: false\n    options: {lable: x}\n",
                '%s:5:15: transports[1].options.lable: unknown option of plugin declared '
                '(did you mean "label"?)')
    # An option the plugin checks in its init (loopback declares none): an error even optional.
    check_error("optional-init-option.yaml", "transports:\n  - name: declared\n"
                "  - name: loopback\n    required: false\n    options:\n"
                "      progress: sometimes\n",
                "%s:6:17: transports[1].options.progress: expected auto or manual, got "
                "'sometimes'")
    missing = os.path.join(d, "no-such-secret")
    check_error("missing-secret.yaml", "auth:\n  secret_file: %s\n" % missing,
                "%%s:2:16: auth.secret_file: cannot open %s: No such file or directory"
                % missing)
    loose = cfg("loose-secret", "0123456789abcdef0123\n")
    os.chmod(loose, 0o644)
    check_error("loose-secret.yaml", "auth:\n  secret_file: %s\n" % loose,
                "%%s:2:16: auth.secret_file: %s is readable by group or others (mode 0644)"
                % loose)
    addr = unassigned_test_net()
    if addr:
        # Bind only: no packet is sent to a TEST-NET address.
        check_error("unbindable.yaml", "engine:\n  listen: \"%s:0\"\n" % addr,
                    "%%s:2:11: engine.listen: cannot bind '%s' on this host" % addr)
    else:
        check("--check unbindable listen # SKIP every TEST-NET address is local here", True)
    closed = free_port()
    r = check_run(cfg("etcd-down2.yaml", "metadata:\n  type: etcd\n  endpoints: "
                      "http://127.0.0.1:%d\ntransports:\n  - name: loopback\n" % closed))
    built = "not available in this build" not in r.stderr
    check("--check unreachable etcd: says which endpoint, or that etcd is not built",
          r.returncode == 1 and ("127.0.0.1:%d" % closed in r.stderr or not built), r.stderr)
    check_error("etcd-down.yaml", "metadata:\n  type: etcd\n  endpoints: http://127.0.0.1:%d\n"
                "transports:\n  - name: loopback\n" % closed,
                "%s:3:14: metadata.endpoints: etcd metadata: " if built
                else "%s:2:9: metadata.type: ")
    check_error("no-transport.yaml", "transports:\n  - name: not_installed_here\n"
                "  - name: init_fail\n",
                "%s:2:3: transports: no transport can be loaded on this host "
                "(not_installed_here, init_fail skipped)")

    # A configured control port in use (an engine of this file running): a note, exit 0.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = check_run(cfg("port-in-use.yaml", "engine:\n  listen: \"127.0.0.1:%d\"\n"
                          "transports:\n  - name: loopback\n" % port))
    check("--check control port in use: a note, exit 0",
          r.returncode == 0 and any(l.startswith("note: engine.listen: port %d is in use" % port)
                                    for l in r.stderr.splitlines()), r.stderr)

    # tcp: a loopback data listener behind a network control plane (bind only, no traffic).
    if os.path.exists(os.path.join(tcp_dir, "tcp.so")):
        path = cfg("loopback-bind.yaml", "engine:\n  listen: \"0.0.0.0:0\"\ntransports:\n"
                   "  - name: tcp\n    required: true\n    options:\n      bind: 127.0.0.1\n")
        r = check_run(path, plugins=tcp_dir)
        check("--check tcp bind on loopback, listen on a network address: a warning, exit 1",
              r.returncode == 1 and any(
                  l.startswith("warning: %s:7:13: transports[0].options.bind: tcp: option "
                               "'bind' is 127.0.0.1, a loopback address" % path)
                  for l in r.stderr.splitlines()) and "error:" not in r.stderr, r.stderr)
        r = check_run(path, "--json", plugins=tcp_dir)
        try:
            j = json.loads(r.stdout)
        except ValueError:
            j = {}
        check("--check --json: the warning counted, ok false",
              r.returncode == 1 and j.get("ok") is False and j.get("warnings") == 1
              and j.get("code") == 0, r.stdout)
        r = check_run(cfg("tcp-auto.yaml", "engine:\n  listen: \"0.0.0.0:0\"\ntransports:\n"
                          "  - name: tcp\n    required: true\n"), plugins=tcp_dir)
        check("--check tcp bind auto behind a wildcard listen: no warning, exit 0",
              r.returncode == 0 and "warning:" not in r.stderr, r.stderr)
    else:
        check("--check tcp loopback bind # SKIP no tcp plugin at %s" % tcp_dir, True)

    r = run("--check", good, "--config", good)
    check("--check with --config: usage error, exit 2", r.returncode == 2, r.stderr)


def block(text, stem):
    """The lines of the text listing's block for module STEM.so (empty if absent)."""
    out, inside = [], False
    for line in text.splitlines():
        if line.endswith(".so") and not line.startswith(" "):
            inside = os.path.basename(line) == stem + ".so"
        elif inside:
            out.append(line.strip())
    return out


def has_line(lines, prefix, *words):
    return any(line.startswith(prefix) and all(w in line for w in words) for line in lines)


if tinfo_dir:
    def mod(stem):
        return os.path.join(tinfo_dir, stem + ".so")

    # A good module: no finding lines, exit 0 (the output of good modules is unchanged).
    r = run(mod("tinfo_good"))
    b = block(r.stdout, "tinfo_good")
    check("good module: no warning or error line, exit 0",
          r.returncode == 0 and b and not any(l.startswith(("warning:", "error:")) for l in b)
          and "devices:  1" in b, r.stdout + r.stderr)

    r = run(mod("tinfo_wrong_name"))
    b = block(r.stdout, "tinfo_wrong_name")
    check("descriptor name != file stem: a warning naming both, exit 0",
          r.returncode == 0 and has_line(b, "warning:", '"tinfo_other_name"', '"tinfo_wrong_name"'),
          r.stdout + r.stderr)

    r = run(mod("tinfo_too_many_devices"))
    b = block(r.stdout, "tinfo_too_many_devices")
    check("query_devices over max: an error line, only the filled device listed",
          r.returncode == 0
          and has_line(b, "error:", "query_devices reported 100 devices, more than the 64 asked for")
          and "devices:  1" in b and sum(l.startswith("[") for l in b) == 1,
          r.stdout + r.stderr)

    r = run(mod("tinfo_extra_symbol"))
    b = block(r.stdout, "tinfo_extra_symbol")
    check("an exported symbol besides the entry point: a warning naming it",
          r.returncode == 0 and has_line(b, "warning:", "tinfo_fake_extra")
          and not has_line(b, "warning:", "te_plugin_entry"), r.stdout + r.stderr)

    # Crashing modules: each reported, the listing goes on, exit 1.
    r = run("--plugin-path", tinfo_dir)
    text = r.stdout
    check("a crashing module does not take te-info down: exit 1, every module listed",
          r.returncode == 1 and all(block(text, s) for s in [
              "tinfo_crash_fini", "tinfo_crash_init", "tinfo_crash_query_devices",
              "tinfo_extra_symbol", "tinfo_good", "tinfo_too_many_devices", "tinfo_wrong_name"]),
          text + r.stderr)
    for stem, op in [("tinfo_crash_init", "init"), ("tinfo_crash_query_devices", "query_devices"),
                     ("tinfo_crash_fini", "fini")]:
        check("%s: 'crashed with SIGSEGV in %s'" % (stem, op),
              any(l.endswith("crashed with SIGSEGV in " + op) for l in block(text, stem)),
              block(text, stem))
    check("the module after a crash is probed in full",
          "devices:  1" in block(text, "tinfo_good"), block(text, "tinfo_good"))
    r = run(mod("tinfo_crash_init"))
    check("one crashing module given by path: exit 1", r.returncode == 1, r.stdout + r.stderr)

    # --check: a transport whose plugin crashes in init is an error, te-info survives it.
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "crash.yaml")
        with open(path, "w") as f:
            f.write("transports:\n  - name: tinfo_good\n  - name: tinfo_crash_init\n")
        r = run("--plugin-path", tinfo_dir, "--check", path)
        check("--check: a plugin crashing in init is an error naming the signal",
              r.returncode == 1 and r.stderr.strip().splitlines()[-1:] ==
              ["error: %s:3:5: transports[1]: transport 'tinfo_crash_init': the plugin crashed "
               "with SIGSEGV in init (an engine loading it would too)" % path], r.stderr)

    # --json carries the same findings.
    r = run("--json", "--plugin-path", tinfo_dir)
    try:
        plugins = {os.path.basename(p["path"]): p for p in json.loads(r.stdout)["plugins"]}
    except (ValueError, KeyError) as e:
        plugins = {}
        check("--json over tinfo modules parses", False, str(e) + r.stdout)
    check("--json: exit 1 when a module crashed", r.returncode == 1, r.stderr)
    g = plugins.get("tinfo_good.so", {})
    check("--json: a good module has no findings members",
          g.get("code") == 0 and not {"warnings", "errors", "crashed"} & set(g), g)
    wn = plugins.get("tinfo_wrong_name.so", {})
    check("--json: name warning",
          any("tinfo_other_name" in w and "tinfo_wrong_name" in w for w in wn.get("warnings", [])),
          wn)
    tm = plugins.get("tinfo_too_many_devices.so", {})
    check("--json: too many devices is an error, one device listed",
          any("reported 100 devices, more than the 64" in e for e in tm.get("errors", []))
          and len(tm.get("devices", [])) == 1, tm)
    es = plugins.get("tinfo_extra_symbol.so", {})
    check("--json: extra symbol warning",
          any("tinfo_fake_extra" in w for w in es.get("warnings", [])), es)
    for stem, op in [("tinfo_crash_init", "init"), ("tinfo_crash_query_devices", "query_devices"),
                     ("tinfo_crash_fini", "fini")]:
        c = plugins.get(stem + ".so", {})
        check("--json: %s crashed with SIGSEGV in %s" % (stem, op),
              c.get("crashed") == {"signal": "SIGSEGV", "op": op}
              and ("crashed with SIGSEGV in " + op in c.get("error", "")
                   or "crashed with SIGSEGV in " + op in c.get("errors", [])), c)

print("1..%d" % len(results))
for i, (name, ok, detail) in enumerate(results, 1):
    print("%s %d - %s" % ("ok" if ok else "not ok", i, name))
    if not ok and detail != "":
        for line in str(detail).splitlines()[:20]:
            print("#   " + line)
sys.exit(0 if all(ok for _, ok, _ in results) else 1)
