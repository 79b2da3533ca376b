"""Views of a bundle that `diff` compares instead of the bundle itself.

A runtime capture records every op of the graph, named under the module that owns it (`conv1/Conv.0`);
a PyTorch module-level capture records module outputs only. Compared as they are, the runtime's op records
have no counterpart (or pair by order with records they are not), and a `diff` of the two bundles `compare`
kept said "55 candidate-only records" where `compare` said 0. `module_view` is what both compare.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..bundle import Bundle
from ..record import KIND_OUTPUT, KIND_RNG, TAG_DRAWS_RANDOM, TAG_QUANTIZED, TAG_REPLAYED, Record

LEVEL_MODULE, LEVEL_RUNTIME = "module", "runtime"
VIEW_KEY = "view"          # manifest key of a view: what it leaves out ("module": a runtime's op records)


def module_view(bundle: Bundle, shared_draws: Sequence[str] = (), differ: Sequence[str] = ()) -> Bundle:
    """The module-level records of a runtime bundle (names without an `/<op>.<k>` part), and its random draws.

    A PyTorch module capture has no op records; leaving the runtime's op records out keeps `diff`
    from pairing them by order with reference records that have no runtime counterpart. Random draws stay: a
    PyTorch module capture records them too, and `diff` pairs draw with draw (and says when the two draw
    otherwise). What the op records tell of their module stays as tags of its records: quantized arithmetic
    (an int8 port's ConvInteger) and random draws not replayed (a RandomNormalLike), so that `diff` gives the
    cause. `differ`: runtime draws that stand where the reference draws otherwise (`RuntimeDraws.differ`):
    a port difference at that draw, not noise.
    """
    carried: dict[str, set[str]] = {}
    shared = set(shared_draws) | set(differ)   # draws the reference took (compare's replay), or that differ
    for r in bundle.records:
        if "/" not in r.name:
            continue
        if TAG_QUANTIZED in r.tags:
            carried.setdefault(r.module, set()).add(TAG_QUANTIZED)
        if r.kind == KIND_RNG and TAG_REPLAYED not in r.tags and r.name not in shared:
            carried.setdefault(r.module, set()).add(TAG_DRAWS_RANDOM)
    keep = [r if r.kind != KIND_OUTPUT or not carried.get(r.module)
            else replace(r, tags=tuple(sorted(set(r.tags) | carried[r.module])))
            for r in bundle.records if "/" not in r.name or r.kind == KIND_RNG]
    view = Bundle(bundle.path, {**bundle.manifest, VIEW_KEY: LEVEL_MODULE}, keep, bundle._source)
    # looked up by name, the op records are still there: a quantized record's `quant:` tag names its scale and
    # its input's record, which `diff` reads to tell int8's error from a bug; and the ops that read a weight
    # pair it with the reference's (`align`'s readers: a MatMul reading a Linear's weight stored transposed)
    kept = {r.name for r in keep}
    view.hidden = tuple(r for r in bundle.records if r.name not in kept)
    view._by_name = {**{r.name: r for r in view.hidden}, **view._by_name}
    return view


def hidden_records(bundle: Bundle) -> tuple[Record, ...]:
    """The records a view leaves out of its `records` (a runtime's op records), none for a plain bundle."""
    return getattr(bundle, "hidden", ())


def every_record(bundle: Bundle) -> list[Record]:
    """The records of a bundle, a view's hidden ones included (what reads a weight, in the runtime's graph)."""
    return [*bundle.records, *hidden_records(bundle)]


def capture_level(bundle: Bundle) -> str | None:
    """The level a bundle was captured at (`module`, `op`, `runtime`), None when its manifest does not say."""
    return ((getattr(bundle, "manifest", None) or {}).get("capture") or {}).get("level")


def comparable_view(ref: Bundle, cand: Bundle) -> Bundle:
    """`cand` as `diff` compares it with `ref`: the module view of a runtime capture against a module-level
    reference (what `compare` compares; the runtime draws the reference replayed are found by their values),
    else `cand` itself (a view already, or captures at the same level)."""
    if capture_level(ref) != LEVEL_MODULE or capture_level(cand) != LEVEL_RUNTIME or cand.manifest.get(VIEW_KEY):
        return cand
    return module_view(cand, shared_draws=replayed_draws(ref, cand))


def replayed_draws(ref: Bundle, cand: Bundle) -> list[str]:
    """The runtime draws whose values a reference replayed (`compare --replay-rng`): each replayed draw of the
    reference matched, by shape and values, to one runtime draw not matched before."""
    import numpy as np

    taken: list[str] = []
    theirs = [r for r in cand.records if r.kind == KIND_RNG and r.has_tensor]
    for r in ref.records:
        if r.kind != KIND_RNG or TAG_REPLAYED not in r.tags or not r.has_tensor:
            continue
        mine = ref.numpy(r.name)
        for c in theirs:
            if c.name not in taken and tuple(c.shape) == tuple(r.shape) and \
                    np.array_equal(cand.numpy(c.name).astype(mine.dtype), mine):
                taken.append(c.name)
                break
    return taken
