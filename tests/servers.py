"""Every server the tests start, and the CLI they drive, in one place. Everything listens on loopback.

- `free_port`, `wait_healthy`: a free port on 127.0.0.1; wait until a server's /health answers 200.
- `SimProcess`: `loadgen sim` in its own process (its URL only once it answers /health).
- `SimThread`, `RawListener`, `LoopThread`: a simulated llama-server or a misbehaving listener on
  an event loop in a background thread, for tests that drive `loadgen` in-process (its sweep owns
  the main thread's event loop and signal handlers).
- `start_llama_server`, `LlamaServer`, `testbed_paths`: the real llama-server test bed
  (scripts/testbed), started and stopped by pid.
- `start_prometheus`, `Prometheus`: Debian's Prometheus on a free port with its own TSDB, and its HTTP API.
- `LOADGEN`, `sweep`, `in_process_cli`: `loadgen` as a user runs it (a subprocess), or in-process
  through `cli.main`, the real error path.
- `start_nginx`, `Nginx`, `nginx_binary`, `reverse_proxy`: Debian's nginx with a config of the
  test's own (a reverse proxy under a path prefix, canned answers with the echo module, ...), on a
  free loopback port, stopped by pid. `start_lossy_nginx`: one whose njs script drops parameters.
- `AppThread`: an aiohttp application served from a background thread (a server of a test's own);
  `RewritingProxy`, one: a minimal reverse proxy that rewrites request bodies on the way (the same
  lossy gateway without nginx).
- `CAPACITY_SIM`: the simulator profile the capacity tests share.
- `start_postgres`: Debian's PostgreSQL, a private cluster on a free loopback port (the history store).
- `GRID_SERVER`, `grid`, `grid_pids`: a stand-in llama-server for `loadgen grid` (tests/fake-llama-server.py:
  the simulator behind llama-server's flags and boot log), `loadgen grid` in a subprocess, and the
  pids of every server a grid folder records (to assert none is left).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.sim import FaultConfig, load_profile, start_simulator

ROOT = Path(__file__).resolve().parent.parent
LOADGEN = [sys.executable, "-m", "loadgen.cli"]


def sweep(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`loadgen sweep ARGS` in a subprocess, as a user runs it."""
    return subprocess.run([*LOADGEN, "sweep", *args], capture_output=True, text=True, timeout=timeout)


def terminate(proc: subprocess.Popen, grace_s: float = 10) -> None:
    """Stop a process the test started, by its pid: SIGTERM, then SIGKILL after `grace_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


GRID_SERVER = shlex.join([sys.executable, str(ROOT / "tests" / "fake-llama-server.py")])

# A `loadgen sim` profile for capacity: a decode step of 20 ms, so 16 tokens take ~0.3 s and a request
# that waits for a slot has a TTFT of a whole answer, one that does not a few ms (the capacity,
# stop-at-knee and grid-capacity tests, and benchmarks/capacity.py).
CAPACITY_SIM = """name = "capsim"
model_alias = "cap-sim"
prefill_tok_s = 20000.0
step_ms = 20
alpha = 0.25
n_ctx = 2048
eos_probability = 0.02
"""


def grid(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`loadgen grid ARGS` in a subprocess, as a user runs it."""
    return subprocess.run([*LOADGEN, "grid", *args], capture_output=True, text=True, timeout=timeout)


def grid_pids(folder: Path) -> list[int]:
    """The pid of every server a grid started (from its grid.json)."""
    doc = json.loads((folder / "grid.json").read_text())
    return [e["pid"] for c in doc["cells"] for e in c["runs"] if "pid" in e]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SIM_PROFILE = """name = "{name}"
model_alias = "{alias}"
prefill_tok_s = 20000.0
step_ms = {step_ms}
alpha = 0.25
n_ctx = 2048
eos_probability = 0.02
"""


