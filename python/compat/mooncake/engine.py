# SPDX-License-Identifier: Apache-2.0
"""``mooncake.engine`` on te: Mooncake Transfer Engine's documented Python API over te's
Python binding (``python/te``). Opt-in: put ``python/compat`` (and ``python``) on the path.

    from mooncake.engine import TransferEngine
    engine = TransferEngine()
    engine.initialize("localhost", "P2PHANDSHAKE", "tcp", "")
    session = f"localhost:{engine.get_rpc_port()}"

Return conventions are Mooncake's: 0 on success and a negative value on failure (batch ids
and addresses: 0 on failure). After a failure ``engine.last_error()`` returns te's detail
text and ``engine.last_error_info()`` its parts (per thread); every failure is also logged
at warning level on the ``te.compat.mooncake`` logger. A documented Mooncake feature te
cannot honour raises ``UnsupportedError`` naming the method and why. The mapping of
``initialize()``'s arguments and of Mooncake's environment variables to te's configuration
is in docs/mooncake-compat.md.
"""

from __future__ import annotations

import bisect
import enum
import functools
import json
import logging
import operator
import os
import random
import threading
import urllib.parse
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

import te

__all__ = [
    "TransferEngine", "TransferNotify", "TransferOpcode", "UnsupportedError", "ErrorInfo",
    "build_config", "CompatConfig",
]

log = logging.getLogger("te.compat.mooncake")

#: Mooncake's return values.
OK = 0
FAILED = -1
#: transfer_check_status() results (Mooncake's documented values).
COMPLETED = 1
IN_PROGRESS = 0
TIMED_OUT = -2

_U64 = 1 << 64
_PROBE_TIMEOUT_S = 3.0
_NOTIFY_TAG = b"mooncake-notify:1\n"  # TransferNotify(name, msg) carried in a te notify
_PORT_TRIES = 16

# protocol -> te plugin moving the bytes.
_PROTOCOLS = {
    "tcp": "tcp",
    "rdma": "rdma",
    "efa": "efa",
    "nvlink": "nvlink",
    "nvlink_intra": "nvlink",
    "hip": "hip",
    "cxl": "cxl",
}

# Protocols Mooncake documents that te has no transport for.
_NO_TRANSPORT = {
    "shm": "te has no POSIX shared-memory transport; use tcp (on loopback) or cxl",
    "nvmeof": "te has no NVMe-oF (cuFile) transport: it moves memory, not files",
    "ascend": "te has no Ascend transport",
    "ascend_direct": "te has no Ascend transport",
    "hccl": "te has no Ascend transport",
    "ub": "te has no Kunpeng UB transport",
    "barex": "te has no barex transport",
    "musa": "te has no MUSA transport",
    "mlu": "te has no MLU transport",
    "maca": "te has no MACA transport",
    "sunrise_link": "te has no Sunrise Link transport",
    "flagcx": "te has no FlagCX transport",
    "mpcomm": "te has no mpcomm transport",
}

# The plugin option device_name maps to, per te plugin.
_DEVICE_OPTION = {"rdma": "devices", "efa": "devices", "cxl": "device"}

# Mooncake environment variables with no te counterpart: logged once as ignored.
_ENV_IGNORED = {
    "MC_LEGACY_RPC_PORT_BINDING": "te binds the port given in local_hostname, else a free "
                                  "one (or one of MC_MIN_PRC_PORT..MC_MAX_PRC_PORT)",
    "MC_RDMA_BIND_ADDRESS": "te's rdma exchanges queue pairs through the control plane",
    "MC_CUSTOM_TOPO_JSON": "use the rdma option 'topology' (TE_MOONCAKE_TRANSPORT_OPTIONS)",
    "MC_TE_METRIC": "te has no metrics reporter",
    "MC_TE_METRIC_INTERVAL_SECONDS": "te has no metrics reporter",
    "MC_NUM_CQ_PER_CTX": "te's rdma uses one completion queue per device",
    "MC_NUM_COMP_CHANNELS_PER_CTX": "te's rdma polls its completion queues",
    "MC_IB_PCI_RELAXED_ORDERING": "no te counterpart",
    "MC_MAX_EP_PER_CTX": "no te counterpart",
    "MC_MAX_SGE": "no te counterpart",
    "MC_MAX_INLINE": "no te counterpart",
    "MC_WORKERS_PER_CTX": "no te counterpart (transfer.worker_threads is te's own)",
    "MC_LOG_DIR": "te's log lines go to Python logging (logger te.compat.mooncake)",
    "MC_DISABLE_METACACHE": "a descriptor is fetched again when a request falls outside it",
    "MC_HANDSHAKE_LISTEN_BACKLOG": "no te counterpart",
    "MC_FRAGMENT_RATIO": "no te counterpart",
    "MC_ENABLE_DEST_DEVICE_AFFINITY": "no te counterpart",
    "MC_ENABLE_PARALLEL_REG_MR": "no te counterpart",
    "MC_PATH_ROUNDROBIN": "no te counterpart",
    "MC_ENDPOINT_STORE_TYPE": "no te counterpart",
    "MC_TCP_ENABLE_CONNECTION_POOL": "te's tcp keeps 'lanes' connections per peer",
    "MC_FORCE_TCP": "the protocol given to initialize() decides",
    "MC_FORCE_HCA": "the protocol given to initialize() decides",
    "MC_FORCE_MNNVL": "the protocol given to initialize() decides",
    "MC_INTRA_NVLINK": "the protocol given to initialize() decides",
    "MC_USE_TENT": "te is neither of Mooncake's backends",
    "MC_USE_TEV1": "te is neither of Mooncake's backends",
}

# te log level -> Python logging level.
_LOG_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG,
               4: logging.DEBUG}
# MC_LOG_LEVEL (glog names) -> te log.level.
_MC_LOG_LEVELS = {"TRACE": "trace", "DEBUG": "debug", "INFO": "info", "WARNING": "warn",
                  "WARN": "warn", "ERROR": "error", "FATAL": "error"}


class UnsupportedError(NotImplementedError):
    """A documented Mooncake feature that te cannot honour; raised, never silently
    replaced by something else. ``method`` names the method, ``reason`` says why."""

    def __init__(self, method: str, reason: str) -> None:
        self.method = method
        self.reason = reason
        super().__init__(f"{method}: not supported on te: {reason}")


