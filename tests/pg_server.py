"""Throwaway PostgreSQL servers for the test suite.

``PostgresServer`` runs a real, private PostgreSQL server for the duration of a
test session: ``initdb`` into a fresh temporary directory, listen only on
127.0.0.1 on a free TCP port (the unix socket lives inside the temporary
directory), and remove everything again on ``stop()``.

If ``AGENTCHECK_TEST_POSTGRES_URL`` is set, no server is started and that
server is used instead (``restart()`` is then unavailable, because the harness
does not own the server).

When the tests run as root, PostgreSQL refuses to run as root, so the data
directory is handed to the ``postgres`` OS user and ``initdb``/``pg_ctl`` run
through ``runuser -u postgres --`` (or ``su postgres -c``).

Standard library only, except that ``create_database()``/``drop_database()``
(and the readiness probe, when available) import ``psycopg`` lazily.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import quote, unquote, urlsplit

__all__ = ["ENV_URL", "PostgresServer", "find_pg_binaries"]

ENV_URL = "AGENTCHECK_TEST_POSTGRES_URL"
"""Environment variable naming an existing server to use instead of starting one."""

_HOST = "127.0.0.1"
_SUPERUSER = "postgres"
_OS_USER = "postgres"
_PG_CTL_TIMEOUT_S = 60
_READY_TIMEOUT_S = 30.0
_PORT_ATTEMPTS = 5
_INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl) were not found on PATH or in "
    "/usr/lib/postgresql/*/bin. Install them with `apt-get install postgresql` "
    f"(Debian/Ubuntu), or point {ENV_URL} at an existing server."
)

# Settings appended to postgresql.conf.  fsync/synchronous_commit/full_page_writes
# stay ON on purpose: the crash tests rely on real durability.
_SETTINGS: dict[str, str] = {
    "listen_addresses": f"'{_HOST}'",
    "max_connections": "200",
    "shared_buffers": "'128MB'",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "timezone": "'UTC'",
    "log_timezone": "'UTC'",
    "lc_messages": "'C'",
    "logging_collector": "off",
}

_PORT_IN_USE = re.compile(
    r"could not bind|address already in use|could not create any TCP/IP sockets",
    re.IGNORECASE,
)


def _version_key(path: Path) -> tuple[int, ...]:
    # /usr/lib/postgresql/<version>/bin -> numeric version for sorting.
    parts = re.findall(r"\d+", path.parent.name)
    return tuple(int(p) for p in parts) if parts else (-1,)


def find_pg_binaries() -> tuple[Path, Path]:
    """Return ``(initdb, pg_ctl)``: PATH first, then the newest /usr/lib/postgresql/*/bin."""
    initdb = shutil.which("initdb")
    if initdb is not None:
        # Prefer the pg_ctl that sits next to initdb (same major version).
        sibling = Path(initdb).resolve().parent / "pg_ctl"
        if sibling.is_file() and os.access(sibling, os.X_OK):
            return Path(initdb), sibling
        pg_ctl = shutil.which("pg_ctl")
        if pg_ctl is not None:
            return Path(initdb), Path(pg_ctl)
    candidates = sorted(
        (p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").is_file()),
        key=_version_key,
        reverse=True,
    )
    for bindir in candidates:
        if (bindir / "pg_ctl").is_file():
            return bindir / "initdb", bindir / "pg_ctl"
    raise RuntimeError(_INSTALL_HINT)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _temp_parent(as_other_user: bool) -> str:
    """Directory for the server's temp dir: short (unix socket paths are limited
    to ~107 bytes) and, when running as root, traversable by the postgres user."""
    parent = tempfile.gettempdir()
    if len(parent) > 60 or (as_other_user and not _traversable_by_others(parent)):
        parent = "/tmp"
    if as_other_user and not _traversable_by_others(parent):
        os.chmod(parent, os.stat(parent).st_mode | 0o011)
    return parent


def _traversable_by_others(path: str) -> bool:
    current = Path(path).resolve()
    for part in (current, *current.parents):
        if not os.stat(part).st_mode & 0o001:
            return False
    return True


class PostgresServer:
    """A throwaway PostgreSQL server (or a proxy for ``$AGENTCHECK_TEST_POSTGRES_URL``).

    Usage::

        with PostgresServer() as server:
            url = server.create_database()   # postgresql://postgres@127.0.0.1:PORT/test_...
    """

    def __init__(self, external_url: str | None = None, *, from_env: bool = True) -> None:
        """``external_url`` (or, if ``from_env``, ``$AGENTCHECK_TEST_POSTGRES_URL``)
        selects an existing server; otherwise ``start()`` launches a private one."""
        if external_url is None and from_env:
            external_url = os.environ.get(ENV_URL) or None
        self._external_url = external_url
        self._base_dir: Path | None = None
        self._port: int | None = None
        self._pg_ctl: Path | None = None
        self._os_user: pwd.struct_passwd | None = None
        self._running = False
        self._created: list[str] = []
        self._atexit_registered = False

    # ------------------------------------------------------------------ info

    @property
    def external(self) -> bool:
        """True when using ``$AGENTCHECK_TEST_POSTGRES_URL`` instead of an own server."""
        return self._external_url is not None

    @property
    def running(self) -> bool:
        return self._running

    @property
    def host(self) -> str:
        if self._external_url is not None:
            return urlsplit(self._external_url).hostname or ""
        return _HOST

    @property
    def port(self) -> int:
        if self._external_url is not None:
            return urlsplit(self._external_url).port or 5432
        if self._port is None:
            raise RuntimeError("PostgresServer is not started")
        return self._port

    @property
    def data_dir(self) -> Path:
        return self._require_base() / "data"

    @property
    def socket_dir(self) -> Path:
        return self._require_base() / "sock"

    @property
    def log_path(self) -> Path:
        return self._require_base() / "server.log"

    def url(self, dbname: str = "postgres") -> str:
        """``postgresql://postgres@127.0.0.1:PORT/<dbname>``."""
        db = quote(dbname, safe="")
        if self._external_url is not None:
            return urlsplit(self._external_url)._replace(path=f"/{db}").geturl()
        return f"postgresql://{_SUPERUSER}@{_HOST}:{self.port}/{db}"

    def log_tail(self, lines: int = 40) -> str:
        """Last lines of the server log (empty for external servers)."""
        if self._base_dir is None:
            return ""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # ------------------------------------------------------------- lifecycle

    def start(self) -> PostgresServer:
        """Start the server (no-op for external servers or if already running)."""
        if self._running:
            return self
        if self._external_url is not None:
            self._wait_ready(self._external_url)
            self._running = True
            return self

        initdb, pg_ctl = find_pg_binaries()
        self._pg_ctl = pg_ctl
        self._os_user = self._target_os_user()
        base = Path(
            tempfile.mkdtemp(prefix="agentcheck-pg-", dir=_temp_parent(self._os_user is not None))
        )
        self._base_dir = base
        self._register_atexit()
        try:
            (base / "sock").mkdir(mode=0o700)
            if self._os_user is not None:
                for path in (base, base / "sock"):
                    os.chown(path, self._os_user.pw_uid, self._os_user.pw_gid)
            self._run(
                [
                    str(initdb),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    _SUPERUSER,
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
                what="initdb",
            )
            self._write_config()
            self._start_on_free_port()
            self._running = True
            self._wait_ready(self.url())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (``pg_ctl stop -m fast``) and delete its directory.

        For an external server, drop the databases created through this object.
        Idempotent.
        """
        if self._external_url is not None:
            created, self._created = self._created, []
            for name in created:
                with contextlib.suppress(Exception):
                    self.drop_database(name)
            self._running = False
            return
        base = self._base_dir
        if base is None:
            return
        try:
            if (base / "data" / "postmaster.pid").exists():
                self._shutdown()
        finally:
            self._running = False
            self._port = None
            self._base_dir = None
            shutil.rmtree(base, ignore_errors=True)
            self._unregister_atexit()

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every open client connection is broken.

        Blocks until the server accepts connections again on the same port.
        """
        if self._external_url is not None:
            raise RuntimeError(
                f"PostgresServer.restart() needs a harness-owned server, but {ENV_URL} "
                "is set; unset it to let the test harness start its own PostgreSQL."
            )
        if not self._running:
            raise RuntimeError("PostgresServer.restart(): server is not running")
        self._pg_ctl_cmd("restart", "-m", "fast")
        self._wait_ready(self.url())

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        if self._external_url is not None:
            return f"PostgresServer(external={self.url()!r})"
        state = f"port={self._port}" if self._running else "stopped"
        return f"PostgresServer({state}, dir={self._base_dir})"

    # ------------------------------------------------------------- databases

    def create_database(self, name: str | None = None) -> str:
        """Create a new empty database and return its URL."""
        import psycopg
        from psycopg import sql

        if not self._running:
            raise RuntimeError("PostgresServer is not started")
        name = name or f"test_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self._admin_url(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self._created.append(name)
        return self.url(name)

    def drop_database(self, name_or_url: str) -> None:
        """Drop a database (by name or URL), terminating its connections."""
        import psycopg
        from psycopg import sql

        name = name_or_url
        if "://" in name_or_url:
            name = unquote(urlsplit(name_or_url).path.lstrip("/"))
        with psycopg.connect(self._admin_url(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        with contextlib.suppress(ValueError):
            self._created.remove(name)

    # -------------------------------------------------------------- internal

    def _admin_url(self) -> str:
        return self._external_url if self._external_url is not None else self.url()

    def _require_base(self) -> Path:
        if self._base_dir is None:
            raise RuntimeError("PostgresServer has no data directory (external or not started)")
        return self._base_dir

    @staticmethod
    def _target_os_user() -> pwd.struct_passwd | None:
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam(_OS_USER)
        except KeyError:
            raise RuntimeError(
                "PostgreSQL refuses to run as root and there is no 'postgres' OS user; "
                "`apt-get install postgresql` creates it (or run the tests as non-root)."
            ) from None

    def _command(self, argv: Sequence[str]) -> list[str]:
        if self._os_user is None:
            return list(argv)
        user = self._os_user.pw_name
        runuser = shutil.which("runuser")
        if runuser is not None:
            return [runuser, "-u", user, "--", *argv]
        su = shutil.which("su")
        if su is not None:
            return [su, "-s", "/bin/sh", user, "-c", shlex.join(argv)]
        raise RuntimeError("running as root needs `runuser` or `su` to drop to the postgres user")

    def _run(self, argv: Sequence[str], *, what: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C")
        try:
            result = subprocess.run(
                self._command(argv),
                cwd=self._base_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=_PG_CTL_TIMEOUT_S + 30,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{what} timed out\n{self.log_tail()}") from exc
        if result.returncode != 0:
            raise _CommandFailed(
                f"{what} failed (exit {result.returncode}): {shlex.join(argv)}\n"
                f"{result.stdout}{result.stderr}\n--- server log ---\n{self.log_tail()}"
            )
        return result

    def _pg_ctl_cmd(self, action: str, *extra: str) -> subprocess.CompletedProcess[str]:
        assert self._pg_ctl is not None
        argv = [
            str(self._pg_ctl),
            action,
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_path),
            "-w",
            "-t",
            str(_PG_CTL_TIMEOUT_S),
            *extra,
        ]
        return self._run(argv, what=f"pg_ctl {action}")

    def _write_config(self) -> None:
        settings = dict(_SETTINGS)
        settings["unix_socket_directories"] = f"'{self.socket_dir}'"
        lines = [f"{key} = {value}" for key, value in settings.items()]
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# --- agentcheck test harness ---\n" + "\n".join(lines) + "\n")

    def _start_on_free_port(self) -> None:
        # Another process may grab the port between probing and binding; retry.
        for attempt in range(_PORT_ATTEMPTS):
            port = _free_port()
            with (self.data_dir / "postgresql.conf").open("a") as conf:
                conf.write(f"port = {port}\n")  # the last "port" line wins
            self._port = port
            try:
                self._pg_ctl_cmd("start")
                return
            except _CommandFailed as exc:
                if attempt + 1 < _PORT_ATTEMPTS and _PORT_IN_USE.search(str(exc)):
                    continue
                raise

    def _shutdown(self) -> None:
        for mode in ("fast", "immediate"):
            try:
                self._pg_ctl_cmd("stop", "-m", mode)
                return
            except RuntimeError:
                continue
        # Last resort: SIGKILL the postmaster named in postmaster.pid.
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
            os.kill(pid, signal.SIGKILL)

    def _wait_ready(self, url: str) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                self._probe(url)
                return
            except Exception as exc:  # not ready yet
                last_error = exc
                time.sleep(0.05)
        raise RuntimeError(
            f"PostgreSQL at {url} not accepting connections after {_READY_TIMEOUT_S:.0f}s: "
            f"{last_error}\n{self.log_tail()}"
        )

    @staticmethod
    def _probe(url: str) -> None:
        try:
            import psycopg
        except ImportError:
            parts = urlsplit(url)
            socket.create_connection((parts.hostname or _HOST, parts.port or 5432), 2).close()
            return
        with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
            conn.execute("SELECT 1")

    def _register_atexit(self) -> None:
        if not self._atexit_registered:
            atexit.register(self._stop_at_exit)
            self._atexit_registered = True

    def _unregister_atexit(self) -> None:
        if self._atexit_registered:
            atexit.unregister(self._stop_at_exit)
            self._atexit_registered = False

    def _stop_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()


class _CommandFailed(RuntimeError):
    """A PostgreSQL command-line tool exited non-zero."""