def sim_profile(path: Path, name: str, step_ms: float, alias: str = "gate-sim") -> Path:
    """A simulator profile file: a server whose decode step takes `step_ms` (a throttled twin of
    another when only step_ms differs)."""
    path.write_text(SIM_PROFILE.format(name=name, alias=alias, step_ms=step_ms))
    return path


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections for as long as the block runs: bound, never
    listening. A port that was merely free a moment ago may be listened on by then."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def wait_healthy(url: str, timeout: float, proc: subprocess.Popen | None = None, what: str = "the server") -> None:
    """Return once GET url/health answers 200; raise RuntimeError when `timeout` s pass first or
    `proc` (the server's process, if given) exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} at {url} exited with {proc.returncode} before it answered /health")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} at {url} did not answer /health within {timeout} s")
        time.sleep(0.1)


def in_process_cli(monkeypatch: Any, capsys: Any) -> Callable[..., tuple[int, str, str]]:
    """`run(*ARGS)`: `loadgen ARGS` in-process through cli.main; returns (exit code, stdout, stderr)."""
    from loadgen import cli

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)

    def run(*args: Any) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["loadgen", *map(str, args)])
        try:
            cli.main()
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        out, err = capsys.readouterr()
        return code, out, err

    return run


def run_cli(*args: Any) -> tuple[int, str, str]:
    """`loadgen ARGS` in-process through cli.main with its own capture of stdout and stderr (where no
    capsys is at hand: a module's fixture, inside hypothesis's @given); returns (exit code, stdout, stderr)."""
    import contextlib
    import io

    from loadgen import cli

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["loadgen", *map(str, args)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    finally:
        sys.argv = argv
    return int(code), out.getvalue(), err.getvalue()


class SimProcess:
    """`with SimProcess("--profile", "smoke", ...) as sim:` `loadgen sim` in its own process at `sim.url`.

    It listens on a port of its own choosing (`--port 0`) and says where on stderr; `url` is given
    only once /health answers, and a simulator that never comes up is an error, not a URL. Stopped
    with SIGINT (as a user stops it), killed if it does not exit. `command` replaces `loadgen sim`.
    """

    def __init__(self, *args: str, ready_timeout: float = 30, command: tuple[str, ...] = (*LOADGEN, "sim")):
        self.args = ["--port", "0", *args]
        self.command = list(command)
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> SimProcess:
        self.proc = proc = subprocess.Popen([*self.command, *self.args], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, text=True,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            line = proc.stderr.readline()
            if " on " not in line:
                raise RuntimeError(f"the simulator did not start: {line.strip() or proc.wait(10)}")
            self.url = line.split(" on ")[1].split(",")[0].strip()
            # Keep reading its stderr, so a chatty simulator never blocks on a full pipe.
            threading.Thread(target=proc.stderr.read, name="sim-stderr", daemon=True).start()
            wait_healthy(self.url, self.ready_timeout, proc, "the simulator")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> int | None:
        """SIGINT, then its exit code (killed after 10 s)."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def __enter__(self) -> SimProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serve_handler(handler: type) -> Iterator[str]:
    """An `http.server` request handler class served from a thread on a free loopback port; yields its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def testbed_paths() -> tuple[str, str]:
    """(llama-server binary, model), building/fetching them with scripts/testbed when missing."""
    server, model = os.environ.get("LOADGEN_LLAMA_SERVER"), os.environ.get("LOADGEN_MODEL")
    if server and model:
        return server, model
    out = subprocess.run([str(ROOT / "scripts" / "testbed")], check=True, capture_output=True, text=True).stdout
    found = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return found["LOADGEN_LLAMA_SERVER"], found["LOADGEN_MODEL"]


@dataclass
class LlamaServer:
    proc: subprocess.Popen
    port: int
    alias: str | None  # None: started without --alias, as people start it (it reports its model's path)
    slots: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        terminate(self.proc, 10)


def start_llama_server(alias: str | None, slots: int, log_dir: Path, *, metrics: bool = True,
                       extra: tuple[str, ...] = (), ready_timeout: float = 120, port: int | None = None,
                       models_dir: Path | None = None) -> LlamaServer:
    """A llama-server on `port` (a free one when None: give the old port to restart a server);
    `alias` None starts it without --alias; `models_dir` starts a router over that folder's GGUF
    files instead of one model (its children get the other flags)."""
    binary, model = testbed_paths()
    port = port or free_port()
    log = log_dir / f"{alias or 'no-alias'}-{port}-{time.monotonic_ns()}.log"
    source = ["--models-dir", str(models_dir)] if models_dir is not None else ["-m", model]
    args = [binary, *source, "--host", "127.0.0.1", "--port", str(port), "--parallel", str(slots),
            "-c", "4096", "-t", "1", *(["--alias", alias] if alias else []), *(["--metrics"] if metrics else []),
            *extra]
    with log.open("wb") as f:
        proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = LlamaServer(proc, port, alias, slots, log)
    try:
        wait_healthy(server.url, ready_timeout, proc, "llama-server")
    except RuntimeError as exc:
        server.stop()
        raise RuntimeError(f"{exc}: {log.read_text()[-2000:]}") from None
    return server


# --- in a background thread ---------------------------------------------------------------------

class LoopThread:
    """An event loop running in a daemon thread; `call(coro)` runs a coroutine on it and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="simbed", daemon=True)

    def __enter__(self) -> LoopThread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def call(self, coro: Awaitable[Any], timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


class SimThread:
    """`with SimThread(faults=[...]) as sim:` a simulated llama-server at `sim.url`.

    `restart()` stops it and starts a fresh one on the same port, as a restarted server would be.
    """

    def __init__(self, profile: str = "smoke", *, faults: list[str] | tuple[str, ...] = (), slots: int = 4,
                 time_scale: float = 0.05, seed: int = 0, port: int = 0, **options: Any):
        self.profile = load_profile(profile)
        self.faults = FaultConfig.parse(faults)
        self.kwargs = dict(slots=slots, time_scale=time_scale, seed=seed, faults=self.faults, **options)
        self.port = port
        self._loop = LoopThread()
        self.sim: Any = None

    @property
    def url(self) -> str:
        return self.sim.url

    async def _start(self) -> None:
        self.sim = await start_simulator(self.profile, host="127.0.0.1", port=self.port, **self.kwargs)
        self.port = self.sim.port

    def start(self) -> None:
        self._loop.call(self._start())

    def stop(self) -> None:
        if self.sim is not None:
            self._loop.call(self.sim.stop())
            self.sim = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def completion_requests(self) -> int:
        """Completion requests the simulator has received (the index its faults are chosen by)."""
        return self.sim.server._n_requests

    def __enter__(self) -> SimThread:
        self._loop.__enter__()
        try:
            self.start()
        except BaseException:
            self._loop.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self._loop.__exit__(None, None, None)


class RawListener:
    """A TCP listener on 127.0.0.1 that answers every connection with `respond(first bytes read)`.

    `respond` returns the bytes to send (then the connection is closed) — e.g. an SSH banner, an
    echo of the request, or random garbage — or None to send nothing and close.
    """

    def __init__(self, respond: Callable[[bytes], bytes | None]):
        self.respond = respond
        self._loop = LoopThread()
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await asyncio.wait_for(reader.read(65536), 5)
            answer = self.respond(first)
            if answer:
                writer.write(answer)
                await writer.drain()
        except (TimeoutError, OSError):
            pass
        finally:
            writer.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, family=socket.AF_INET)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def __enter__(self) -> RawListener:
        self._loop.__enter__()
        self._loop.call(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._loop.call(self._stop())
        finally:
            self._loop.__exit__(None, None, None)


# --- nginx ---------------------------------------------------------------------------------------

NGINX_INSTALL = "apt-get install -y nginx libnginx-mod-http-js"
NGINX_MODULES = Path("/usr/lib/nginx/modules")
# Debian's package of each dynamic module a test may load.
NGINX_MODULE_PACKAGES = {"ngx_http_js_module": "libnginx-mod-http-js", "ngx_http_echo_module": "libnginx-mod-http-echo"}


def _missing(what: str, install: str) -> None:
    """A real component a test needs is not installed: fail in CI (CI=true), where every one must be
    there, and skip elsewhere with the command that installs it."""
    import pytest

    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} is not installed ({install}); scripts/test installs it")
    pytest.skip(f"{what} is not installed ({install})")


