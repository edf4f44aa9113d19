"""A built wheel carries everything the tool reads (presets, spaces, profiles, templates) and runs outside the checkout.

Why a real wheel: an editable install reads the checkout, so only a wheel shows
what ``pip install stageopt`` gives a user. The wheel is installed into a fresh
virtual environment; its dependencies are not downloaded again but lent from
this test run's environment through a ``.pth`` line, which keeps the test fast
(CI's own ``pip install -e '.[test]'`` into an empty venv already proves the
declared dependencies suffice). The search runs in a temporary directory, so
nothing can be found through the working directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

import stageopt

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.packaging


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the stageopt wheel built from this checkout; returns its bin/ folder."""
    if not (ROOT / "setup.py").is_file():
        pytest.skip("not running from a stageopt checkout")
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"  # a copy, so the build neither writes into the checkout nor picks up its leftovers
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "dist", "runs", "*.egg-info",
                                                                 "__pycache__", "venv"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist"), str(source)], cwd=base)
    (wheel,) = (base / "dist").glob("stageopt-*.whl")
    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=base).strip())
    (site / "_lent_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-compile",
          "--ignore-installed", str(wheel)], cwd=base)
    return env_dir / "bin"


def test_wheel_ships_its_data_and_searches_outside_the_checkout(wheel_env: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    probe = ("import json, stageopt.hardware as h, stageopt.frameworks as f, stageopt.model.load as m, "
             "stageopt.search.space as s; print(json.dumps({'dirs': [str(h.PRESETS_DIR), str(f.PROFILES_DIR), "
             "str(m.PRESET_DIR), str(s.SPACES_DIR)], 'names': h.list_hardware_presets() + f.list_profiles() + "
             "m.list_model_presets() + s.list_spaces()}))")
    found = json.loads(_run([str(wheel_env / "python"), "-c", probe], cwd=tmp_path, env=env))
    assert all(d.startswith(str(wheel_env.parent)) for d in found["dirs"]), found  # the installed copy, not the checkout
    for name in ("h100-sxm", "gb200-nvl72", "megatron-core", "torchtitan", "llama3-70b", "deepseek-v3", "default",
                 "codesign"):
        assert name in found["names"]

    version = _run([str(wheel_env / "stageopt"), "--version"], cwd=tmp_path, env=env)
    assert version.strip() == f"stageopt {stageopt.__version__}"

    out = json.loads(_run([str(wheel_env / "stageopt"), "search", "--budget", "50", "--seed", "1", "--json"],
                          cwd=tmp_path, env=env))
    # the analytical backend answers the (enumerable) default space from its census, exactly
    assert out["mode"] == "exact" and out["simulations"] >= out["feasible_plans_in_space"] > 0 and out["best"], out
    run_dir = tmp_path / "runs" / out["study"]
    written = {Path(p).name for p in out["files"]}
    assert {"best.json", "trials.csv", "history.png", "pareto.png"} <= written  # matplotlib is a core dependency
    assert all((run_dir / name).is_file() for name in written)
