"""bench/ab.py compares this checkout with another tree: each side must import the tree it was given.
Until 2026-12-05 both sides ran from the checkout's directory, which `python -c` puts first on sys.path,
so the "base" imported this checkout's mrc/ and every ratio was the tree against itself."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]

_FAKE_LOOPBACK = '''
class LoopbackConfig:
    def __init__(self, size, seed):
        self.size = size

def loopback(cfg):
    return {"engine_pps": 4242.0, "engine_vs_wire_floor": 0.5, "bit_exact": True, "wall_s": 1.0}
'''


def _ab() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_ab", ROOT / "bench" / "ab.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_each_side_imports_its_own_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mrc" / "sim").mkdir(parents=True)
    (tmp_path / "mrc" / "__init__.py").write_text("")
    (tmp_path / "mrc" / "sim" / "__init__.py").write_text("")
    (tmp_path / "mrc" / "sim" / "loopback.py").write_text(_FAKE_LOOPBACK)
    monkeypatch.chdir(ROOT)  # where the benchmark is run from: the checkout, which has its own mrc/
    doc = _ab().run_one(tmp_path, 1 << 20, 1)
    assert doc["engine_pps"] == 4242.0  # the fake tree's figure, not a real run of the checkout's engine
