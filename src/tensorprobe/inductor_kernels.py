"""Which Inductor kernel computes which module call: the facts behind a compiled model's divergence.

When a compiled capture uses Inductor (`capture --compile`, `compare --runtime inductor`), its compile runs with
Inductor's provenance tracking on, and an `inner_compile` of ours reads, for each graph, the kernels Inductor
generated and the graph nodes each one computes. A node carries the module calls it was traced inside, so each
kernel is listed in the bundle's manifest (`capture.compile.kernels`) with the module calls it computes, the
reductions it holds and whether it is an external kernel (an ATen call such as a convolution or a matmul, the
same kernel eager runs) or code Inductor generated (`cpp_fused_...`, `triton_...`: ops fused into one loop,
reductions summed in Inductor's own order).

`kernel_facts` turns that list into a sentence about one record, for `compare` and `diff`:

    >>> kernels = [{"kernel": "cpp_fused_native_group_norm_0", "extern": False, "modules": ["gn", "act"],
    ...             "within": ["act", "gn"], "ops": ["elu", "native_group_norm", "var_mean"],
    ...             "reductions": ["var_mean"], "module_reductions": {"gn": ["var_mean"]}}]
    >>> print(kernel_facts(kernels, "gn", 0))
    Inductor fuses gn into one generated kernel with act (ops elu, native_group_norm, var_mean; it reduces (var_mean) for gn in Inductor's own order of summation)
    >>> print(kernel_facts(kernels, "act", 0))
    Inductor fuses act into one generated kernel with gn (ops elu, native_group_norm, var_mean)
"""

from __future__ import annotations

import json
from typing import Any, Callable

from .record import module_label, record_name

# aten ops whose result sums or compares over elements: their order of summation is Inductor's in a fused kernel
REDUCTIONS = frozenset({"sum", "mean", "var_mean", "var", "std", "std_mean", "amax", "amin", "max", "min", "prod",
                        "argmax", "argmin", "logsumexp", "cumsum", "cumprod", "norm", "linalg_vector_norm"})
PROVENANCE = {"trace.provenance_tracking_level": 1}   # Inductor's setting that records kernel -> nodes


class KernelRecorder:
    """An `inner_compile` for `torch._inductor.compile_fx.compile_fx`: compiles as Inductor does and records the
    kernels of each graph with the module calls they compute (`kernels`, a list of dicts as in the manifest).

    `where(node)` names the module calls a graph node was traced inside, outermost first, as (module path, call
    index) pairs: [("", 0)] for the model's own code outside any submodule, None for the nodes tensorprobe added
    (the statistics it fuses into the producers)."""

    def __init__(self, where: Callable[[Any], list[tuple[str, int]] | None]):
        self.where = where
        self.kernels: list[dict[str, Any]] = []

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        from torch._inductor.compile_fx import compile_fx_inner

        stacks, ops, reductions = {}, {}, {}
        for n in gm.graph.nodes:
            if n.op != "call_function":
                continue
            at = self.where(n)
            if at:
                stacks[n.name] = [record_name(path, call) for path, call in at]
                ops[n.name] = _op_name(n.meta.get("original_aten") or n.target)   # the op eager ran
                if _op_name(n.target) in REDUCTIONS:   # the op Inductor compiles (a decomposition's var_mean)
                    reductions[n.name] = _op_name(n.target)
        compiled = compile_fx_inner(gm, example_inputs, **kwargs)
        for handle, nodes in _kernel_nodes(compiled).items():
            mine = [n for n in nodes if n in stacks]
            if not mine:
                continue
            kernel = str(handle).rsplit(":", 1)[0]
            self.kernels.append({
                "kernel": kernel, "extern": kernel.startswith("extern_kernels."),
                "modules": list(dict.fromkeys(stacks[n][-1] for n in mine)),        # innermost calls
                "within": sorted({label for n in mine for label in stacks[n]}),    # and every call around them
                "ops": sorted({ops[n] for n in mine if ops[n]}),
                "reductions": sorted({reductions[n] for n in mine if n in reductions}),
                # whose reductions they are: a kernel that also computes the next conv's weight norm sums for it,
                # not for the activation fused beside it
                "module_reductions": {label: sorted({reductions[n] for n in mine
                                                     if n in reductions and label in stacks[n]})
                                      for label in sorted({lb for n in mine if n in reductions for lb in stacks[n]})}})
        return compiled


