"""Make an ONNX graph's intermediate values reachable: inline model-local functions, and the `If` branches
that this run's inputs decide.

Values inside an `If` branch or a function body are not graph values: they cannot be marked as outputs,
so a capture would see the `If` as one opaque op (an exported speech model often wraps its whole network
in an `If` on the sample rate). For a capture the inputs are known, so the branch each `If` takes is
known too: `inline_decided_ifs` evaluates the conditions with ONNX Runtime (the graph unchanged, the
conditions added as outputs), puts the nodes of the branch taken in place of each `If`, and repeats for
the `If`s that inlining brought to the top level. The result computes the same outputs for these inputs;
its nodes are named `/<If node>/then/<node>` (or `else`), so records say which branch they came from
(`If_0.then/Conv.0`).
`Loop` and `Scan` bodies stay opaque (captured at their boundary).

    >>> model, notes = inline_for_capture(onnx.load("vad.onnx"), feeds, run)   # doctest: +SKIP
    >>> notes
    ['inlined 25 If nodes decided by the inputs (3 rounds)']
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

MAX_ROUNDS = 16

RunFn = Callable[[Any, dict[str, np.ndarray], list[str]], dict[str, np.ndarray]]


def topologically_sorted(model: Any) -> Any | None:
    """`model` with its nodes in an order where every value is made before it is read, or None when they
    already are (or when they cannot be: a cycle, which ONNX Runtime then names).

    ONNX requires that order, but ONNX Runtime sorts for itself and so runs files that break it — such
    as those `onnxruntime.transformers.float16.convert_float_to_float16` writes, which append their
    input Casts at the end. Shape inference and record naming read nodes in file order."""
    import onnx

    from ._onnx_names import node_inputs

    nodes = list(model.graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = [sorted({producer[v] for v in node_inputs(n) if v in producer}) for n in nodes]
    if all(d < i for i, ds in enumerate(deps) for d in ds):
        return None
    order: list[int] = []
    state = [0] * len(nodes)   # 0 unseen, 1 on the stack, 2 placed
    for start in range(len(nodes)):   # depth first, iteratively: a long chain must not hit the recursion limit
        if state[start]:
            continue
        stack = [(start, iter(deps[start]))]
        state[start] = 1
        while stack:
            i, todo = stack[-1]
            d = next(todo, None)
            if d is None:
                stack.pop()
                state[i] = 2
                order.append(i)
            elif state[d] == 1:
                return None
            elif state[d] == 0:
                state[d] = 1
                stack.append((d, iter(deps[d])))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes[i] for i in order)
    return out


def seed_random_ops(model: Any) -> tuple[Any, int]:
    """`model` with a `seed` on every random op that has none: the k-th such op (in graph order) gets k.
    Returns the model (a copy when changed) and how many ops were seeded.

    Without a seed, ONNX Runtime's draws depend on how the session was built — a capture that marks
    other values, or runs the graph in other segments, draws other numbers — so two captures of one
    graph, or of a graph and its fp16 conversion, could not be compared at all. A seed the file sets is
    left as it is: a port that seeds differently from its reference is a finding."""
    import onnx

    from ._onnx_names import RNG_OPS

    todo = [i for i, n in enumerate(model.graph.node)
            if n.op_type in RNG_OPS and not any(a.name == "seed" for a in n.attribute)]
    if not todo:
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for k, i in enumerate(todo):
        out.graph.node[i].attribute.append(onnx.helper.make_attribute("seed", float(k)))
    return out, len(todo)


def inline_for_capture(model: Any, feeds: dict[str, np.ndarray], run: RunFn) -> tuple[Any, list[str]]:
    """`model` with local functions inlined and every `If` the inputs decide replaced by its branch.

    `run(model, feeds, names)` runs a model and returns the named values. Returns the (possibly same)
    model and notes saying what was done."""
    notes: list[str] = []
    if len(model.functions):
        import onnx.inliner

        n = len(model.functions)
        model = onnx.inliner.inline_local_functions(model)
        notes.append(f"inlined {n} model-local function(s)")
    inlined = rounds = 0
    while rounds < MAX_ROUNDS:
        ifs = [n for n in model.graph.node if n.op_type == "If"]
        if not ifs:
            break
        conds = _conditions(model, feeds, [n.input[0] for n in ifs], run)
        decided = {id(n): conds[n.input[0]] for n in ifs if conds.get(n.input[0]) is not None}
        if not decided:
            break
        model = _replace_ifs(model, decided)
        inlined += len(decided)
        rounds += 1
    if inlined:
        notes.append(f"inlined {inlined} If node(s) decided by the inputs ({rounds} round(s)); the captured graph "
                     f"computes the same outputs for these inputs only")
    return model, notes


def _conditions(model: Any, feeds: dict[str, np.ndarray], names: list[str], run: RunFn) -> dict[str, bool | None]:
    import onnx.numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    out: dict[str, bool | None] = {}
    wanted = []
    for name in dict.fromkeys(names):
        if name in inits:
            out[name] = _truth(onnx.numpy_helper.to_array(inits[name]))
        elif name in feeds:
            out[name] = _truth(feeds[name])
        else:
            wanted.append(name)
    if wanted:
        probe = _with_outputs(model, wanted)
        values = run(probe, feeds, wanted)
        out.update((n, _truth(values.get(n))) for n in wanted)
    return out


def _truth(value: Any) -> bool | None:
    if value is None:
        return None
    arr = np.asarray(value)
    return bool(arr.reshape(-1)[0]) if arr.size == 1 else None


def _with_outputs(model: Any, names: list[str]) -> Any:
    import onnx

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names if n not in have)
    return probe


def _replace_ifs(model: Any, decided: dict[int, bool]) -> Any:
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    taken = set(_defined(model.graph))
    nodes: list[Any] = []
    for node in model.graph.node:
        if id(node) not in decided:
            nodes.append(node)
            continue
        branch_name = "then_branch" if decided[id(node)] else "else_branch"
        branch = next(a.g for a in node.attribute if a.name == branch_name)
        nodes.extend(_branch_nodes(node, branch, "then" if decided[id(node)] else "else", taken, out.graph))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _defined(graph: Any) -> list[str]:
    names = [i.name for i in graph.input] + [i.name for i in graph.initializer]
    names += [o for n in graph.node for o in n.output if o]
    return names


def _branch_nodes(node: Any, branch: Any, side: str, taken: set[str], graph: Any) -> list[Any]:
    """The branch's nodes, renamed where they would clash, writing the `If`'s outputs."""
    import onnx

    # Named as the legacy exporter names scopes ("/decoder/If/then/Conv"), so the namer files the branch's
    # records under a module path "decoder.If.then" ("If_0.then" for an unscoped If).
    base = node.name or node.output[0]
    comps = base.split("/")[1:] if base.startswith("/") else [base]
    prefix = "/" + "/".join(c for c in [*comps, side] if c)
    rename: dict[str, str] = {}
    local = [i.name for i in branch.initializer] + [o for n in branch.node for o in n.output if o]
    for name in local:
        if name in taken:
            new, k = f"{prefix}/{name}", 1
            while new in taken:
                new, k = f"{prefix}/{name}.{k}", k + 1
            rename[name] = new
        taken.add(rename.get(name, name))
    # The branch's outputs become the If's outputs: rename a value made inside the branch once; copy others.
    made_here = {o for n in branch.node for o in n.output if o}
    outputs = [o.name for o in branch.output]
    copies = []
    for if_out, b_out in zip(node.output, outputs):
        if not if_out:
            continue
        if b_out in made_here and outputs.count(b_out) == 1:
            rename[b_out] = if_out   # the If's output name is unique to it: the producer writes it directly
        else:                        # an outer value passed through, or one value returned twice
            copies.append(onnx.helper.make_node("Identity", [rename.get(b_out, b_out)], [if_out],
                                                name=f"{prefix}/output.{if_out}"))
    for init in branch.initializer:
        new = onnx.TensorProto()
        new.CopyFrom(init)
        new.name = rename.get(init.name, init.name)
        graph.initializer.append(new)
    for vi in branch.value_info:
        new = onnx.ValueInfoProto()
        new.CopyFrom(vi)
        new.name = rename.get(vi.name, vi.name)
        graph.value_info.append(new)
    out = []
    for n in branch.node:
        new = onnx.NodeProto()
        new.CopyFrom(n)
        new.name = f"{prefix}/{n.name.lstrip('/') or n.op_type}"
        _rename_io(new, rename)
        out.append(new)
    return out + copies


def _rename_io(node: Any, rename: dict[str, str]) -> None:
    """Rename a node's inputs and outputs, and the outer-scope names its subgraphs read."""
    for i, v in enumerate(node.input):
        if v in rename:
            node.input[i] = rename[v]
    for i, v in enumerate(node.output):
        if v in rename:
            node.output[i] = rename[v]
    for a in node.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            inner = {i.name for i in g.input} | {i.name for i in g.initializer} | \
                {o for n in g.node for o in n.output}
            visible = {k: v for k, v in rename.items() if k not in inner}
            for n in g.node:
                _rename_io(n, visible)
            for o in g.output:
                if o.name in visible:
                    o.name = visible[o.name]


__all__ = ["inline_for_capture"]
