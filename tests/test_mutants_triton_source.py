"""Source-patch mutants (mutants/triton_source.py): every patch still fits today's Triton
engine source, exactly where it was written for; the product modules carry no mutation
switch; a patched module lives in the cache, never in the package, and only its mutant
engine launches it."""
import importlib
import importlib.util
from pathlib import Path

import pytest

from bundlegen.engines.triton.engine import TritonEngine
from bundlegen.mutants import catalog as C
from bundlegen.mutants import triton_source as T

PATCHED = [m for m in C.CATALOG if m.kind == C.SOURCE_PATCH]
PRODUCT = Path(importlib.util.find_spec("bundlegen.engines.triton").origin).parent


@pytest.mark.parametrize("mutant", PATCHED, ids=lambda m: m.name)
def test_each_patch_applies_exactly_where_it_was_written(mutant):
    patch = mutant.patch
    assert isinstance(patch, T.Patch) and patch.edits
    original = (PRODUCT / f"{patch.module}.py").read_text(encoding="utf-8")
    for edit in patch.edits:
        assert original.count(edit.old) == edit.count, (mutant.name, edit.old)
    assert patch.source() != original


@pytest.mark.parametrize("path", sorted(PRODUCT.glob("*.py")), ids=lambda p: p.name)
def test_the_product_engine_carries_no_mutation_switch(path):
    text = path.read_text(encoding="utf-8")
    assert "MUT_" not in text and "mutant" not in text.lower()


def test_a_patch_that_no_longer_fits_fails_loudly():
    fits = T.Edit("    for it in range(0, group * n_m):\n", "    for it in range(0, n_m):\n")
    T.Patch("kernels", (fits,)).source()
    with pytest.raises(T.PatchError, match="expected 1 occurrence.*found 0"):
        T.Patch("kernels", (fits, T.Edit("no such line\n", ""))).source()
    with pytest.raises(T.PatchError, match="expected 1 occurrence.*found 2"):
        T.Patch("kernels", (T.Edit("z64 = tl.cast(0, tl.int64)", "z64 = 0"),)).source()


def test_a_patched_module_is_loaded_from_the_cache():
    patch = C.by_name("drop-tail-block").patch
    name = patch.load()
    module = importlib.import_module(name)
    assert name.startswith(T.MODULE_PREFIX) and Path(module.__file__).parent == T.cache_dir()
    assert not T.cache_dir().is_relative_to(PRODUCT.parent.parent)   # outside package and repo
    assert Path(module.__file__).read_text(encoding="utf-8") == patch.source()
    assert patch.load() == name                                  # one module per source
    assert C.by_name("masked-rows-nan").patch.load() != name
    importlib.reload(module)                                     # findable by its name
    from bundlegen.engines.triton import kernels
    assert Path(kernels.__file__).parent == PRODUCT               # the product is untouched


@pytest.mark.parametrize("name, attr", [("drop-tail-block", "kernels_module"),
                                        ("top-left-for-bottom-right", "launch_module")])
def test_the_mutant_engine_names_the_patched_module(name, attr):
    mutant = C.by_name(name).wrap(TritonEngine("cpu"))
    assert isinstance(mutant, T.Patched) and mutant.name == "triton"
    engine = mutant.inner
    assert isinstance(engine, TritonEngine)
    other = ({"kernels_module", "launch_module"} - {attr}).pop()
    assert getattr(engine, attr).startswith(T.MODULE_PREFIX)
    assert getattr(engine, other) == getattr(TritonEngine, other)
    assert not engine.launches_own_modules() and TritonEngine("cpu").launches_own_modules()


def test_the_32_bit_offsets_patch_fits_and_is_invisible_below_2_31():
    """offsets-32-bit (killed only at full on a GPU, by a span past 2^31 elements) fits the
    kernels once, changes only the offset's width, computes what the product computes on a
    small ragged batch, and is not applicable on the CPU (so the CPU gate leaves it out)."""
    import torch
    from tests import test_triton_ragged as TR

    patch = T.OFFSETS_32
    original = (PRODUCT / "kernels.py").read_text(encoding="utf-8")
    (edit,) = patch.edits
    assert original.count(edit.old) == 1 and "tl.int32" in edit.new
    assert patch.source().count("tl.int32") == original.count("tl.int32") + 1
    record = C.by_name("offsets-32-bit")
    assert record.needs_gpu and record.killed_by == "full"
    assert "offsets-32-bit" not in C.QUICK_CPU_NAMES and "needs a GPU" in record.not_applicable(TritonEngine, "cpu")
    assert record.not_applicable(TritonEngine, "cuda") is None
    mutant = T.Patched(TR.small_tile(TritonEngine)("cpu"), patch)
    assert not mutant.inner.launches_own_modules()
    graph = TR._graph(**TR.CASES["ragged"])
    outs = []
    for engine in (TR.SmallTileEngine("cpu"), mutant):
        run = TR.prepare(graph, seed=4)
        TR.check(run, engine)
        outs.append([run.storages[p].clone() for p in TR.OUTPUTS])
    assert all(torch.equal(TR._bits(a), TR._bits(b)) for a, b in zip(*outs))
