"""A throwaway PostgreSQL server for the tests: a fresh cluster in a temporary directory on a free loopback port.

Skips (with the reason) only where the PostgreSQL binaries are absent. As root
the server runs as the ``postgres`` user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator

import pytest


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return versions[-1] if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[str]:
    """Yield ``postgresql://stageopt@127.0.0.1:PORT/postgres``; the cluster is stopped and deleted afterwards."""
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL binaries initdb/pg_ctl not found (install postgresql to run the database tests)")
    root = tempfile.mkdtemp(prefix="stageopt-pg-")
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root)
            pytest.skip("running as root and there is no 'postgres' user to run the server as")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = os.path.join(root, "data"), _free_port()
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT, "check": True, "timeout": 60}
    try:
        subprocess.run([*as_user, initdb, "-D", data, "-U", "stageopt", "--auth=trust", "-E", "UTF8", "--no-sync"],
                       **quiet)
        subprocess.run([*as_user, pg_ctl, "-D", data, "-l", os.path.join(root, "server.log"), "-w", "-o",
                        f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"], **quiet)
    except subprocess.CalledProcessError as err:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"could not start a throwaway PostgreSQL: {err}")
    try:
        yield f"postgresql://stageopt@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", data, "-m", "immediate", "-w", "stop"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.STDOUT, timeout=60)
        shutil.rmtree(root, ignore_errors=True)