def nginx_binary(modules: tuple[str, ...] = ()) -> str:
    """Debian's nginx (scripts/test installs it), with the dynamic `modules` asked for."""
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                           if os.access(p, os.X_OK)), None)
    if not found:
        _missing("nginx", NGINX_INSTALL)
    for module in modules:
        if not (NGINX_MODULES / f"{module}.so").exists():
            _missing(f"nginx's {module}", f"apt-get install -y {NGINX_MODULE_PACKAGES.get(module, module)}")
    return found


NGINX_CONFIG = """daemon off;
master_process on;
{user}
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
{modules}
events {{ worker_connections 8192; }}
http {{
    access_log {dir}/access.log;
    log_format conn '$connection $connection_requests $request_uri';
    access_log {dir}/requests.log conn;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    {http}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        {server}
    }}
}}
"""


@dataclass
class Nginx:
    proc: subprocess.Popen
    port: int
    dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def access_log(self) -> list[str]:
        """The request lines nginx logged ("GET /p/health HTTP/1.1"), in order."""
        path = self.dir / "access.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return [line.split('"')[1] for line in lines if line.count('"') >= 2]

    def requests_log(self) -> list[tuple[int, int, str]]:
        """(connection, request index on it, URI) of every request so far: nginx's connection serial
        number and `$connection_requests`, so a test can count the connections a client used."""
        path = self.dir / "requests.log"
        rows = []
        for line in (path.read_text().splitlines() if path.exists() else []):
            conn, index, uri = line.split(" ", 2)
            rows.append((int(conn), int(index), uri))
        return rows

    def stop(self) -> None:
        terminate(self.proc, 10)  # SIGTERM: nginx's fast shutdown, master and worker
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Nginx:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_nginx(server: str, *, http: str = "", modules: tuple[str, ...] = (), files: dict[str, str] | None = None,
                ready_timeout: float = 20) -> Nginx:
    """nginx with `server` as the body of its one `server {}` block (locations, directives) and
    `http` at the http level (upstreams, maps, js_import), listening on a free loopback port;
    `modules` are dynamic modules by name ("ngx_http_js_module"); `files` (name -> text, e.g. an njs
    script) are written into its prefix directory, where relative paths in the config find them.
    Its own prefix, pid and logs in a temp dir (`-p`, `daemon off`), so the Popen pid is the
    master's; `url` once it accepts connections."""
    binary = nginx_binary(modules)
    for attempt in range(3):  # a free port may be taken before nginx binds it
        work = Path(tempfile.mkdtemp(prefix="loadgen-test-nginx-"))
        for name, text in (files or {}).items():
            (work / name).write_text(text)
        port = free_port()
        conf = NGINX_CONFIG.format(dir=work, port=port, server=server, http=http,
                                   user="user root;" if os.geteuid() == 0 else "",
                                   modules="\n".join(f"load_module {NGINX_MODULES / m}.so;" for m in modules))
        (work / "nginx.conf").write_text(conf)
        proc = subprocess.Popen([binary, "-p", str(work), "-c", str(work / "nginx.conf"), "-e",
                                 str(work / "error.log")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        nginx = Nginx(proc, port, work)
        if _wait_listening(port, proc, ready_timeout):
            return nginx
        log = (work / "error.log").read_text(errors="replace") if (work / "error.log").exists() else ""
        nginx.stop()
        if "Address already in use" not in log or attempt == 2:
            raise RuntimeError(f"nginx did not start: {log[-2000:]}")
    raise AssertionError("unreachable")


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float) -> bool:
    """True once 127.0.0.1:port accepts a connection; False when `proc` exits first."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        if time.monotonic() > deadline:
            raise RuntimeError(f"nginx did not listen on {port} within {timeout} s")
        time.sleep(0.05)
    return False


def reverse_proxy(prefix: str, upstream: str) -> str:
    """A `server` block body: `prefix`/... is passed to `upstream`/... (query kept), unbuffered so
    streams go through as they come, as a gateway in front of llama-server is configured."""
    return f"""
        location {prefix.rstrip("/")}/ {{
            proxy_pass {upstream.rstrip("/")}/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
        location / {{ return 404 '{{"error": "no route"}}'; }}
    """


# --- a gateway that rewrites request bodies -------------------------------------------------------

class AppThread:
    """An aiohttp `web.Application` (from `app()`, which a subclass defines) served on 127.0.0.1 from
    an event loop in a background thread: `with Sub(...) as server:` serves at `server.origin`."""

    def __init__(self) -> None:
        self._loop = LoopThread()
        self._runner: Any = None
        self.origin = ""

    def app(self) -> Any:
        raise NotImplementedError

    async def _start(self) -> None:
        from aiohttp import web

        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.origin = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    def __enter__(self) -> Any:
        self._loop.__enter__()
        try:
            self._loop.call(self._start())
        except BaseException:
            self._loop.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._loop.call(self._runner.cleanup())
        finally:
            self._loop.__exit__(None, None, None)


class RewritingProxy(AppThread):
    """`with RewritingProxy(upstream, rewrite) as gw:` a reverse proxy at `gw.url` (+ `prefix`) that
    passes every request to `upstream` and each JSON request body through `rewrite(dict) -> dict`
    on the way: the lossy gateway of the second field report, which dropped a parameter silently
    and answered 200. Answers are passed back whole (no streaming)."""

    def __init__(self, upstream: str, rewrite: Callable[[dict], dict], prefix: str = "/lossy"):
        super().__init__()
        self.upstream, self.rewrite, self.prefix = upstream.rstrip("/"), rewrite, prefix

    @property
    def url(self) -> str:
        return self.origin + self.prefix

    async def _handle(self, request: Any) -> Any:
        from aiohttp import ClientSession, web

        path = request.path_qs.removeprefix(self.prefix) or "/"
        body = await request.read()
        if body and request.method == "POST":
            with contextlib.suppress(ValueError):
                parsed = json.loads(body)
                if isinstance(parsed, dict):
                    body = json.dumps(self.rewrite(parsed)).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        async with ClientSession() as session:
            async with session.request(request.method, self.upstream + path, data=body or None,
                                       headers=headers) as resp:
                data = await resp.read()
                return web.Response(status=resp.status, body=data,
                                    content_type=resp.content_type or "application/json")

    def app(self) -> Any:
        from aiohttp import web

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app


# The same lossy gateway as nginx + njs (Debian's libnginx-mod-http-js): the request body rewritten
# on its way to the server, the answer passed back whole.
NJS_LOSSY = """
async function lossy(r) {
    let body = r.requestText;
    if (body) {
        try {
            const parsed = JSON.parse(body);
            delete parsed.temperature;
            delete parsed.seed;
            if ('max_tokens' in parsed) parsed.max_tokens = 16;
            if ('n_predict' in parsed) parsed.n_predict = 16;
            body = JSON.stringify(parsed);
        } catch (e) {}
    }
    const reply = await r.subrequest('/upstream' + r.uri.substring(PREFIX.length),
                                     {method: r.method, body: body, args: r.variables.args || ''});
    r.headersOut['Content-Type'] = 'application/json';
    r.return(reply.status, reply.responseText);
}
export default {lossy};
"""


def start_lossy_nginx(upstream: str, prefix: str = "/lossy") -> Nginx:
    """nginx whose `prefix`/... drops temperature and seed and sets max_tokens (n_predict) to 16
    before passing the request to `upstream` (see `drop_temperature_and_seed`): `url + prefix`."""
    server = f"""
        location {prefix}/ {{ js_content gw.lossy; }}
        location /upstream/ {{ internal; proxy_pass {upstream.rstrip("/")}/; proxy_http_version 1.1; }}
    """
    script = NJS_LOSSY.replace("PREFIX.length", str(len(prefix)))
    return start_nginx(server, http="js_import gw from lossy.js; subrequest_output_buffer_size 1m;",
                       modules=("ngx_http_js_module",), files={"lossy.js": script})


def drop_temperature_and_seed(body: dict) -> dict:
    """The lossy gateway of the tests: temperature and seed gone, max_tokens (n_predict) raised to 16."""
    out = {k: v for k, v in body.items() if k not in ("temperature", "seed")}
    for key in ("max_tokens", "n_predict"):
        if key in out:
            out[key] = 16
    return out


# --- Prometheus (Debian's `prometheus` package) ------------------------------------------------

def prometheus_binary() -> str:
    """Debian's prometheus (scripts/test installs it as root)."""
    found = shutil.which("prometheus")
    if found is None:
        _missing("prometheus", "apt-get install -y prometheus")
    return found


@dataclass
class Prometheus:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params: Any) -> Any:
        """GET /api/v1/PATH?params; the `data` of a successful answer (RuntimeError otherwise)."""
        import json
        from urllib.parse import urlencode

        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{urlencode(params)}", timeout=10) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector ([{metric, value: [t, "v"]}, ...])."""
        return self.api("query", query=expr, **({"time": f"{at:.3f}"} if at is not None else {}))["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")["result"]

    def wait_for(self, what: str, condition: Callable[[], bool], timeout: float = 120) -> None:
        """Poll `condition` until it holds; RuntimeError (with the log's tail) after `timeout` s."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus: {what} did not happen: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        terminate(self.proc, 20)


def start_prometheus(config: Path, work_dir: Path, ready_timeout: float = 60) -> Prometheus:
    """Prometheus with `config` on a free loopback port, its TSDB and log in `work_dir` (never the
    system service's); ready once /-/ready answers 200. Stop it with `.stop()` (by pid)."""
    binary = prometheus_binary()
    port = free_port()
    log = work_dir / f"prometheus-{port}.log"
    args = [binary, f"--config.file={config}", f"--storage.tsdb.path={work_dir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1d", "--log.level=warn"]
    with log.open("wb") as f:
        proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = Prometheus(proc, port, log)
    deadline = time.monotonic() + ready_timeout
    while True:
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"Prometheus did not become ready: {log.read_text()[-2000:]}")
        time.sleep(0.1)


class InstantServer:
    """`tests/instant_server.py` in its own process: answers every POST /completion at once (one
    canned llama.cpp response) and counts them (`count()`); for runs of hundreds of thousands of requests."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> InstantServer:
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "instant_server.py"), str(self.port)])
        wait_healthy(self.url, 30, self.proc, "the instant server")
        return self

    def count(self) -> int:
        with urllib.request.urlopen(f"{self.url}/count", timeout=10) as r:
            return int(r.read())

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            terminate(self.proc)


# --- Debian's PostgreSQL -------------------------------------------------------------------------

@dataclass
class Postgres:
    proc: subprocess.Popen
    port: int
    data: Path

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        terminate(self.proc, 20)  # SIGTERM: PostgreSQL's "smart" shutdown of the cluster we started
        shutil.rmtree(self.data, ignore_errors=True)


def postgres_bin() -> Path | None:
    """Debian's PostgreSQL binaries (package postgresql, installed by scripts/test), newest version."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name)
                   if p.parent.parent.name.isdigit() else 0)
    return found[-1].parent if found else None


def start_postgres(ready_timeout: float = 60) -> Postgres:
    """A private PostgreSQL cluster (trust authentication, loopback only) in a fresh folder. As root it
    runs as the `postgres` user the package made (PostgreSQL refuses to run as root)."""
    import pwd

    bindir = postgres_bin()
    if bindir is None:
        raise RuntimeError("PostgreSQL is not installed (apt-get install -y postgresql)")
    data = Path(tempfile.mkdtemp(prefix="loadgen-pg-"))
    as_user: dict[str, Any] = {}
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(data, pw.pw_uid, pw.pw_gid)
        as_user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
    subprocess.run([str(bindir / "initdb"), "-D", str(data / "db"), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                    "--no-sync"], check=True, capture_output=True, **as_user)
    port = free_port()
    log = (data / "postgres.log").open("wb")
    proc = subprocess.Popen([str(bindir / "postgres"), "-D", str(data / "db"), "-p", str(port), "-h", "127.0.0.1",
                             "-k", str(data), "-c", "fsync=off"], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, **as_user)
    server = Postgres(proc, port, data)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        ready = subprocess.run([str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)], capture_output=True)
        if ready.returncode == 0:
            return server
        time.sleep(0.2)
    text = (data / "postgres.log").read_text(errors="replace")[-2000:]
    server.stop()
    raise RuntimeError(f"PostgreSQL did not start: {text}")
