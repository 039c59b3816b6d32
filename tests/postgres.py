"""A throwaway PostgreSQL server for tests: Debian's binaries, a fresh cluster in a temporary
folder, listening on 127.0.0.1 on a free port, always stopped and removed."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from serving import free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(
            "PostgreSQL is not installed: run 'apt-get install postgresql' "
            "(scripts/install_system_packages.sh does, as root)"
        )
    return found[-1]


@contextmanager
def postgres_server() -> Iterator[str]:
    """Yields a SQLAlchemy URL of an empty database on a fresh server."""
    as_root = os.geteuid() == 0
    run_as = ["runuser", "-u", "postgres", "--"] if as_root else []
    home = Path(tempfile.mkdtemp(prefix="ma-pg-"))  # not under pytest's root-only folders
    data, sockets = home / "data", home / "sockets"
    sockets.mkdir()
    if as_root:
        shutil.chown(home, "postgres")
        shutil.chown(sockets, "postgres")
    port = free_port()
    user = "postgres" if as_root else os.environ.get("USER", "postgres")

    def run(*cmd: str) -> None:
        done = subprocess.run([*run_as, *cmd], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stdout}{done.stderr}")

    try:
        run(_bin("initdb"), "-D", str(data), "--auth=trust", "-U", user, "--no-sync")
        run(_bin("pg_ctl"), "-D", str(data), "-w", "-t", "60", "-l", str(home / "server.log"),
            "-o", f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start")  # fmt: skip
        try:
            run(_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", user, "studies")
            yield f"postgresql+psycopg2://{user}@127.0.0.1:{port}/studies"
        finally:
            run(_bin("pg_ctl"), "-D", str(data), "-w", "-m", "immediate", "stop")
    finally:
        shutil.rmtree(home, ignore_errors=True)