def _kernel_nodes(compiled: Any) -> dict[str, list[str]]:
    """Kernel (name:handle) -> the post-grad graph nodes it computes, from the provenance mapping Inductor keeps
    with a compiled graph (served from Inductor's FX graph cache as well). Empty when Inductor kept none."""
    text = getattr(compiled, "inductor_provenance_mapping_str", None)
    try:
        mapping = json.loads(text) if text else {}
    except ValueError:
        return {}
    got = mapping.get("cppCodeToPost") if isinstance(mapping, dict) else None   # C++ and Triton kernels alike
    return got if isinstance(got, dict) else {}


def _op_name(target: Any) -> str:
    """"aten._native_batch_norm_legit.no_stats" -> "_native_batch_norm_legit"; "" for a non-aten target."""
    schema = getattr(target, "_schema", None)
    return schema.name.split("::")[-1] if schema is not None else ""


def kernel_facts(kernels: list[dict[str, Any]] | None, module: str, call: int = 0) -> str | None:
    """What Inductor did with the call `call` of `module` (and the module calls inside it), in one sentence; None
    when the capture recorded no kernels (another backend, or a bundle without them)."""
    if not kernels:
        return None
    me = record_name(module, call)
    mine = [k for k in kernels if me in k.get("within", k["modules"])]
    if not mine:
        return None
    label = module_label(me)
    fused = [k for k in mine if not k["extern"]]
    extern = list(dict.fromkeys(k["kernel"].removeprefix("extern_kernels.") for k in mine if k["extern"]))
    if not fused:
        return (f"Inductor runs {label} as external kernels ({', '.join(extern)}): the ATen kernels eager runs "
                "too, so the difference comes in with their inputs")
    parts = []
    for k in fused[:3]:
        others = [module_label(m) for m in k["modules"] if me not in _around(kernels, m)]
        with_ = (f" with {', '.join(others[:4])}" + (" and others" if len(others) > 4 else "")) if others else ""
        own = k.get("module_reductions", {}).get(me, k["reductions"] if "module_reductions" not in k else [])
        red = f"; it reduces ({', '.join(own)}) for {label} in Inductor's own order of summation" if own else ""
        parts.append(f"one generated kernel{with_} (ops {', '.join(k.get('ops', []))}{red})")
    more = f", and {len(fused) - 3} more" if len(fused) > 3 else ""
    ext = f"; external kernels: {', '.join(extern)}" if extern else ""
    return f"Inductor fuses {label} into {'; '.join(parts)}{more}{ext}"


def divergence_fact(ref: Any, cand: Any, name: str) -> str | None:
    """`kernel_facts` for the record `name` of the reference bundle `ref`, from the kernels the candidate bundle
    recorded: a `capture --compile` bundle keeps them in `capture.compile`, a compare's runtime capture in
    `runtime.compile`. None when the candidate recorded none or `ref` has no such record."""
    compiled = (cand.manifest.get("capture") or {}).get("compile") or cand.runtime.get("compile") or {}
    record = ref.get(name) if compiled.get("kernels") else None
    return kernel_facts(compiled.get("kernels"), record.module, record.call) if record is not None else None


def _around(kernels: list[dict[str, Any]], label: str) -> set[str]:
    """The calls `label` runs inside (itself included), as the kernels recorded them."""
    for k in kernels:
        if label in k["modules"]:
            return {w for w in k.get("within", ()) if label == w or _contains(w, label)}
    return {label}


def _contains(outer: str, inner: str) -> bool:
    path = outer.split("@")[0]
    return path == "<root>" or inner.split("@")[0].startswith(path + ".")


__all__ = ["KernelRecorder", "PROVENANCE", "REDUCTIONS", "divergence_fact", "kernel_facts"]
