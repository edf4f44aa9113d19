"""Fixtures for the Chakra tests: the reference trace sets, extracted once per session.

The reference tarballs live in ``../shared`` beside the repository; without it
the tests that need them skip.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
TRACES = SHARED / "reference" / "traces"
STAGE_SETS = ("dense_dp2_tp2_pp2", "dense_dp2_tp2_pp2_mb4", "llama_mp_dp2_tp2_pp2")
MICROBENCH_SETS = ("all_gather", "all_reduce", "all_to_all", "reduce_scatter")


def _extract(tarball: Path, dest: Path) -> Path:
    if not tarball.is_file():
        pytest.skip(f"reference traces not available: {tarball}")
    with tarfile.open(tarball) as tar:
        tar.extractall(dest, filter="data")
    return dest


@pytest.fixture(scope="session")
def stage_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder holding STAGE's three 8-GPU trace sets."""
    return _extract(TRACES / "stage_8gpu.tar.gz", tmp_path_factory.mktemp("stage"))


@pytest.fixture(scope="session")
def microbench_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder holding ASTRA-sim's 8-NPU single-collective traces (``<coll>/8npus_1MB``)."""
    return _extract(TRACES / "astrasim_microbench_8npus.tar.gz", tmp_path_factory.mktemp("micro"))
