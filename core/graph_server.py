"""Where the graph is: a configured Neo4j, or the embedded ArcadeDB Bolt server.

The embedded server runs inside this Python process (JPype + the JRE bundled by
`arcadedb-embedded`), so it cannot outlive it: no orphan process after exit or Ctrl-C.
Its data lives under `<project-dir>/.saga/graph` and persists between runs.

ArcadeDB locks its database directory, so a second process on the same project must not
open it again: the owner writes `server.json` (pid, ports) and other processes connect
to that running server over Bolt instead. When the owner exits, its clients lose the graph
(`owner_gone` names that for them); `python -m kg serve` (`serve_embedded`) runs the graph
as a process of its own that outlives its clients, for batches of many processes.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import gc
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ConfigError, EmbeddedGraphError
from core.interrupt import end_by_signal_at_exit, stop_workers
from core.priority import lower_threads, process_threads
from core.settings import Settings

log = logging.getLogger("skald.graph")

EMBEDDED_DATABASE = "skald"


#: Where ArcadeDB keeps the graph's users and their password hashes.
GRAPH_USERS = Path("data") / "config" / "server-users.jsonl"
#: Free disk the embedded graph needs to start: ArcadeDB preallocates every type's and index's
#: files (a new project's schema took 23-25 MB, measured on a tmpfs), and a write that finds
#: the disk full fails with a message that does not say so.
GRAPH_MIN_FREE_MB = 64


def embedded_password_hint(root: Path) -> str:
    """What to do when an embedded graph's credentials.json is lost or not the graph's."""
    return (
        f"restore {root / 'credentials.json'}; or delete it and {root / GRAPH_USERS}, then run "
        "again: the graph takes a new password and keeps its data"
    )


EMBEDDED_USER = "root"
_JVM_HEAP = os.environ.get("SKALD_ARCADEDB_HEAP", "1g")
#: The heap the JVM starts with. G1 otherwise starts small and grows the heap step by step as
#: the graph is used, so a long-running sidecar's footprint drifts up for its first hours
#: (measured: the committed heap 147 -> 164 MB and rising over a 2,000-turn soak); from
#: 256 MB it does not need to grow for a sidecar's working set.
_JVM_INITIAL_HEAP = os.environ.get("SKALD_ARCADEDB_INITIAL_HEAP", "256m")


def credentials_hint(endpoint: GraphEndpoint) -> str:
    """What to check when a graph refuses the credentials it was given."""
    if endpoint.embedded and endpoint.root is not None:
        return embedded_password_hint(endpoint.root)
    return "check NEO4J_USERNAME / NEO4J_PASSWORD"


#: The JIT's first tier only (C1). The embedded graph's JVM runs short statements whose code
#: paths change with the workload, so C2 kept recompiling through a whole load run: its
#: compiler threads took 15-23% of the sidecar's CPU at 16 conversations (/proc per thread).
#: Measured with C1 only, back to back with the default (bench/sidecar_load.py's docstring):
#: CPU per turn 0.075-0.081 s against 0.090-0.091 at 16 conversations, commit p95 862-925 ms
#: against 974-1,010; the 2,000-turn soak 67 s against 84 s, its last 200 turns' p95 non-LLM
#: time 107 ms against 154. A user's own tier setting in ARCADEDB_JVM_ARGS wins.
JIT_TIER_ARGS = ("-XX:TieredStopAtLevel=1",)


#: The JVM leaves SIGTERM, SIGINT and SIGHUP to Python (-Xrs). Without it the JVM takes them
#: over at its start and JPype forwards them to Python from a JVM thread that holds no GIL
#: (PyErr_SetInterruptEx) and interrupts the Java thread that started the JVM. While Python's
#: SIGTERM handler was still the default that crashed the process (see `_signals_held`); in a
#: process whose graph started in another thread, a SIGTERM failed the start
#: (InterruptedException), did not end the process, and its exit then hung. Python's handlers
#: close the graph (atexit), which runs the JVM's shutdown hooks as before.
JVM_SIGNAL_ARGS = ("-Xrs",)

#: The variable arcadedb_embedded reads for the JVM's crash log (-XX:ErrorFile).
JVM_ERROR_FILE_VAR = "ARCADEDB_JVM_ERROR_FILE"


@contextlib.contextmanager
def _jvm_error_file(log_dir: Path) -> Iterator[None]:
    """While the JVM starts: its crash log (hs_err_pid*.log) goes to the graph's log folder.
    arcadedb_embedded's default is ./log/, relative to wherever the user ran the command, and a
    JVM without that folder writes into the current directory itself: a sidecar sent SIGTERM
    while its JVM started (JPype's signal handler segfaulted then, before `_signals_held`)
    left one in the repository the bench had started it from. A user's own ARCADEDB_JVM_ERROR_FILE wins. Set only for the
    start (the JVM reads it once), so child processes do not inherit this project's folder."""
    own = os.environ.get(JVM_ERROR_FILE_VAR)
    os.environ[JVM_ERROR_FILE_VAR] = own or str(log_dir / "hs_err_pid%p.log")
    try:
        yield
    finally:
        if own is None:
            os.environ.pop(JVM_ERROR_FILE_VAR, None)
        else:
            os.environ[JVM_ERROR_FILE_VAR] = own


#: What the JVM prints on its standard error at every start, since arcadedb_embedded always adds
#: the Vector API module (jdk.incubator.vector); we know of no JVM option that silences it.
INCUBATOR_NOTICE = b"WARNING: Using incubator modules: jdk.incubator.vector"


@contextlib.contextmanager
def _incubator_notice_dropped() -> Iterator[None]:
    """While the JVM starts, the process's standard error (file descriptor 2) is a pipe whose
    lines a thread passes on to the real one as they come, all but INCUBATOR_NOTICE. Every
    command that opened the embedded graph printed that line first, so a failure's one line on
    standard error was two. Passed on line by line rather than after the start, so that what a
    JVM that crashes at start prints still reaches the terminal."""
    try:
        saved = os.dup(2)
        read_end, write_end = os.pipe()
    except OSError:  # no standard error to filter
        yield
        return

    def pass_on() -> None:
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if line.strip() != INCUBATOR_NOTICE:
                    with contextlib.suppress(OSError):
                        os.write(saved, line)

    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    forwarder = threading.Thread(target=pass_on, name="jvm-stderr", daemon=True)
    forwarder.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer closed: the thread reads to its end
        forwarder.join(timeout=10)
        if not forwarder.is_alive():  # else a child holds the pipe: its number must stay taken
            os.close(saved)


def _jit_args() -> list[str]:
    """JIT_TIER_ARGS, unless ARCADEDB_JVM_ARGS (read by arcadedb_embedded) sets the tiers."""
    return [] if "Tiered" in os.environ.get("ARCADEDB_JVM_ARGS", "") else list(JIT_TIER_ARGS)


def _heap_bytes(size: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    size = size.strip().lower()
    return int(size[:-1]) * units[size[-1]] if size[-1:] in units else int(size)


def _initial_heap() -> str:
    """The initial heap, never above the maximum (the JVM refuses to start otherwise)."""
    try:
        return (
            _JVM_INITIAL_HEAP
            if _heap_bytes(_JVM_INITIAL_HEAP) <= _heap_bytes(_JVM_HEAP)
            else _JVM_HEAP
        )
    except ValueError:
        return _JVM_HEAP


@dataclass(frozen=True)
class GraphEndpoint:
    uri: str
    username: str
    password: str = field(repr=False)  # never in a log line or a traceback's repr
    database: str
    embedded: bool
    #: The embedded graph's directory and the process its server runs in (None: not embedded).
    root: Path | None = None
    owner_pid: int | None = None

    @property
    def label(self) -> str:
        return f"{'ArcadeDB (embedded) ' if self.embedded else ''}{self.uri}/{self.database}"


def free_space_short(root: Path) -> int | None:
    """The MiB free on the disk that holds (or will hold) `root`, when under GRAPH_MIN_FREE_MB:
    too little for the embedded graph to start, and the likely cause of a write it refused.
    None when there is room."""
    existing = next(p for p in (root, *root.parents) if p.exists())
    free_mb = shutil.disk_usage(existing).free // 2**20
    return free_mb if free_mb < GRAPH_MIN_FREE_MB else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_open(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def detach_jvm_gc_link() -> int:
    """Unlink JPype's collectors from Python's; how many `gc.callbacks` entries it removed.

    JPype ties the two garbage collectors together (its jp_gc.cpp): each Java collection that
    frees its sentinel runs a full Python collection (`PyGC_Collect`, the GIL held throughout)
    on its reference-queue thread, and a Python collection after which the C heap grew calls
    Java's `System.gc()`. The link is for programs whose Python objects hold Java objects;
    Skald holds one (the server handle) and talks to the graph over Bolt, while the embedded
    ArcadeDB allocates on every statement, so under load the JVM's young collections ran a
    full Python collection of the whole process every few seconds: in one `python -m
    bench.sidecar_load --levels 16` run, 41 full collections of ~160 ms each (6.5 s holding
    the GIL), against 17 (2.4 s) without the link; the effect on the query's p95 is in that
    bench's docstring.
    Both directions start in Python's `gc.callbacks` (JPype's `_collect`, which tells the link
    when Python collects): without it, the link runs at most one more Python collection and
    then stays idle. Python's own collector is untouched."""
    linked = [cb for cb in gc.callbacks if getattr(cb, "__module__", None) == "_jpype"]
    for callback in linked:
        gc.callbacks.remove(callback)
    return len(linked)


class EmbeddedArcadeDB:
    """One ArcadeDB server per graph directory per process; shared with other processes."""

    _instances: dict[Path, EmbeddedArcadeDB] = {}
    _registry_lock = threading.Lock()

    def __init__(self, root: Path) -> None:
        self.root = root
        #: How much nicer (OS priority, Linux per thread) the server's threads run than the
        #: thread that starts it, when this process starts it (`prefer_clients`).
        self.server_nice = 0
        self._server: Any = None
        self._endpoint: GraphEndpoint | None = None
        self._lock = threading.Lock()

    @classmethod
    def for_dir(cls, root: Path) -> EmbeddedArcadeDB:
        root = root.resolve()
        with cls._registry_lock:
            if root not in cls._instances:
                cls._instances[root] = cls(root)
            return cls._instances[root]

    @property
    def owned(self) -> bool:
        return self._server is not None

    def endpoint(self) -> GraphEndpoint:
        with self._lock:
            if self._endpoint is not None and (self.owned or self._discovered_alive()):
                return self._endpoint
            self._endpoint = None
            self.root.mkdir(parents=True, exist_ok=True)
            # An exclusive file lock serializes start-up between processes on one project.
            with (self.root / "server.lock").open("a+") as lock_file:
                fcntl.flock(lock_file, fcntl.LOCK_EX)
                try:
                    found = self._discover()
                    self._endpoint = found if found is not None else self._start()
                finally:
                    fcntl.flock(lock_file, fcntl.LOCK_UN)
            return self._endpoint

    # -- discovery of a server owned by another process
    @property
    def _discovery_file(self) -> Path:
        return self.root / "server.json"

    def _credentials(self) -> str:
        """The graph's root password, made at its first start: ArcadeDB keeps it (hashed) in
        data/config/server-users.jsonl, so one made anew later would not open the graph."""
        path = self.root / "credentials.json"
        if path.exists():
            try:
                password = json.loads(path.read_text())["password"]
                if isinstance(password, str) and password:
                    return password
            except (OSError, ValueError, KeyError, TypeError):
                pass
            raise EmbeddedGraphError(f"{path} is corrupted", hint=embedded_password_hint(self.root))
        if (self.root / GRAPH_USERS).exists():
            raise EmbeddedGraphError(
                f"{path} is missing: the graph under {self.root} was created with the password it held",
                hint=embedded_password_hint(self.root),
            )
        password = "skald-" + secrets.token_hex(12)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"user": EMBEDDED_USER, "password": password}))
        os.chmod(tmp, 0o600)
        tmp.replace(path)
        return password

    def _discover(self, *, announce: bool = True) -> GraphEndpoint | None:
        try:
            info = json.loads(self._discovery_file.read_text())
        except (OSError, ValueError):
            return None
        pid, port = int(info.get("pid", -1)), int(info.get("bolt_port", -1))
        if pid == os.getpid() or not pid_alive(pid) or not _port_open(port):
            return None
        if announce:
            log.info(
                "graph: using the embedded ArcadeDB already running in process %s (bolt port %s)",
                pid,
                port,
            )
        return GraphEndpoint(
            f"bolt://127.0.0.1:{port}",
            EMBEDDED_USER,
            self._credentials(),
            EMBEDDED_DATABASE,
            True,
            self.root,
            pid,
        )

    def _discovered_alive(self) -> bool:
        return self._endpoint is not None and _port_open(int(self._endpoint.uri.rsplit(":", 1)[1]))

    # -- starting our own
    def serve(self, bolt_port: int | None = None, http_port: int | None = None) -> GraphEndpoint:
        """Start the server in this process for others to use; refused when a live process
        already serves this graph (two servers cannot open one database directory)."""
        with self._lock:
            if self.owned and self._endpoint is not None:
                return self._endpoint
            self.root.mkdir(parents=True, exist_ok=True)
            with (self.root / "server.lock").open("a+") as lock_file:
                fcntl.flock(lock_file, fcntl.LOCK_EX)
                try:
                    found = self._discover(announce=False)
                    if found is not None:
                        raise EmbeddedGraphError(
                            f"the graph under {self.root} is already served by process {found.owner_pid} at {found.uri}",
                            hint="use that one (its clients find it by themselves), or stop it first",
                        )
                    self._endpoint = self._start(bolt_port, http_port)
                finally:
                    fcntl.flock(lock_file, fcntl.LOCK_UN)
            return self._endpoint

    def write_env_file(self, endpoint: GraphEndpoint) -> Path:
        """`neo4j.env` (mode 0600): the NEO4J_* settings of this server, for clients that do not
        share the project directory (`set -a; . neo4j.env; set +a`)."""
        path = self.root / "neo4j.env"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            f"NEO4J_URI={endpoint.uri}\nNEO4J_USERNAME={endpoint.username}\n"
            f"NEO4J_PASSWORD={endpoint.password}\nNEO4J_DATABASE={endpoint.database}\n"
        )
        os.chmod(tmp, 0o600)
        tmp.replace(path)
        return path

    def _start(self, bolt_port: int | None = None, http_port: int | None = None) -> GraphEndpoint:
        """Start the graph in this process; a SIGTERM, SIGINT or SIGHUP meanwhile acts once it is up."""
        with _signals_held():
            return self._start_server(bolt_port, http_port)

    def _start_server(self, bolt_port: int | None, http_port: int | None) -> GraphEndpoint:
        started = time.monotonic()
        self._check_free_space()
        password = self._credentials()
        log_dir = self.root / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        props = self.root / "logging.properties"
        # Send ArcadeDB's java.util.logging to a file instead of our terminal.
        props.write_text(
            "handlers = java.util.logging.FileHandler\n"
            ".level = WARNING\n"
            f"java.util.logging.FileHandler.pattern = {log_dir}/arcadedb.%g.log\n"
            "java.util.logging.FileHandler.limit = 5000000\n"
            "java.util.logging.FileHandler.count = 2\n"
            "java.util.logging.FileHandler.formatter = java.util.logging.SimpleFormatter\n"
        )
        try:
            from arcadedb_embedded import ArcadeDBServer

            _start_jvm(log_dir, props)
            bolt_port, http_port = bolt_port or free_port(), http_port or free_port()
            server = ArcadeDBServer(
                root_path=str(self.root / "data"),
                root_password=password,
                config={
                    "host": "127.0.0.1",
                    "http_port": http_port,
                    "server_plugins": "Bolt:com.arcadedb.bolt.BoltProtocolPlugin",
                    "bolt_port": bolt_port,
                },
            )
            before = process_threads()
            server.start()
            if self.server_nice:
                # Its listener's and timers' threads: the connections' threads it starts later
                # inherit the listener's nice value (core.priority).
                niced = lower_threads(process_threads() - before, self.server_nice)
                log.info("graph: %d server threads run %d steps nicer", niced, self.server_nice)
            if not (self.root / "data" / "databases" / EMBEDDED_DATABASE).exists():
                server.create_database(EMBEDDED_DATABASE)
        except Exception as exc:
            raise EmbeddedGraphError(
                f"could not start the embedded ArcadeDB graph under {self.root}: {exc}",
                hint="check Java/disk space, or set NEO4J_URI to use a Neo4j server",
            ) from exc
        self._server = server
        tmp = self._discovery_file.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"pid": os.getpid(), "bolt_port": bolt_port, "http_port": http_port})
        )
        tmp.replace(self._discovery_file)
        atexit.register(self.stop)
        log.info(
            "graph: embedded ArcadeDB started in %.1fs (bolt://127.0.0.1:%s, studio http://127.0.0.1:%s, data %s)",
            time.monotonic() - started,
            bolt_port,
            http_port,
            self.root / "data",
        )
        return GraphEndpoint(
            f"bolt://127.0.0.1:{bolt_port}",
            EMBEDDED_USER,
            password,
            EMBEDDED_DATABASE,
            True,
            self.root,
            os.getpid(),
        )

    def _check_free_space(self) -> None:
        """Refuse to start on a disk too full for the graph's files, in words that say so."""
        free_mb = free_space_short(self.root)
        if free_mb is not None:
            raise EmbeddedGraphError(
                f"only {free_mb} MiB free on the disk holding {self.root}: the embedded graph "
                f"needs {GRAPH_MIN_FREE_MB} MiB",
                hint="free some space on that disk and run the same command again, or set "
                "NEO4J_URI to use a Neo4j server",
            )

    def stop(self) -> None:
        with self._lock:
            server, self._server, self._endpoint = self._server, None, None
            if server is None:
                return
            try:
                info = json.loads(self._discovery_file.read_text())
                if int(info.get("pid", -1)) == os.getpid():
                    # First, so a client that sees the server go reads that its owner stopped it.
                    self._discovery_file.unlink(missing_ok=True)
                    (self.root / "neo4j.env").unlink(missing_ok=True)
            except (OSError, ValueError):
                pass
            try:
                server.stop()
            except Exception as exc:  # stopping is best effort at interpreter exit
                log.debug("ArcadeDB stop failed: %s", exc)


