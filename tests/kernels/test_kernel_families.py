"""The CPU kernels build per family (kernels/cpu_ops.py FAMILIES): a GGUF or float Llama-family
model builds only the "core" module; the AWQ / GPTQ / int8 kernels are their own module, built
when such weights load. Checked on the built units (the object files of each module's build)."""

from __future__ import annotations

import subprocess
import sys

from pagedllm.kernels import cpu_ops


def _units(family: str) -> set[str]:
    """The units linked into the family's module by its last build (torch's build.ninja:
    `build <name>.so: link a.o b.o ...`; stale objects of older builds do not count)."""
    name = cpu_ops.module_name(family)
    text = (cpu_ops.build_dir(name) / "build.ninja").read_text()
    link = next(line for line in text.splitlines() if line.startswith(f"build {name}.so: link"))
    return {obj.removesuffix(".o") for obj in link.split("link", 1)[1].split()}


def test_families_partition_the_sources() -> None:
    core, ints = set(cpu_ops.FAMILIES["core"]), set(cpu_ops.FAMILIES["int"])
    assert not core & ints
    on_disk = {p.name for p in cpu_ops.sources("core")[0].parent.glob("*.cpp")}
    assert core | ints == on_disk  # every kernel source is in exactly one family
    assert "quant_int_cpu.cpp" in ints and "decode_layers_cpu.cpp" in core


def test_core_build_holds_no_int_kernels() -> None:
    assert cpu_ops.load() is not None
    assert _units("core") == {name.removesuffix(".cpp") for name in cpu_ops.FAMILIES["core"]}
    assert not hasattr(cpu_ops.load(), "int4_linear")
    assert cpu_ops.load_int() is not None
    assert _units("int") == {"quant_int_cpu", "quant_w8a8_cpu"}
    assert hasattr(cpu_ops.load_int(), "int4_linear")
    assert hasattr(cpu_ops.load_int(), "w8a8_linear") and not hasattr(cpu_ops.load(), "w8a8_linear")


def test_a_llama_family_run_loads_only_the_core_family(tiny_llama_dir) -> None:
    """A fresh process generating with a Llama-family checkpoint (attention, fused ops and the
    C++ decode loop are core kernels) and using the GGUF kernels never builds the int family."""
    code = (
        "from pagedllm import LLM, SamplingParams\n"
        "from pagedllm.kernels import cpu_ops\n"
        "from pagedllm.model.layers.quant import gguf, gguf_a8_panels\n"
        f"llm = LLM(model={str(tiny_llama_dir)!r}, num_threads=1, kv_cache_memory='8MiB')\n"
        "llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, temperature=0))\n"
        "assert gguf.available() and gguf_a8_panels.kernels() is not None\n"
        "print(sorted(cpu_ops.loaded_families()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "['core']", out.stdout
