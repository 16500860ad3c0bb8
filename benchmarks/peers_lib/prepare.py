"""Prepare the llama.cpp peers under a cache directory, once.

    PEER_DIR/
      peers.json                       manifest: versions, binary paths, build seconds
      sdist/llama_cpp_python-V.tar.gz  `pip download --no-binary :all: --no-deps llama-cpp-python`
      src/llama_cpp_python-V/          the unpacked sdist; llama.cpp is vendor/llama.cpp
      build-V/bin/llama-{batched-bench,bench,server}

`llama-cpp-python` itself is pip-installed from the same sdist, so the Python bindings and
the binaries are the same llama.cpp. Both builds stream their output lines and a percentage
(CMake's `[ NN%]` markers) through `logging`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

logger = logging.getLogger("benchmarks.peers")

DEFAULT_PEER_DIR = "~/.cache/pagedllm/peers"
TARGETS = ("llama-batched-bench", "llama-bench", "llama-server")
MANIFEST = "peers.json"
_PERCENT = re.compile(r"^\[\s*(\d+)%\]")  # make / CMake: "[ 42%] Building ..."
_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")  # ninja (pip's scikit-build-core): "[41/193] ..."


def peer_dir(path: str | os.PathLike | None) -> Path:
    return Path(path or DEFAULT_PEER_DIR).expanduser().resolve()


def load_manifest(root: Path) -> dict:
    """What `prepare` recorded, or {} if nothing was prepared under `root`."""
    try:
        return json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def llama_binaries(root: Path) -> dict[str, Path] | None:
    """Paths of the built llama.cpp tools, or None when any of them is missing."""
    bins = load_manifest(root).get("binaries", {})
    paths = {name: Path(bins.get(name, "")) for name in TARGETS}
    return paths if all(p.is_file() and os.access(p, os.X_OK) for p in paths.values()) else None


def bindings_installed() -> bool:
    """Whether llama-cpp-python is importable."""
    return importlib.util.find_spec("llama_cpp") is not None


def stream(cmd: list[str], *, cwd: Path | None = None, env: dict | None = None,
           label: str) -> None:
    """Run `cmd`, logging each output line (with the build's percentage when it shows one)."""
    logger.info("[%s] $ %s", label, " ".join(map(str, cmd)))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    tail: list[str] = []
    pct = None
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-40:]
        stripped = line.strip()
        if m := _PERCENT.match(stripped):
            pct = int(m.group(1))
        elif m := _NINJA.match(stripped):
            pct = 100 * int(m.group(1)) // max(int(m.group(2)), 1)
        prefix = f"[{label} {pct:3d}% {time.perf_counter() - t0:5.0f}s]" if pct is not None \
            else f"[{label} {time.perf_counter() - t0:5.0f}s]"
        logger.info("%s %s", prefix, line)
    if proc.wait() != 0:
        raise RuntimeError(f"{label} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def _download_sdist(root: Path) -> Path:
    dest = root / "sdist"
    found = sorted(dest.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        dest.mkdir(parents=True, exist_ok=True)
        stream([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                "-d", str(dest), "llama-cpp-python"],
               label="pip download")
        found = sorted(dest.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise RuntimeError(f"no llama_cpp_python-*.tar.gz in {dest} after pip download")
    return found[-1]


def _version(sdist: Path) -> str:
    return sdist.name.removeprefix("llama_cpp_python-").removesuffix(".tar.gz")


def _unpack(sdist: Path, root: Path) -> Path:
    src = root / "src" / sdist.name.removesuffix(".tar.gz")
    if not (src / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        src.parent.mkdir(parents=True, exist_ok=True)
        logger.info("unpacking %s", sdist)
        with tarfile.open(sdist) as tar:
            tar.extractall(src.parent, filter="data")
    return src


def cmake_options(llama_src: Path) -> list[str]:
    """Release, static, nothing fetched at build time (no curl / OpenSSL, no web-UI download);
    only the options this llama.cpp version declares (LLAMA_CURL, say, is deprecated in newer
    ones)."""
    declared = set()
    for path in [llama_src / "CMakeLists.txt", *sorted((llama_src / "ggml").glob("CMakeLists.txt"))]:
        declared |= set(re.findall(r"option\(\s*(\w+)", path.read_text()))
    wanted = {"LLAMA_CURL": "OFF", "LLAMA_OPENSSL": "OFF", "LLAMA_BUILD_TESTS": "OFF",
              "LLAMA_USE_PREBUILT_UI": "OFF", "LLAMA_BUILD_UI": "OFF",
              "LLAMA_BUILD_EXAMPLES": "ON", "LLAMA_BUILD_SERVER": "ON", "LLAMA_BUILD_TOOLS": "ON",
              "BUILD_SHARED_LIBS": "OFF", "GGML_NATIVE": "ON"}
    opts = ["-DCMAKE_BUILD_TYPE=Release"]
    for name, value in wanted.items():
        if name in declared:
            opts.append(f"-D{name}={value}")
        else:
            logger.info("cmake option %s not declared by this llama.cpp; not set", name)
    return opts


def _build_llama_cpp(src: Path, root: Path, version: str, jobs: int) -> dict[str, str]:
    llama_src = src / "vendor" / "llama.cpp"
    build = root / f"build-{version}"
    stream(["cmake", "-S", str(llama_src), "-B", str(build), *cmake_options(llama_src)],
           label="cmake configure")
    stream(["cmake", "--build", str(build), "--config", "Release", "--target", *TARGETS,
            f"-j{jobs}"], label="cmake build")
    bins = {}
    for name in TARGETS:
        hits = [p for p in (build / "bin" / name, build / name) if p.is_file()]
        hits = hits or sorted(build.rglob(name))
        if not hits:
            raise RuntimeError(f"{name} was not produced under {build}")
        bins[name] = str(hits[0])
    return bins


def _tool_version(binary: Path) -> str:
    """First line of `llama-bench --version`, e.g. "version: 0.5.0-dev (build 1, commit 0c1e570)"."""
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return lines[0].removeprefix("version: ") if lines else "unknown"


def _install_bindings(sdist: Path, jobs: int) -> None:
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=str(jobs))
    stream([sys.executable, "-m", "pip", "install", "-v", str(sdist)], env=env,
           label="pip install llama-cpp-python")


def prepare(root: Path, *, jobs: int = 2, bindings: bool = True, binaries: bool = True) -> dict:
    """Download, build and record the llama.cpp peers under `root`; skips what is done."""
    root.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(root)
    t_all = time.perf_counter()
    sdist = _download_sdist(root)
    version = _version(sdist)
    manifest.update(sdist=str(sdist), llama_cpp_python_version=version)
    src = _unpack(sdist, root)
    if binaries and (llama_binaries(root) is None or manifest.get("built_from") != version):
        t0 = time.perf_counter()
        manifest["binaries"] = _build_llama_cpp(src, root, version, jobs)
        manifest["built_from"] = version
        manifest["binaries_build_s"] = round(time.perf_counter() - t0, 1)
        (root / MANIFEST).write_text(json.dumps(manifest, indent=2))
    else:
        logger.info("llama.cpp binaries already built under %s", root)
    if binaries:
        manifest["llama_cpp_version"] = _tool_version(Path(manifest["binaries"]["llama-bench"]))
    if bindings and not bindings_installed():
        t0 = time.perf_counter()
        _install_bindings(sdist, jobs)
        manifest["bindings_install_s"] = round(time.perf_counter() - t0, 1)
    else:
        logger.info("llama-cpp-python %s", "already installed" if bindings else "not wanted")
    if any(k in manifest for k in ("binaries_build_s", "bindings_install_s")) and \
            time.perf_counter() - t_all > 60:  # keep the real build's time over a no-op's
        manifest["prepare_s"] = round(time.perf_counter() - t_all, 1)
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2))
    logger.info("peers prepared under %s in %.0f s", root, time.perf_counter() - t_all)
    return manifest