class ErrorInfo(NamedTuple):
    """The last failure of a TransferEngine method on this thread."""

    method: str  #: the Mooncake method that failed
    code: int  #: what it returned (Mooncake's failure value)
    status: int  #: te's status (te.Status value)
    status_name: str  #: e.g. "TE_ERR_NOT_REGISTERED"
    detail: str  #: te's detail text: what failed, where and why

    def __str__(self) -> str:
        return f"{self.method}: {self.status_name} ({int(self.status)}): {self.detail}"


def _status_name(status: int) -> str:
    try:
        return "TE_OK" if status == 0 else "TE_ERR_" + te.Status(status).name
    except ValueError:
        return f"TE_ERR({status})"


class TransferOpcode(enum.IntEnum):
    """Mooncake's TransferOpcode (the same values as te.Op)."""

    READ = 0
    WRITE = 1


class TransferNotify:
    """A notification message: ``TransferNotify()`` or ``TransferNotify(name, msg)``."""

    __slots__ = ("name", "msg")

    def __init__(self, name: str = "", msg: str = "") -> None:
        self.name = name
        self.msg = msg

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, TransferNotify) and self.name == other.name
                and self.msg == other.msg)

    def __hash__(self) -> int:
        return hash((self.name, self.msg))


class _Invalid(Exception):
    """An argument the layer rejects itself, with the te status it maps to."""

    def __init__(self, detail: str, status: int = te.Status.INVALID_ARG) -> None:
        super().__init__(detail)
        self.status = status


# -- configuration ------------------------------------------------------------------------


class CompatConfig(NamedTuple):
    """What initialize() makes of its arguments and the environment (see build_config)."""

    template: str  #: engine YAML with ``{listen}`` for the control listener's address
    ports: List[int]  #: ports to try for the listener, in order (0: a free one)
    host: str  #: listener host (from local_hostname)
    p2p: bool  #: P2PHANDSHAKE: segments are named host:port
    protocol: str  #: Mooncake protocol
    transport: str  #: te plugin moving the bytes
    notes: List[str]  #: what was mapped, ignored or defaulted (logged at info level)

    def yaml(self, port: int) -> str:
        """The engine YAML for listener port ``port``."""
        return self.template.replace("{listen}", _q(_hostport(self.host, port)))


