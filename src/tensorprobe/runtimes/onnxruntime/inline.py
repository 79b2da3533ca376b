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
`Loop` and `Scan` nodes whose iteration count the inputs fix (a `Loop` with a trip count and a condition
its body passes through unchanged, as exported `for` loops are; any `Scan`) are unrolled the same way:
iteration k's nodes carry the scope `<Loop node>@k`, so records read `Loop_0@3/MatMul.0`, as the 4th call
of a PyTorch module reads `rnn@3`. A `Loop` that stops on a condition its body computes (a `while` loop:
an autoregressive decoder's stop token) is run once with its iteration number as an extra scan output,
which counts its iterations on these inputs, and is then unrolled that many times; a note says so.

    >>> model, notes = inline_for_capture(onnx.load("vad.onnx"), feeds, run)   # doctest: +SKIP
    >>> notes                                                                      # doctest: +SKIP
    ['inlined 25 If nodes decided by the inputs (3 rounds)']
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

MAX_ROUNDS = 16
MAX_UNROLLED_NODES = 50_000   # a Loop or Scan that would unroll to more nodes stays one op

RunFn = Callable[[Any, dict[str, np.ndarray], list[str]], dict[str, np.ndarray]]


def topologically_sorted(model: Any) -> Any | None:
    """`model` with its nodes in an order where every value is made before it is read, or None when they
    already are (or when they cannot be: a cycle, which ONNX Runtime then names).

    ONNX requires that order, but ONNX Runtime sorts for itself and so runs files that break it — such
    as those `onnxruntime.transformers.float16.convert_float_to_float16` writes, which append their
    input Casts at the end. Shape inference and record naming read nodes in file order."""
    import onnx

    from .names import node_inputs

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

    from .names import RNG_OPS

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
    inlined = unrolled = rounds = 0
    while rounds < MAX_ROUNDS:
        ifs = [n for n in model.graph.node if n.op_type == "If"]
        loops = [n for n in model.graph.node if n.op_type in ("Loop", "Scan")]
        if not ifs and not loops:
            break
        names = [n.input[0] for n in ifs] + [v for n in loops for v in _count_inputs(n)]
        values, ran = _probe_with_counters(model, feeds, names, run)
        decided = {id(n): _truth(values.get(n.input[0])) for n in ifs}
        decided = {k: v for k, v in decided.items() if v is not None}
        counts = {id(n): c for n in loops if (c := _iterations(n, values, notes, ran.get(id(n)))) is not None}
        if not decided and not counts:
            break
        model = _replace(model, decided, counts)
        inlined += len(decided)
        unrolled += len(counts)
        rounds += 1
    if inlined:
        notes.append(f"inlined {inlined} If node(s) decided by the inputs ({rounds} round(s)); the captured graph "
                     f"computes the same outputs for these inputs only")
    if unrolled:
        notes.append(f"unrolled {unrolled} Loop/Scan node(s) whose iteration count the inputs fix; records of "
                     f"iteration k are named <node>@k")
    return model, notes


def _count_inputs(node: Any) -> list[str]:
    """The values that fix how often a Loop or Scan runs: the Loop's trip count and first condition, the
    first scan input of a Scan (its length)."""
    if node.op_type == "Loop":
        return [v for v in node.input[:2] if v]
    n_scan = _attr(node, "num_scan_inputs", 0)
    return [node.input[len(node.input) - n_scan]] if n_scan else []


def _probe_with_counters(model: Any, feeds: dict[str, np.ndarray], names: list[str],
                         run: RunFn) -> tuple[dict[str, Any], dict[int, int]]:
    """`_probe`, and how many times each Loop whose body computes its own condition ran on these inputs
    (node id -> count). Such a loop is counted by giving its body one more scan output, a copy of its
    iteration number, in a copy of the model: its length is the count. Where ONNX Runtime refuses that
    copy, the loops go uncounted (captured as one op)."""
    import onnx
    from onnx import helper

    dynamic = [i for i, n in enumerate(model.graph.node) if n.op_type == "Loop" and not
               _passes_condition_through(_attr(n, "body"))]
    if not dynamic:
        return _probe(model, feeds, names, run), {}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    taken = set(_defined(model.graph))
    counters: dict[int, str] = {}
    for i in dynamic:
        node = probe.graph.node[i]
        body = next(a.g for a in node.attribute if a.name == "body")
        name = f"{node.output[0] or node.name}.tensorprobe_iterations"
        while name in taken:
            name += "_"
        taken.add(name)
        body.node.append(helper.make_node("Identity", [body.input[0].name], [f"{name}.step"]))
        body.output.append(helper.make_tensor_value_info(f"{name}.step", onnx.TensorProto.INT64, []))
        node.output.append(name)
        counters[id(model.graph.node[i])] = name
    try:
        values = _probe(probe, feeds, names + list(counters.values()), run)
    except Exception:   # the counted copy is refused: count nothing rather than lose the Ifs
        return _probe(model, feeds, names, run), {}
    return values, {k: int(np.asarray(values[v]).shape[0]) for k, v in counters.items() if v in values}


def _iterations(node: Any, values: dict[str, Any], notes: list[str], ran: int | None = None) -> int | None:
    """How many times a Loop or Scan runs on these inputs, or None (with a note) when that is not fixed.
    `ran`: how many times a Loop that computes its own condition ran on these inputs (measured)."""
    body = _attr(node, "body")
    label = node.name or node.output[0]
    if node.op_type == "Scan":
        axes = _attr(node, "scan_input_axes", [0])
        first_scan = _count_inputs(node)
        value = np.asarray(values[first_scan[0]]) if first_scan and first_scan[0] in values else None
        if value is None:
            return None
        count = int(value.shape[axes[0] % value.ndim])
    else:
        trip = values.get(node.input[0]) if node.input[0] else None
        first = _truth(values.get(node.input[1])) if len(node.input) > 1 and node.input[1] else True
        if not _passes_condition_through(body):
            if ran is None:
                notes.append(f"{node.op_type} {label} stops on a condition its body computes: captured as one op")
                return None
            count = ran
            notes.append(f"{node.op_type} {label} stops on a condition its body computes; it ran {count} time(s) "
                         f"on these inputs and is unrolled that many times")
        elif trip is None:
            notes.append(f"{node.op_type} {label} has no trip count: captured as one op")
            return None
        else:
            count = int(np.asarray(trip).reshape(-1)[0]) if first else 0
    if count < 1 or count * len(body.node) > MAX_UNROLLED_NODES:
        notes.append(f"{node.op_type} {label} runs {count} time(s): captured as one op")
        return None
    return count


def _passes_condition_through(body: Any) -> bool:
    """The body's condition output is its condition input (an exported `for` loop), or constant true."""
    cond_in, cond_out = body.input[1].name, body.output[0].name
    seen = cond_out
    made = {o: n for n in body.node for o in n.output}
    while seen in made and made[seen].op_type == "Identity":
        seen = made[seen].input[0]
    if seen == cond_in:
        return True
    node = made.get(seen)
    if node is not None and node.op_type == "Constant":
        import onnx.numpy_helper

        t = next((a.t for a in node.attribute if a.name == "value"), None)
        return t is not None and bool(onnx.numpy_helper.to_array(t).all())
    return False


def _attr(node: Any, name: str, default: Any = None) -> Any:
    import onnx.helper

    a = next((a for a in node.attribute if a.name == name), None)
    return default if a is None else onnx.helper.get_attribute_value(a)


def _probe(model: Any, feeds: dict[str, np.ndarray], names: list[str], run: RunFn) -> dict[str, Any]:
    """The values of `names` on these inputs: from initializers and feeds, the rest from one run."""
    import onnx.numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    out: dict[str, Any] = {}
    wanted = []
    for name in dict.fromkeys(names):
        if name in inits:
            out[name] = onnx.numpy_helper.to_array(inits[name])
        elif name in feeds:
            out[name] = feeds[name]
        else:
            wanted.append(name)
    if wanted:
        out.update(run(_with_outputs(model, wanted), feeds, wanted))
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


def _replace(model: Any, decided: dict[int, bool], counts: dict[int, int]) -> Any:
    """`model` with each decided If replaced by its branch and each counted Loop/Scan unrolled."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    taken = set(_defined(model.graph))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    nodes: list[Any] = []
    for node in model.graph.node:
        if id(node) in decided:
            branch_name = "then_branch" if decided[id(node)] else "else_branch"
            branch = next(a.g for a in node.attribute if a.name == branch_name)
            nodes.extend(_branch_nodes(node, branch, "then" if decided[id(node)] else "else", taken, out.graph))
        elif id(node) in counts:
            nodes.extend(_unrolled(node, counts[id(node)], taken, out.graph, opset))
        else:
            nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _unrolled(node: Any, count: int, taken: set[str], graph: Any, opset: int) -> list[Any]:
    """A Loop or Scan as `count` copies of its body, wired iteration to iteration, writing its outputs.

    Iteration k's nodes get the scope `<node>@k` (metadata the namer reads), its values unique names."""
    import json

    import onnx
    from onnx import helper

    from .names import SCOPE_KEY, _legacy_components, _scope_from_metadata

    body = _attr(node, "body")
    label = (node.name or node.output[0]).strip("/").split("/")[-1]
    outer = list(_scope_from_metadata(node) or [(".".join(_legacy_components(node.name) or []), 0)])
    outer = [list(c) for c in outer if c[0]]
    path = f"{outer[-1][0]}.{label}" if outer else label
    is_loop = node.op_type == "Loop"
    n_scan_in = 0 if is_loop else _attr(node, "num_scan_inputs", 0)
    n_state = len(node.input) - (2 if is_loop else n_scan_in)
    state = [v for v in node.input[2:]] if is_loop else list(node.input[:n_state])
    scan_in = [] if is_loop else list(node.input[n_state:])
    in_axes = _attr(node, "scan_input_axes", [0] * n_scan_in) if not is_loop else []
    in_dirs = _attr(node, "scan_input_directions", [0] * n_scan_in) if not is_loop else []
    n_scan_out = len(body.output) - (1 if is_loop else 0) - n_state
    out_axes = _attr(node, "scan_output_axes", [0] * n_scan_out) if not is_loop else [0] * n_scan_out
    out_dirs = _attr(node, "scan_output_directions", [0] * n_scan_out) if not is_loop else [0] * n_scan_out
    body_in = [i.name for i in body.input]
    body_out = [o.name for o in body.output][(1 if is_loop else 0):]
    made = {o for n in body.node for o in n.output if o}

    def unique(name: str) -> str:
        new, k = name, 1
        while new in taken:
            new, k = f"{name}.{k}", k + 1
        taken.add(new)
        return new

    def const(name: str, value: np.ndarray) -> str:
        name = unique(name)
        graph.initializer.append(onnx.numpy_helper.from_array(value, name))
        return name

    def scoped(n: Any, k: int) -> Any:
        n.metadata_props.append(onnx.StringStringEntryProto(key=SCOPE_KEY, value=json.dumps([*outer, [path, k]])))
        return n

    nodes: list[Any] = []
    scans: list[list[str]] = [[] for _ in range(n_scan_out)]
    for k in range(count):
        prefix = f"/{path}@{k}"
        rename = {v: unique(f"{prefix}/{v}") for v in [*body_in, *made, *(i.name for i in body.initializer)]}
        if is_loop:
            nodes.append(scoped(helper.make_node("Identity", [const(f"{prefix}/iteration", np.array(k, np.int64))],
                                                 [rename[body_in[0]]], name=f"{prefix}/iteration"), k))
            nodes.append(scoped(helper.make_node("Identity", [const(f"{prefix}/cond", np.array(True))],
                                                 [rename[body_in[1]]], name=f"{prefix}/cond"), k))
            carried_in = body_in[2:]
        else:
            carried_in = body_in[:n_state]
            for j, v in enumerate(scan_in):
                index = k if not in_dirs[j] else count - 1 - k
                nodes.append(scoped(helper.make_node(
                    "Gather", [v, const(f"{prefix}/index", np.array(index, np.int64))],
                    [rename[body_in[n_state + j]]], name=f"{prefix}/slice.{j}", axis=in_axes[j]), k))
        for j, v in enumerate(carried_in):
            nodes.append(scoped(helper.make_node("Identity", [state[j]], [rename[v]], name=f"{prefix}/state.{j}"), k))
        for init in body.initializer:
            new = onnx.TensorProto()
            new.CopyFrom(init)
            new.name = rename[init.name]
            graph.initializer.append(new)
        for n in body.node:
            new = onnx.NodeProto()
            new.CopyFrom(n)
            new.name = f"{prefix}/{n.name.lstrip('/') or n.op_type}"
            del new.metadata_props[:]
            _rename_io(new, rename)
            nodes.append(scoped(new, k))
        outs = [rename.get(o, o) for o in body_out]
        state = outs[:n_state]
        for j in range(n_scan_out):
            scans[j].append(outs[n_state + j])
    for j, o in enumerate(node.output[:n_state]):
        if o:
            nodes.append(helper.make_node("Identity", [state[j]], [o], name=f"/{path}/output.{j}"))
    for j, o in enumerate(node.output[n_state:]):
        if not o:
            continue
        parts = scans[j] if not out_dirs[j] else scans[j][::-1]
        axis = out_axes[j]
        expanded = []
        for t, v in enumerate(parts):
            e = unique(f"/{path}/{o}.{t}")
            if opset >= 13:
                nodes.append(helper.make_node("Unsqueeze", [v, const(f"/{path}/axes", np.array([axis], np.int64))],
                                              [e], name=f"/{path}/stack.{j}.{t}"))
            else:
                nodes.append(helper.make_node("Unsqueeze", [v], [e], name=f"/{path}/stack.{j}.{t}", axes=[axis]))
            expanded.append(e)
        nodes.append(helper.make_node("Concat", expanded, [o], name=f"/{path}/output.{n_state + j}", axis=axis))
    return nodes


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