def _start_jvm(log_dir: Path, props: Path) -> None:
    """Start the embedded graph's JVM with the project's settings, its crash log in `log_dir`.

    Started from a thread other than the main one (a task's worker thread that becomes the
    graph's owner when the process serving it exited mid-run), that thread is detached from
    the JVM at once: the JVM adopts the thread that starts it as its own non-daemon "main"
    thread, which never ends in Java's eyes once the Python thread has, so the JVM's shutdown
    at interpreter exit waited for it forever (measured: a regression shard whose graph owner
    exited wrote its report and then hung in JPype's `_JTerminate`). Its next call into Java
    attaches it again, as JPype attaches every other thread: as a daemon."""
    import jpype
    from arcadedb_embedded.jvm import start_jvm

    started_here = not jpype.isJVMStarted()
    try:
        with _jvm_error_file(log_dir), _incubator_notice_dropped():
            start_jvm(
                heap_size=_JVM_HEAP,
                jvm_args=[
                    *JVM_SIGNAL_ARGS,
                    f"-Xms{_initial_heap()}",
                    f"-Djava.util.logging.config.file={props}",
                    *_jit_args(),
                ],
            )
    except Exception as exc:  # already started in this process with another config
        log.debug("JVM already running: %s", exc)
    if started_here and threading.current_thread() is not threading.main_thread():
        jpype.java.lang.Thread.detach()
    detach_jvm_gc_link()


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """While the embedded graph starts in this process, SIGTERM, SIGINT and SIGHUP are held;
    once the start is over (done or failed) the handlers are back, SIGTERM's and SIGHUP's turned
    into SystemExit (`exit_cleanly_on_termination`), and a signal held meanwhile is handed to
    its handler then.

    Why: a signal that cut the start short took the process down in JPype. Measured with
    `python -m flows.dialogue serve` sent SIGTERM 4.8, 4.9 ... 7.2 s after it started (about
    when its JVM starts on a 2-core machine): 9 of 25 runs ended in SIGSEGV (exit 134, a JVM
    crash log), in JPype's handler thread (JPypeSignal.interruptPy -> PyObject_RichCompare) or
    in the main thread (JPMethodDispatch::findOverload, a SystemExit raised inside JPype's own
    start), and one in a false "could not start the embedded ArcadeDB graph"
    (InterruptedException); with the signals held and -Xrs (JVM_SIGNAL_ARGS), 25 of 25 ended
    with exit 143. Only the main thread may set handlers: a start from another thread runs
    without holding."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # getsignal is None for a handler set outside Python: that one is left alone.
    previous = {
        sig: handler
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        if (handler := signal.getsignal(sig)) is not None
    }
    held: list[int] = []
    for sig in previous:
        signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        exit_cleanly_on_termination()
        for sig in dict.fromkeys(held):
            handler = signal.getsignal(sig)
            if callable(handler):
                handler(sig, None)


#: The signals that end a process holding the embedded graph, each with the exit status its
#: default action would give (128 + the signal). SIGHUP too: the JVM used to close the graph on
#: a hangup (a closed terminal) by itself, before it left the signals to Python (-Xrs).
_ENDING_SIGNALS = {signal.SIGTERM: 143, signal.SIGHUP: 129}


def _raise_exit(signum: int, frame: object) -> None:
    # The worker threads stop too (core.interrupt): the runner that waits for them before the
    # process exits would otherwise wait for their queued LLM calls, past a service manager's
    # patience (systemd sends SIGKILL 90 s after its SIGTERM).
    stop_workers()
    # Once the exit functions have closed the graph, the process ends by the signal itself, as
    # a service manager and a shell script expect of a stopped command (core.interrupt).
    end_by_signal_at_exit(signum)
    raise SystemExit(_ENDING_SIGNALS[signum])


def exit_cleanly_on_termination() -> None:
    """Turn SIGTERM and SIGHUP into SystemExit so atexit hooks close the database files cleanly
    (a signal whose handler someone set, or that is ignored, is left as it is). Also for a
    process whose graph is another's (a Neo4j, a `kg serve`): its own `finally` blocks run
    (the sidecar's `serve` closes its service, which writes its LLM call records)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _ENDING_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _raise_exit)


def graph_endpoint(settings: Settings) -> GraphEndpoint:
    """The configured Neo4j when NEO4J_URI is set, else the embedded ArcadeDB (started on demand)."""
    if settings.neo4j_uri:
        password = settings.neo4j_password.get_secret_value() if settings.neo4j_password else ""
        return GraphEndpoint(
            settings.neo4j_uri,
            settings.neo4j_username,
            password,
            settings.neo4j_database or "neo4j",
            False,
        )
    return EmbeddedArcadeDB.for_dir(settings.saga_dir / "graph").endpoint()


def prefer_clients(settings: Settings, nice: int) -> None:
    """If this process starts the project's embedded graph, its server threads run `nice`
    steps nicer than the process's own (the sidecar's: a memory query's embedding and Python
    get the CPU before the graph's work for the commits; core.priority). No effect on a
    configured Neo4j, or on an embedded graph another process serves."""
    if not settings.neo4j_uri:
        EmbeddedArcadeDB.for_dir(settings.saga_dir / "graph").server_nice = nice


def owner_exited(endpoint: GraphEndpoint) -> bool:
    """Whether the other process serving this embedded graph has exited: one signal-0 probe,
    cheap enough to ask before every transaction (`owner_gone` says why, and is the verdict)."""
    if not endpoint.embedded or endpoint.owner_pid in (None, os.getpid()):
        return False
    return not pid_alive(endpoint.owner_pid or -1)


def owner_gone(endpoint: GraphEndpoint) -> str | None:
    """Why an embedded graph served by ANOTHER process is no longer there, or None.

    The owner removes `server.json` before it stops its server, so a client whose connection
    failed can tell "the process that served the graph exited" (the graph went with it; the
    same run cannot go on against it) from a passing network error."""
    if not endpoint.embedded or endpoint.root is None or endpoint.owner_pid in (None, os.getpid()):
        return None
    port = int(endpoint.uri.rsplit(":", 1)[1])
    try:
        info = json.loads((endpoint.root / "server.json").read_text())
        same = (
            int(info.get("pid", -1)) == endpoint.owner_pid
            and int(info.get("bolt_port", -1)) == port
        )
    except (OSError, ValueError):
        same = False
    if same and pid_alive(endpoint.owner_pid or -1) and _port_open(port):
        return None
    project = endpoint.root.parent.parent  # <project>/.saga/graph
    return (
        f"the embedded graph of {project} ran inside process {endpoint.owner_pid}, which exited mid-run "
        f"and took the graph with it; run `python -m kg serve --project-dir {project}` so the graph "
        "outlives the processes that use it, then run again"
    )


def serve_embedded(
    settings: Settings,
    *,
    bolt_port: int | None = None,
    http_port: int | None = None,
    ready: Callable[[GraphEndpoint, Path], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Run the project's embedded graph in this process until SIGTERM, SIGINT or `stop`.

    Other processes of the project find it through `server.json` like any embedded server;
    `neo4j.env` beside it holds the NEO4J_* settings for the rest. Call from the main thread."""
    if settings.neo4j_uri:
        raise ConfigError(
            f"NEO4J_URI is set ({settings.neo4j_uri}): that server is the graph, there is no embedded one to serve",
            hint="unset NEO4J_URI to serve the project's embedded ArcadeDB",
        )
    stop = stop or threading.Event()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    db = EmbeddedArcadeDB.for_dir(settings.saga_dir / "graph")
    try:
        endpoint = db.serve(bolt_port, http_port)
        # After the start (a signal during it was held until now: _signals_held), and also
        # when SIGINT came in ignored (a background job of a script): Ctrl-C and SIGTERM both
        # stop the server cleanly, its files closed.
        for sig in handlers:
            signal.signal(sig, lambda signum, frame: stop.set())
        env_file = db.write_env_file(endpoint)
        if ready is not None:
            ready(endpoint, env_file)
        while not stop.wait(0.5):
            pass
        log.info("graph: stopping the embedded ArcadeDB of %s", settings.project_dir)
    finally:
        db.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