def _q(s: Any) -> str:
    """A YAML double-quoted scalar (JSON string syntax is valid YAML)."""
    return json.dumps(str(s))


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _split_hostname(s: str) -> Tuple[str, Optional[int]]:
    """local_hostname -> (host, port or None): host, host:port, [v6], [v6]:port, bare v6."""
    text = s.strip()
    port: Optional[str] = None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise _Invalid(f"local_hostname {s!r}: unterminated '[' (IPv6 as [addr]:port)")
        host, rest = text[1:end], text[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise _Invalid(f"local_hostname {s!r}: expected ':port' after ']'")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host = text  # a name, an IPv4 address or a bare IPv6 address
    if not host or any(c.isspace() for c in host):
        raise _Invalid(f"local_hostname {s!r}: no host (expected host or host:port)")
    if port is None:
        return host, None
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise _Invalid(f"local_hostname {s!r}: port {port!r} is not 0..65535")
    return host, int(port)


def _env_int(env: Mapping[str, str], key: str, lo: int, hi: int) -> Optional[int]:
    v = env.get(key)
    if v is None or v.strip() == "":
        return None
    try:
        i = int(v.strip())
    except ValueError:
        raise _Invalid(f"{key}={v!r} is not an integer", te.Status.CONFIG) from None
    if not lo <= i <= hi:
        raise _Invalid(f"{key}={i} is out of range {lo}..{hi}", te.Status.CONFIG)
    return i


def _metadata(server: str, mtype: Optional[str],
              env: Mapping[str, str]) -> Tuple[str, List[str]]:
    """metadata_server (and initialize_ext's metadata_type) -> (te metadata.type, endpoints)."""
    s = server.strip()
    if mtype:
        t = mtype.strip().lower()
        if t not in ("p2p", "etcd", "redis", "http"):
            raise _Invalid(f"metadata_type {mtype!r}: expected etcd, redis, http or p2p")
        if t == "p2p":
            if s not in ("", "P2PHANDSHAKE"):
                raise _Invalid(f"metadata_type p2p takes metadata_server 'P2PHANDSHAKE' or "
                               f"'', not {server!r}")
            return "p2p", []
        if not s:
            raise _Invalid(f"metadata_type {t} needs a metadata_server address")
        if "://" not in s:
            s = {"etcd": "etcd://", "redis": "redis://", "http": "http://"}[t] + s
        elif not s.lower().startswith(t):
            raise _Invalid(f"metadata_type {t} does not match metadata_server {server!r}")
    if not s:
        raise _Invalid("metadata_server is empty (give P2PHANDSHAKE, etcd://host:port, "
                       "redis://host:port or http://host:port/path, or set MC_METADATA_SERVER)")
    if s == "P2PHANDSHAKE":
        return "p2p", []
    low = s.lower()
    if low.startswith("etcd://"):
        hosts = [h.strip() for h in s[len("etcd://"):].split(",") if h.strip()]
        if not hosts:
            raise _Invalid(f"metadata_server {server!r}: no etcd host")
        return "etcd", [h if "://" in h else "http://" + h for h in hosts]
    if low.startswith("redis://"):
        return "redis", [_redis_url(s, env)]
    if low.startswith(("http://", "https://")):
        return "http", [s]
    if "://" in s:
        raise _Invalid(f"metadata_server {server!r}: unknown scheme (expected P2PHANDSHAKE, "
                       "etcd://, redis:// or http://)")
    # Mooncake: a bare "host:port[,host:port]" is etcd.
    return "etcd", ["http://" + h.strip() for h in s.split(",") if h.strip()]


def _redis_url(url: str, env: Mapping[str, str]) -> str:
    """MC_REDIS_PASSWORD and MC_REDIS_DB_INDEX folded into a redis:// URL lacking them."""
    parts = urllib.parse.urlsplit(url)
    netloc, path = parts.netloc, parts.path
    pw = env.get("MC_REDIS_PASSWORD")
    if pw and "@" not in netloc:
        netloc = ":" + urllib.parse.quote(pw, safe="") + "@" + netloc
    db = _env_int(env, "MC_REDIS_DB_INDEX", 0, 255)
    if db is not None and path in ("", "/"):
        path = f"/{db}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, path, parts.query, parts.fragment))


def _scan_options(text: str, what: str) -> List[Tuple[str, str]]:
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise _Invalid(f"{what}: {item!r} is not key=value", te.Status.CONFIG)
        out.append((k.strip(), v.strip()))
    return out


def _gpu_memory_kinds(transport: str) -> List[str]:
    """Memory-kind plugins loaded memory_only so GPU pointers can be registered with a
    network transport (te stages them), where this host has such a GPU."""
    kinds = []
    if transport != "nvlink" and os.path.exists("/dev/nvidiactl"):
        kinds.append("nvlink")
    if transport != "hip" and os.path.exists("/dev/kfd"):
        kinds.append("hip")
    return kinds


def build_config(local_hostname: str, metadata_server: str, protocol: str, device_name: str,
                 metadata_type: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None) -> CompatConfig:
    """Map initialize()'s arguments and Mooncake's environment variables to a te engine
    configuration (docs/mooncake-compat.md). Raises UnsupportedError for a protocol te has no
    transport for, _Invalid (with a te status) for bad input."""
    env = os.environ if env is None else env
    notes: List[str] = []
    host, port = _split_hostname(local_hostname)
    server = metadata_server if metadata_server.strip() else env.get("MC_METADATA_SERVER", "")
    mtype, endpoints = _metadata(server, metadata_type, env)
    p2p = mtype == "p2p"

    proto = protocol.strip().lower()
    if proto in _NO_TRANSPORT:
        raise UnsupportedError("initialize", f"protocol {protocol!r}: {_NO_TRANSPORT[proto]}")
    if proto not in _PROTOCOLS:
        raise _Invalid(f"protocol {protocol!r} is unknown (te maps: "
                       f"{', '.join(sorted(_PROTOCOLS))})")
    transport = _PROTOCOLS[proto]

    # Listener port: the one in local_hostname, else MC_MIN_PRC_PORT..MC_MAX_PRC_PORT, else 0.
    if port:
        ports = [port]
    else:
        lo = _env_int(env, "MC_MIN_PRC_PORT", 1, 65535)
        hi = _env_int(env, "MC_MAX_PRC_PORT", 1, 65535)
        if lo is None and hi is None:
            ports = [0]
        else:
            lo, hi = lo or 15000, hi or 17000
            if lo > hi:
                raise _Invalid(f"MC_MIN_PRC_PORT {lo} is above MC_MAX_PRC_PORT {hi}",
                               te.Status.CONFIG)
            ports = random.sample(range(lo, hi + 1), min(_PORT_TRIES, hi - lo + 1))

    y = ["engine:"]
    if not p2p:
        if any(c.isspace() for c in local_hostname.strip()):
            raise _Invalid(f"local_hostname {local_hostname!r} has blanks: it is the "
                           "segment name")
        y.append(f"  name: {_q(local_hostname.strip())}")
    y.append("  listen: {listen}")
    y += ["metadata:", f"  type: {mtype}"]
    if endpoints:
        y.append("  endpoints: [" + ", ".join(_q(e) for e in endpoints) + "]")

    transfer = []
    t = _env_int(env, "MC_TRANSFER_TIMEOUT", 1, 86400)
    if t is not None:
        transfer.append(f"  timeout_ms: {t * 1000}")
    r = _env_int(env, "MC_RETRY_CNT", 0, 100)
    if r is not None:
        transfer.append(f"  retries: {r}")
    s = _env_int(env, "MC_SLICE_SIZE", 0, 1 << 30)
    if s is not None:
        transfer.append(f"  slice_size: {s}")
    if transfer:
        y += ["transfer:"] + transfer

    lvl = env.get("MC_LOG_LEVEL", "").strip().upper()
    if lvl:
        if lvl not in _MC_LOG_LEVELS:
            raise _Invalid(f"MC_LOG_LEVEL={lvl!r}: expected TRACE, INFO, WARNING or ERROR",
                           te.Status.CONFIG)
        y += ["log:", f"  level: {_MC_LOG_LEVELS[lvl]}"]

    hs = _env_int(env, "MC_HANDSHAKE_MAX_LENGTH", 64 << 10, 1 << 30)
    if hs is not None:
        y += ["control:", f"  max_frame: {hs}"]

    secret = env.get("TE_MOONCAKE_SECRET_FILE", "").strip()
    if secret:
        y += ["auth:", f"  secret_file: {_q(secret)}"]

    # The transport and its options.
    opts: List[Tuple[str, Any]] = []
    devices = [d.strip() for d in device_name.split(",") if d.strip()]
    if transport == "tcp":
        bind = env.get("MC_TCP_BIND_ADDRESS", "").strip() or host
        opts.append(("bind", bind))
    if transport == "rdma":
        if not devices and env.get("MC_TE_FILTERS", "").strip():
            devices = [d.strip() for d in env["MC_TE_FILTERS"].split(",") if d.strip()]
        ib_port = _env_int(env, "MC_IB_PORT", 1, 255)
        if ib_port is not None and devices:
            devices = [d if ":" in d else f"{d}:{ib_port}" for d in devices]
        # te's rdma ranges, so that a bad value is reported under its variable's name
        for key, opt, lo, hi in (("MC_GID_INDEX", "gid_index", 0, 65535),
                                 ("MC_MTU", "mtu", 256, 4096),
                                 ("MC_NUM_QP_PER_EP", "qp_per_peer", 1, 16),
                                 ("MC_MAX_WR", "qp_depth", 1, 8192),
                                 ("MC_MAX_CQE_PER_CTX", "cq_depth", 16, 1048576)):
            v = _env_int(env, key, lo, hi)
            if v is not None:
                if opt == "mtu" and v not in (256, 512, 1024, 2048, 4096):
                    raise _Invalid(f"MC_MTU={v}: expected 256, 512, 1024, 2048 or 4096",
                                   te.Status.CONFIG)
                # gid_index is a string option (N, or dev:N pairs)
                opts.append((opt, str(v) if opt == "gid_index" else v))
        tc = _env_int(env, "MC_IB_TC", -1, 255)
        if tc is not None and tc >= 0:
            opts.append(("traffic_class", tc))
    if devices:
        opt = _DEVICE_OPTION.get(transport)
        if opt is None:
            notes.append(f"device_name {device_name!r} is not used by protocol {proto} "
                         "(as in Mooncake, it selects RDMA/EFA NICs)")
        elif transport == "cxl":
            if len(devices) != 1:
                raise _Invalid(f"protocol cxl takes one DAX device or window file as "
                               f"device_name, got {device_name!r}")
            opts.append(("device", devices[0]))
        else:
            opts.append((opt, ",".join(devices)))
    elif transport == "cxl":
        raise _Invalid("protocol cxl on te needs the shared window: give its DAX device or "
                       "file (e.g. /dev/dax0.0) as device_name (te's cxl option 'device')",
                       te.Status.CONFIG)
    extra = env.get("TE_MOONCAKE_TRANSPORT_OPTIONS", "")
    if extra.strip():
        given = dict(_scan_options(extra, "TE_MOONCAKE_TRANSPORT_OPTIONS"))
        opts = [(k, v) for k, v in opts if k not in given] + list(given.items())

    y += ["transports:", f"  - name: {transport}", "    required: true"]
    if opts:
        rendered = ", ".join(f"{k}: {v if isinstance(v, int) else _q(v)}" for k, v in opts)
        y.append(f"    options: {{{rendered}}}")
    for kind in _gpu_memory_kinds(transport):
        y += [f"  - name: {kind}", "    required: false", "    memory_only: true"]
        notes.append(f"{kind} loaded memory_only (optional): GPU memory can be registered")

    for key in sorted(_ENV_IGNORED):
        if env.get(key, "").strip():
            notes.append(f"{key} is ignored on te: {_ENV_IGNORED[key]}")
    return CompatConfig("\n".join(y) + "\n", ports, host, p2p, proto, transport, notes)


# -- the engine ---------------------------------------------------------------------------


def _te_log(level: int, msg: str) -> None:
    log.log(_LOG_LEVELS.get(int(level), logging.DEBUG), "te: %s", msg)


def _api(fail: int = FAILED, method: Optional[str] = None) -> Callable:
    """Turn te errors and rejected arguments into Mooncake's failure value ``fail``, with
    the detail kept for last_error() and logged at warning level (as ``method``, default
    the function's name)."""

    def deco(fn: Callable) -> Callable:
        name = method or fn.__name__

        @functools.wraps(fn)
        def wrapper(self: "TransferEngine", *args: Any, **kw: Any) -> Any:
            try:
                return fn(self, *args, **kw)
            except UnsupportedError:
                raise
            except te.Error as e:
                detail = e.detail if e.task is None else f"task {e.task}: {e.detail}"
                return self._fail(name, fail, int(e.status), detail)
            except _Invalid as e:
                return self._fail(name, fail, e.status, str(e))
            except TypeError as e:
                if e.__traceback__ is not None and e.__traceback__.tb_next is None:
                    raise  # the call itself: wrong number or names of arguments
                return self._fail(name, fail, te.Status.INVALID_ARG, str(e))
            except (ValueError, OverflowError, MemoryError, OSError) as e:
                return self._fail(name, fail, te.Status.INVALID_ARG, f"{type(e).__name__}: {e}")
        return wrapper
    return deco


def _int(v: Any, what: str, lo: int = 0, hi: int = _U64) -> int:
    if type(v) is not int:
        if isinstance(v, bool):
            raise _Invalid(f"{what} must be an integer, not bool")
        try:
            v = operator.index(v)
        except TypeError:
            raise _Invalid(f"{what} must be an integer, not {type(v).__name__}") from None
    if not lo <= v < hi:
        raise _Invalid(f"{what} {v} is out of range {lo}..{hi - 1}",
                       te.Status.OUT_OF_RANGE if "length" in what or "capacit" in what
                       else te.Status.INVALID_ARG)
    return v


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise _Invalid(f"{what} must be a str, not {type(v).__name__}")
    return v


def _ints(v: Any, what: str) -> List[int]:
    if isinstance(v, (str, bytes, bytearray)) or not hasattr(v, "__len__"):
        raise _Invalid(f"{what} must be a list of integers, not {type(v).__name__}")
    out = v if type(v) is list else list(v)
    try:  # fast path: plain ints in range
        if out and (min(out) < 0 or max(out) >= _U64):
            raise ValueError
        if all(type(x) is int for x in out):
            return out
    except (TypeError, ValueError):
        pass
    return [_int(x, f"{what}[{i}]") for i, x in enumerate(out)]


class _Async(NamedTuple):
    batch: te.Batch
    method: str


class TransferEngine:
    """Mooncake's ``mooncake.engine.TransferEngine`` on a te engine. See the module
    docstring and docs/mooncake-compat.md."""

    def __init__(self) -> None:
        self._te: Optional[te.Engine] = None
        self._lock = threading.Lock()
        self._tls = threading.local()
        self._segments: Dict[str, te.Segment] = {}
        self._regs: Dict[int, te.Registration] = {}
        self._managed: Dict[int, te.Allocation] = {}
        self._regions: List[Tuple[int, int]] = []  # sorted (addr, end): registered + managed
        self._async: Dict[int, _Async] = {}
        self._config: Optional[CompatConfig] = None
        self._rpc_port = -1
        self._local_names: Tuple[str, ...] = ()
        #: The te engine YAML initialize() used (None before).
        self.te_config: Optional[str] = None

    def __repr__(self) -> str:
        if self._te is None:
            return "<mooncake.engine.TransferEngine (te) not initialized>"
        return (f"<mooncake.engine.TransferEngine (te) {self._te.name} "
                f"{self._config.protocol if self._config else '?'}>")

    # -- errors -------------------------------------------------------------------------

    def _fail(self, method: str, code: int, status: int, detail: str) -> int:
        info = ErrorInfo(method, code, int(status), _status_name(int(status)), detail)
        self._tls.error = info
        log.warning("%s", info)
        return code

    def last_error(self) -> str:
        """te's detail of the last failure of a method on this thread, as
        "method: TE_ERR_NAME (status): detail"; "" if none. Not reset by successes."""
        info = getattr(self._tls, "error", None)
        return str(info) if info is not None else ""

    def last_error_info(self) -> Optional[ErrorInfo]:
        """The last failure on this thread as an ErrorInfo (method, code, status,
        status_name, detail), or None."""
        return getattr(self._tls, "error", None)

    @property
    def te_engine(self) -> Optional[te.Engine]:
        """(te extension) The te.Engine underneath; None before initialize()."""
        return self._te

    def _engine(self, method: str) -> te.Engine:
        e = self._te
        if e is None:
            raise _Invalid("the engine is not initialized (call initialize() first)",
                           te.Status.INVALID_HANDLE)
        return e

    # -- initialization -----------------------------------------------------------------

    @_api()
    def initialize(self, local_hostname: str, metadata_server: str, protocol: str,
                   device_name: str) -> int:
        """Create the te engine. Returns 0, or -1 (see last_error())."""
        return self._initialize("initialize", local_hostname, metadata_server, protocol,
                                device_name, None)

    @_api()
    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str,
                       device_name: str, metadata_type: str) -> int:
        """initialize() with the metadata type given (etcd, redis, http, p2p)."""
        return self._initialize("initialize_ext", local_hostname, metadata_server, protocol,
                                device_name, _str(metadata_type, "metadata_type"))

    def _initialize(self, method: str, local_hostname: Any, metadata_server: Any,
                    protocol: Any, device_name: Any, metadata_type: Optional[str]) -> int:
        lh = _str(local_hostname, "local_hostname")
        ms = _str(metadata_server, "metadata_server")
        pr = _str(protocol, "protocol")
        dn = "" if device_name is None else _str(device_name, "device_name")
        with self._lock:
            if self._te is not None:
                raise _Invalid(f"already initialized (segment {self._te.name})",
                               te.Status.EXISTS)
            cfg = build_config(lh, ms, pr, dn, metadata_type)
            for note in cfg.notes:
                log.info("%s: %s", method, note)
            engine = None
            for i, port in enumerate(cfg.ports):
                text = cfg.yaml(port)
                try:
                    engine = te.Engine(yaml=text, name=f"<mooncake {method}()>", log=_te_log)
                    break
                except te.Error as e:
                    if i + 1 < len(cfg.ports) and "in use" in e.detail:
                        continue
                    raise
            assert engine is not None
            try:
                rpc = json.loads(engine.export_segment()).get("rpc", "")
                self._rpc_port = int(str(rpc).rsplit(":", 1)[1])
            except (te.Error, ValueError, IndexError):
                engine.close()
                raise
            self._te = engine
            self._config = cfg
            self.te_config = text
            names = {engine.name, _hostport(cfg.host, self._rpc_port), lh.strip()}
            self._local_names = tuple(names)
        log.info("%s: te engine %s (listener port %d, %s over %s)", method, engine.name,
                 self._rpc_port, cfg.protocol, cfg.transport)
        return OK

    def get_rpc_port(self) -> int:
        """The port of te's control listener: P2PHANDSHAKE segments are named
        f"{local_hostname}:{get_rpc_port()}". -1 before initialize()."""
        if self._te is None:
            return self._fail("get_rpc_port", FAILED, te.Status.INVALID_HANDLE,
                              "the engine is not initialized")
        return self._rpc_port

    def get_engine(self) -> Any:
        """Mooncake Store's inner engine: not available on te."""
        raise UnsupportedError("get_engine", "there is no Mooncake InnerTransferEngine (or "
                               "Mooncake Store) on te; use the te_engine property for te's")

    def get_local_topology(self, device_name: Optional[str] = None) -> str:
        """Mooncake's NIC priority matrix: not available on te."""
        raise UnsupportedError("get_local_topology", "te has no NIC priority matrix; "
                               "`te-info PLUGIN` lists a transport's devices")

    def close(self) -> None:
        """(te extension) Cancel what is in flight and free the te engine; idempotent."""
        with self._lock:
            e, self._te = self._te, None
            self._segments.clear()
            self._regs.clear()
            self._managed.clear()
            self._regions = []
            self._async.clear()
        if e is not None:
            e.close()

    # -- memory -------------------------------------------------------------------------

    def _add_region(self, addr: int, length: int) -> None:
        bisect.insort(self._regions, (addr, addr + length))

    def _drop_region(self, addr: int, length: int) -> None:
        try:
            self._regions.remove((addr, addr + length))
        except ValueError:
            pass

    def _in_region(self, addr: int, length: int) -> bool:
        i = bisect.bisect_right(self._regions, (addr, _U64 + 1)) - 1
        return i >= 0 and self._regions[i][0] <= addr and addr + length <= self._regions[i][1]

    @_api()
    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        """Register [buffer_addr, +capacity) for local use and remote READ/WRITE; location
        "*" (detected), "cpu:N", "cuda:N"... Returns 0 or -1."""
        return self._register("register_memory", [buffer_addr], [capacity], location)

    @_api()
    def batch_register_memory(self, buffer_addresses: List[int], capacities: List[int],
                              location: str = "*") -> int:
        """Register several regions; all or none (those done are undone on a failure)."""
        return self._register("batch_register_memory", buffer_addresses, capacities,
                              location)

    def _register(self, method: str, addrs: Any, lengths: Any, location: Any) -> int:
        engine = self._engine(method)
        a = _ints(addrs, "buffer_addresses")
        n = _ints(lengths, "capacities")
        loc = _str(location, "location")
        if len(a) != len(n):
            raise _Invalid(f"{len(a)} addresses but {len(n)} capacities")
        if not a:
            raise _Invalid("no region to register")
        for i, (addr, length) in enumerate(zip(a, n)):
            if addr == 0 or length == 0:
                raise _Invalid(f"region {i}: address 0x{addr:x} length {length}: both must be "
                               "nonzero")
        done: List[te.Registration] = []
        try:
            for addr, length in zip(a, n):
                reg = engine.register(addr, length, location=None if loc in ("*", "") else loc,
                                      access=te.Access.REMOTE)
                done.append(reg)
                with self._lock:
                    self._regs[addr] = reg
                    self._add_region(addr, length)
        except BaseException:
            for reg in done:
                with self._lock:
                    self._regs.pop(reg.addr, None)
                    self._drop_region(reg.addr, reg.length)
                try:
                    reg.unregister()
                except te.Error:
                    pass
            raise
        return OK

    @_api()
    def unregister_memory(self, buffer_addr: int) -> int:
        """Unregister the region registered at buffer_addr. Returns 0 or -1."""
        return self._unregister("unregister_memory", [buffer_addr])

    @_api()
    def batch_unregister_memory(self, buffer_addresses: List[int]) -> int:
        """Unregister several regions; goes on past a failure and returns -1 if any failed."""
        return self._unregister("batch_unregister_memory", buffer_addresses)

    def _unregister(self, method: str, addrs: Any) -> int:
        self._engine(method)
        a = _ints(addrs, "buffer_addresses")
        first: Optional[Exception] = None
        for addr in a:
            with self._lock:
                reg = self._regs.get(addr)
            try:
                if reg is None:
                    raise _Invalid(f"0x{addr:x} is not the start of a region registered with "
                                   "register_memory()", te.Status.NOT_REGISTERED)
                reg.unregister()
                with self._lock:
                    self._regs.pop(addr, None)
                    self._drop_region(addr, reg.length)
            except (te.Error, _Invalid) as e:
                if first is None:
                    first = e
        if first is not None:
            raise first
        return OK

    def _managed_location(self) -> str:
        loc = os.environ.get("TE_MOONCAKE_MANAGED_LOCATION", "").strip()
        if loc:
            return loc
        t = self._config.transport if self._config else "tcp"
        return {"nvlink": "cuda:0", "hip": "hip:0"}.get(t, "cpu")

    @_api(fail=0)
    def allocate_managed_buffer(self, length: int) -> int:
        """Allocate and register ``length`` bytes (host memory; cuda:0 / hip:0 for the
        nvlink / hip protocols). Returns its address, or 0 on failure."""
        engine = self._engine("allocate_managed_buffer")
        n = _int(length, "length", 1)
        a = engine.alloc(n, self._managed_location(), access=te.Access.REMOTE)
        with self._lock:
            self._managed[a.addr] = a
            self._add_region(a.addr, a.length)
        return a.addr

    @_api()
    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        """Free a buffer of allocate_managed_buffer(); ``length`` must be the one
        allocated. Returns 0 or -1."""
        self._engine("free_managed_buffer")
        addr = _int(buffer_addr, "buffer_addr")
        n = _int(length, "length")
        with self._lock:
            a = self._managed.get(addr)
        if a is None:
            raise _Invalid(f"0x{addr:x} is not a buffer of allocate_managed_buffer()",
                           te.Status.NOT_FOUND)
        if n != a.length:
            raise _Invalid(f"0x{addr:x} was allocated with {a.length} bytes, not {n}",
                           te.Status.OUT_OF_RANGE)
        a.free()
        with self._lock:
            self._managed.pop(addr, None)
            self._drop_region(addr, a.length)
        return OK

    @_api()
    def write_bytes_to_buffer(self, dest_address: int, src_ptr: bytes, length: int) -> int:
        """Copy the first ``length`` bytes of ``src_ptr`` to dest_address (inside memory
        registered or allocated through this engine; device memory too). Returns 0 or -1."""
        engine = self._engine("write_bytes_to_buffer")
        dst = _int(dest_address, "dest_address")
        n = _int(length, "length")
        try:
            src = memoryview(src_ptr).cast("B")
        except TypeError:
            raise _Invalid(f"src_ptr must be bytes-like, not {type(src_ptr).__name__}") from None
        if n > src.nbytes:
            raise _Invalid(f"length {n} is over the {src.nbytes} bytes given",
                           te.Status.OUT_OF_RANGE)
        if n == 0:
            return OK
        if not self._in_region(dst, n):
            raise _Invalid(f"[0x{dst:x}, +{n}) is not inside memory registered or allocated "
                           "through this engine", te.Status.NOT_REGISTERED)
        engine.copy(dst, src[:n], n)
        return OK

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        """``length`` bytes at source_address (inside memory registered or allocated through
        this engine; device memory too). Raises RuntimeError with te's detail on failure."""
        out = self._read_bytes(source_address, length)
        if isinstance(out, int):
            raise RuntimeError(self.last_error())
        return out

    @_api(method="read_bytes_from_buffer")
    def _read_bytes(self, source_address: Any, length: Any) -> Any:
        engine = self._engine("read_bytes_from_buffer")
        src = _int(source_address, "source_address")
        n = _int(length, "length")
        if n == 0:
            return b""
        if not self._in_region(src, n):
            raise _Invalid(f"[0x{src:x}, +{n}) is not inside memory registered or allocated "
                           "through this engine", te.Status.NOT_REGISTERED)
        out = bytearray(n)
        engine.copy(out, src, n)
        return bytes(out)

    # -- segments -----------------------------------------------------------------------

    def _segment(self, name: Any) -> int:
        seg = self._segments.get(name)
        if seg is not None:
            return seg.id
        if not isinstance(name, str) or not name:
            raise _Invalid(f"target_hostname must be a non-empty str (a segment name), not "
                           f"{name!r}")
        engine = self._engine("open_segment")
        with self._lock:
            seg = self._segments.get(name)
            if seg is None:
                seg = engine.open_segment(name)
                self._segments[name] = seg
        return seg.id

    @_api(fail=0)
    def get_first_buffer_address(self, segment_name: str) -> int:
        """The lowest address among the buffers segment_name registered (0 if none or on
        failure)."""
        engine = self._engine("get_first_buffer_address")
        name = _str(segment_name, "segment_name")
        if name in self._local_names:
            bufs = engine.buffers(te.SEGMENT_LOCAL)
        else:
            seg = self._segment(name)
            bufs = engine.buffers(seg)
            if not bufs and self._refresh(name):  # opened before the peer registered
                bufs = engine.buffers(self._segment(name))
        if not bufs:
            raise _Invalid(f"segment {name} has no registered buffers", te.Status.NOT_FOUND)
        return bufs[0].addr

    @_api()
    def send_probe(self, peer_server_name: str) -> int:
        """0 if the engine serving peer_server_name answers within 3 s, else -1."""
        engine = self._engine("send_probe")
        engine.probe(_str(peer_server_name, "peer_server_name"), _PROBE_TIMEOUT_S)
        return OK

    # -- transfers ----------------------------------------------------------------------

    def _requests(self, op: int, target: Any, buffers: Any, peers: Any, lengths: Any,
                  hint: Any, method: str) -> List[Tuple[int, int, int, int, int]]:
        if hint:
            cfg = self._config
            if cfg is None or hint not in (cfg.protocol, cfg.transport):
                raise UnsupportedError(method, f"transport_hint {hint!r}: te cannot pin a "
                                       "request to a transport; this engine moves bytes over "
                                       f"{cfg.transport if cfg else '(not initialized)'} only")
        seg = self._segment(target)
        b = _ints(buffers, "buffers")
        p = _ints(peers, "peer_buffer_addresses")
        n = _ints(lengths, "lengths")
        if not len(b) == len(p) == len(n):
            raise _Invalid(f"{len(b)} buffers, {len(p)} peer addresses and {len(n)} lengths: "
                           "the lists must be as long")
        if not b:
            raise _Invalid("no transfer requested (empty lists)")
        return [(op, seg, x, y, z) for x, y, z in zip(b, p, n)]

    def _refresh(self, name: str) -> bool:
        """Drop the cached view of segment ``name`` so that the next open fetches its
        descriptor again (buffers the peer registered since). False if it is in use."""
        with self._lock:
            old = self._segments.pop(name, None)
            if old is None:
                return False
            try:
                old.close()
            except te.Error:
                self._segments[name] = old  # a live batch uses it: keep it
                return False
        return True

    def _sync(self, method: str, op: int, target: Any, buffers: Any, peers: Any, lengths: Any,
              hint: Any, notify: Any = None) -> int:
        engine = self._engine(method)
        reqs = self._requests(op, target, buffers, peers, lengths, hint, method)
        msg = None if notify is None else _notify_bytes(notify)
        # No retry here: te_batch_submit itself fetches the peer's descriptor again when a
        # request falls outside the cached one, and a retry could run accepted requests twice.
        engine.transfer(reqs, notify=msg)
        return OK

    @_api()
    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                            length: int, transport_hint: str = "") -> int:
        """WRITE [buffer, +length) to peer_buffer_address of segment target_hostname and
        wait. Returns 0 or -1."""
        return self._sync("transfer_sync_write", 1, target_hostname, [buffer],
                          [peer_buffer_address], [length], transport_hint)

    @_api()
    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                           length: int, transport_hint: str = "") -> int:
        """READ [peer_buffer_address, +length) of segment target_hostname into buffer and
        wait. Returns 0 or -1."""
        return self._sync("transfer_sync_read", 0, target_hostname, [buffer],
                          [peer_buffer_address], [length], transport_hint)

    @_api()
    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                      length: int, opcode: TransferOpcode,
                      notify: Optional[TransferNotify] = None, transport_hint: str = "") -> int:
        """One READ or WRITE, waited for; ``notify`` reaches the target's get_notifies()
        once the transfer completed. Returns 0 or -1."""
        return self._sync("transfer_sync", _opcode(opcode), target_hostname, [buffer],
                          [peer_buffer_address], [length], transport_hint, notify)

    @_api()
    def batch_transfer_sync_write(self, target_hostname: str, buffers: List[int],
                                  peer_buffer_addresses: List[int], lengths: List[int],
                                  transport_hint: str = "") -> int:
        """WRITE each buffers[i] to peer_buffer_addresses[i] as one te batch and wait.
        Returns 0, or -1 if any request failed."""
        return self._sync("batch_transfer_sync_write", 1, target_hostname, buffers,
                          peer_buffer_addresses, lengths, transport_hint)

    @_api()
    def batch_transfer_sync_read(self, target_hostname: str, buffers: List[int],
                                 peer_buffer_addresses: List[int], lengths: List[int],
                                 transport_hint: str = "") -> int:
        """READ each peer_buffer_addresses[i] into buffers[i] as one te batch and wait.
        Returns 0, or -1 if any request failed."""
        return self._sync("batch_transfer_sync_read", 0, target_hostname, buffers,
                          peer_buffer_addresses, lengths, transport_hint)

    @_api()
    def batch_transfer_sync(self, target_hostname: str, buffers: List[int],
                            peer_buffer_addresses: List[int], lengths: List[int],
                            opcode: TransferOpcode, notify: Optional[TransferNotify] = None,
                            transport_hint: str = "") -> int:
        """batch_transfer_sync_read/write with the opcode given, and an optional notify
        delivered once every request completed. Returns 0 or -1."""
        return self._sync("batch_transfer_sync", _opcode(opcode), target_hostname, buffers,
                          peer_buffer_addresses, lengths, transport_hint, notify)

    def _submit(self, method: str, op: int, target: Any, buffers: Any, peers: Any,
                lengths: Any, hint: Any) -> int:
        engine = self._engine(method)
        reqs = self._requests(op, target, buffers, peers, lengths, hint, method)
        batch = engine.batch(len(reqs))
        try:
            batch.submit(reqs)  # fetches a newer descriptor itself when needed (see _sync)
        except BaseException:
            batch.close()
            raise
        with self._lock:
            self._async[batch.id] = _Async(batch, method)
        return batch.id

    @_api(fail=0)
    def transfer_submit_write(self, target_hostname: str, buffer: int,
                              peer_buffer_address: int, length: int,
                              transport_hint: str = "") -> int:
        """Start one WRITE; returns its batch id (for transfer_check_status), 0 on failure."""
        return self._submit("transfer_submit_write", 1, target_hostname, [buffer],
                            [peer_buffer_address], [length], transport_hint)

    @_api(fail=0)
    def batch_transfer_async_write(self, target_hostname: str, buffers: List[int],
                                   peer_buffer_addresses: List[int], lengths: List[int],
                                   transport_hint: str = "") -> int:
        """Start a batch of WRITEs; returns its batch id, 0 on failure."""
        return self._submit("batch_transfer_async_write", 1, target_hostname, buffers,
                            peer_buffer_addresses, lengths, transport_hint)

    @_api(fail=0)
    def batch_transfer_async_read(self, target_hostname: str, buffers: List[int],
                                  peer_buffer_addresses: List[int], lengths: List[int],
                                  transport_hint: str = "") -> int:
        """Start a batch of READs; returns its batch id, 0 on failure."""
        return self._submit("batch_transfer_async_read", 0, target_hostname, buffers,
                            peer_buffer_addresses, lengths, transport_hint)

    @_api(fail=0)
    def batch_transfer_async(self, target_hostname: str, buffers: List[int],
                             peer_buffer_addresses: List[int], lengths: List[int],
                             opcode: TransferOpcode, transport_hint: str = "") -> int:
        """Start a batch of READs or WRITEs; returns its batch id, 0 on failure."""
        return self._submit("batch_transfer_async", _opcode(opcode), target_hostname,
                            buffers, peer_buffer_addresses, lengths, transport_hint)

    def _finish(self, bid: int, entry: _Async) -> Optional[Tuple[int, int, str]]:
        """Free a terminal batch; None if every task completed, else (code, status,
        detail) of its first failure (code -2 when a task timed out)."""
        batch = entry.batch
        st = batch.status()
        failure = None
        if st.completed != st.tasks:
            code = TIMED_OUT if st.timed_out else FAILED
            failure = (code, te.Status.INTERNAL, f"{st.tasks - st.completed} of {st.tasks} "
                       "tasks did not complete")
            for t in batch.tasks():
                if not t.ok:
                    failure = (code, int(t.status), f"task {t.index}: {t.detail}")
                    break
        with self._lock:
            self._async.pop(bid, None)
        try:
            batch.free()
        except te.Error:
            pass
        return failure

    def _lookup(self, method: str, batch_id: Any) -> Tuple[int, _Async]:
        bid = _int(batch_id, "batch_id")
        with self._lock:
            entry = self._async.get(bid)
        if entry is None:
            raise _Invalid(f"batch id {bid} is unknown: not returned by an async submit, or "
                           "already reported complete (a batch id is released once its "
                           "final state is reported)", te.Status.INVALID_HANDLE)
        return bid, entry

    @_api()
    def transfer_check_status(self, batch_id: int) -> int:
        """1: completed (the batch id is then released), 0: in progress, -1: failed,
        -2: timed out (released too)."""
        self._engine("transfer_check_status")
        bid, entry = self._lookup("transfer_check_status", batch_id)
        if not entry.batch.wait(0, check=False):
            return IN_PROGRESS
        failure = self._finish(bid, entry)
        if failure is None:
            return COMPLETED
        return self._fail("transfer_check_status", failure[0], failure[1], failure[2])

    @_api()
    def get_batch_transfer_status(self, batch_ids: List[int]) -> int:
        """Wait for every batch id; 0 if all completed, -1 if any failed or timed out (or
        is unknown). The batch ids are released."""
        self._engine("get_batch_transfer_status")
        ids = _ints(batch_ids, "batch_ids")
        first: Optional[Tuple[int, int, str]] = None
        for i in ids:
            try:
                bid, entry = self._lookup("get_batch_transfer_status", i)
            except _Invalid as e:
                first = first or (FAILED, e.status, str(e))
                continue
            entry.batch.wait(None, check=False)
            failure = self._finish(bid, entry)
            if failure is not None and first is None:
                first = (FAILED, failure[1], f"batch {bid}: {failure[2]}")
        if first is not None:
            return self._fail("get_batch_transfer_status", FAILED, first[1], first[2])
        return OK

    # -- CUDA-stream variants: not on te ------------------------------------------------

    _CUDA_WHY = ("te has no CUDA-stream-ordered transfers (no cudaLaunchHostFunc hook); "
                 "synchronize the stream, then use the sync or async calls")

    def transfer_write_on_cuda(self, *args: Any, **kw: Any) -> None:
        raise UnsupportedError("transfer_write_on_cuda", self._CUDA_WHY)

    def transfer_read_on_cuda(self, *args: Any, **kw: Any) -> None:
        raise UnsupportedError("transfer_read_on_cuda", self._CUDA_WHY)

    def batch_transfer_write_on_cuda(self, *args: Any, **kw: Any) -> None:
        raise UnsupportedError("batch_transfer_write_on_cuda", self._CUDA_WHY)

    def batch_transfer_read_on_cuda(self, *args: Any, **kw: Any) -> None:
        raise UnsupportedError("batch_transfer_read_on_cuda", self._CUDA_WHY)

    # -- notifications ------------------------------------------------------------------

    def get_notifies(self) -> List[TransferNotify]:
        """Notifications received since the last call, oldest first ([] on failure)."""
        out = self._get_notifies()
        return out if isinstance(out, list) else []

    @_api(method="get_notifies")
    def _get_notifies(self) -> Any:
        engine = self._engine("get_notifies")
        out: List[TransferNotify] = []
        while True:
            got = engine.recv_notify(64)
            for n in got:
                out.append(_notify_from(n.sender, n.message))
            if len(got) < 64:
                return out


