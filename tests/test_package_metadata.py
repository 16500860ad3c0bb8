"""The install sets in pyproject.toml: `pip install -e .` (serving) brings no test or CUDA
tooling, and the dev extra keeps the upper bounds that hold the suite together on a fresh
install (issue 29). Reads pyproject.toml; installs nothing."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
NOT_FOR_SERVING = {"pytest", "triton", "ray", "playwright", "bitsandbytes", "schemathesis",
                   "peft", "accelerate", "matplotlib", "llama-cpp-python"}


def _project() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def _names(reqs: list[str]) -> set[str]:
    return {Requirement(r).name.lower().replace("_", "-") for r in reqs}


def test_serving_install_set_has_no_test_or_cuda_tooling():
    serving = _names(_project()["dependencies"])
    assert not serving & NOT_FOR_SERVING, serving & NOT_FOR_SERVING
    assert {"torch", "fastapi", "uvicorn", "transformers", "gguf"} <= serving


def test_dev_extra_bounds_pytest_below_the_release_schemathesis_breaks_on():
    dev = {Requirement(r).name: Requirement(r) for r in _project()["optional-dependencies"]["dev"]}
    assert Version("9.2.0") not in dev["pytest"].specifier
    assert Version("9.1.1") in dev["pytest"].specifier
    assert {"pytest", "playwright", "schemathesis", "triton", "ray", "bitsandbytes"} <= set(dev)