def _opcode(v: Any) -> int:
    try:
        return int(TransferOpcode(_int(v, "opcode", 0, 2)))
    except ValueError:
        raise _Invalid(f"opcode {v!r}: expected TransferOpcode.READ or WRITE") from None


def _notify_bytes(n: Any) -> bytes:
    if not isinstance(n, TransferNotify):
        raise _Invalid(f"notify must be a TransferNotify, not {type(n).__name__}")
    if not isinstance(n.name, str) or not isinstance(n.msg, str):
        raise _Invalid("TransferNotify name and msg must be str")
    return _NOTIFY_TAG + json.dumps({"name": n.name, "msg": n.msg}).encode()


def _notify_from(sender: str, message: bytes) -> TransferNotify:
    if message.startswith(_NOTIFY_TAG):
        try:
            d = json.loads(message[len(_NOTIFY_TAG):])
            return TransferNotify(str(d["name"]), str(d["msg"]))
        except (ValueError, KeyError, TypeError):
            pass
    return TransferNotify(sender, message.decode("utf-8", "replace"))


# -- compile-time feature attributes (here: whether te's plugin can be found) --------------

_FEATURES = {
    "SUPPORT_CUDA": "nvlink",
    "SUPPORT_MNNVL": "nvlink",
    "SUPPORT_INTRA_NVLINK": "nvlink",
    "SUPPORT_EFA": "efa",
    "SUPPORT_HIP": "hip",
    "SUPPORT_MUSA": None,
}


def _plugin_found(name: str) -> bool:
    dirs = [d for d in os.environ.get("TE_PLUGIN_PATH", "").split(":") if d]
    try:
        libdir = os.path.dirname(te.library_path())
        dirs.append(os.path.join(libdir, "te", "plugins-1"))
    except OSError:
        pass
    for d in dirs:
        if os.path.isfile(os.path.join(d, f"{name}.so")) or \
                os.path.isfile(os.path.join(d, name, f"{name}.so")):
            return True
    return False


def __getattr__(name: str) -> Any:
    if name in _FEATURES:
        plugin = _FEATURES[name]
        return bool(plugin) and _plugin_found(plugin)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
