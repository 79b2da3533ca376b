"""Capture a model as `torch.compile` runs it: the values of the compiled graph, named like an eager capture.

`tp.capture(model, *inputs, compile=True, backend="inductor")` compiles `model` with a torch.compile backend of
our own. It receives each FX graph dynamo traces, adds the statistics of the values it records as extra graph
outputs, and hands that instrumented graph to the real backend (Inductor's `compile_fx`, `aot_eager`, any
registered backend). Inductor then computes the statistics inside the kernels that produce the values: Σx, Σx²,
min, max and the NaN/±Inf counts of a value are reductions over the same loop that writes it. The wrapper it
returns strips the extra outputs before dynamo sees them and turns them into records.

Names are an eager capture's, so `tensorprobe diff eager compiled` lines the two up:

- **module level**: each FX node carries `nn_module_stack`, the module calls it was traced inside (with the call
  index, `@1`, for a module called again). A module call's outputs are the nodes of that call whose value is used
  outside it; they are recorded as `<path>[@call][:i]`, in the order the calls end, as forward hooks would.
- **op level** (`aot_eager`): the graph after AOT autograd, whose nodes are aten ops; each is named
  `<module>[@call]/<op>.<k>` from its module stack and op, the eager op it comes from.

With `keep="full"` the recorded values themselves are extra outputs (they are materialised, so Inductor writes
what it would otherwise keep in registers). Weights and model inputs are recorded before the forward, the
model's outputs (and `<root>`) after it, exactly as an eager capture does.

Graph breaks are recorded, not hidden: the bundle's manifest (`capture.compile`) lists every compiled graph and
each break with its reason and user source line, and each break is a warning. A model that cannot compile
raises one `InputError` naming where and why.

    >>> import torch, tensorprobe as tp
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> b = tp.capture(model, torch.randn(2, 4), compile=True, backend="aot_eager")   # doctest: +SKIP
    >>> [r.name for r in b if r.kind == "output"]                                     # doctest: +SKIP
    ['0', '1', '<root>']
"""

from __future__ import annotations

import math
import re
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from .errors import InputError
from .hooks import module_tensors
from .ops import ALIAS_OPS, RNG_OPS, SKIP_OPS
from .record import KIND_OUTPUT, KIND_RNG, TAG_QUANTIZED, Record, dtype_name, record_name, short_op
from .stats import TensorStats, compute_stats
from .stats.core import bool_stats, channel_count

# Backends whose graph after AOT autograd (aten ops) can be instrumented: what op level needs.
OP_LEVEL_BACKENDS = ("aot_eager", "inductor")
# Tag of a record whose statistics were computed inside the compiled graph (no per-channel NaN analysis:
# that needs the values, keep="full").
TAG_COMPILED = "compiled"
_STATS_FIELDS = 7   # Σx, Σx², min, max over finite elements; NaN, +Inf, -Inf counts
_EAGER_KERNELS = ("aot_eager", "eager")   # backends that run eager's own kernels (the same arithmetic)


def graph_row_stats(x: torch.Tensor) -> torch.Tensor:
    """The statistics of each row (last dimension) of `x`, written with torch ops so that a compiler fuses them
    into the kernel that produces `x`: a vector of 7 x rows (float32; float64 for a float64 value), field after
    field (Σx of every row, then Σx², min, max, NaN count, +Inf count, -Inf count). `combine_rows` makes them the
    value's statistics.

    Only row reductions, taken where the rows are made: each reduction across rows would be a step of its own
    (115 single-threaded steps, each ending in a barrier, in one conv block's CPU kernel; on a GPU, kernels), and
    adding a few hundred rows is nothing for the host. Sums and counts are taken in float32 (float64
    for a float64 value): exact for counts, a row holds fewer than 2**24 elements. No masks: a finite Σx proves
    every element finite (the eager kernel's rule), and a value holding NaN/Inf keeps its counts while its finite
    figures are left unknown (keep="full" gives them).

        >>> graph_row_stats(torch.tensor([[1.0, 2.0], [4.0, -1.0]])).tolist()
        [3.0, 3.0, 5.0, 17.0, 1.0, -1.0, 2.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    """
    # Written for Inductor's CPU code, which keeps a fused reduction vectorized only if every op in it is: a float64
    # conversion of each element (40 ms per 3 M elements, against 0.4 ms for row sums) or a bool->number cast of a
    # comparison (isnan(x).sum(): 76 ms) turns the whole kernel scalar; torch.where(cmp, 1.0, 0.0) stays vector.
    # A bool value (a comparison's result) is counted with where() too: returned whole instead, Inductor stores
    # it one byte at a time (a 128x24000 `gt` cost 20 ms of a 30 ms kernel).
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    rows = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
    one, zero = torch.ones((), dtype=acc, device=x.device), torch.zeros((), dtype=acc, device=x.device)
    inf = float("inf")
    if x.dtype == torch.bool:   # [true count, true count, min, max, 0, 0, 0]
        wide = torch.where(rows, one, zero)
        counts = [wide * 0] * 3
    else:
        wide = rows if rows.dtype == acc else rows.to(acc)
        counts = [torch.where(rows != rows, one, zero), torch.where(rows == inf, one, zero),
                  torch.where(rows == -inf, one, zero)]
    # field after field (a cat along the one dimension): Inductor then writes each row reduction straight into its
    # slice of the output; interleaved (a stack on the last dimension), each field became a copy loop of its own
    fields = [wide.sum(-1), (wide * wide).sum(-1), wide.amin(-1), wide.amax(-1), *(c.sum(-1) for c in counts)]
    # (kept in the accumulating dtype: a conversion would be one more loop per field)
    return torch.cat(fields)


def combine_rows(values: Any, rows: list[int]) -> list[list[float]]:
    """The 7 statistics of each value whose `graph_row_stats` lie one after another in `values` (an array or
    tensor), value i having rows[i] rows: sums and counts added in float64, the least minimum and the greatest
    maximum (NaN if a row holds NaN). Three NumPy calls for any number of values."""
    v = (values.numpy() if isinstance(values, torch.Tensor) else np.asarray(values)).astype(np.float64)
    starts = np.repeat(np.cumsum([0] + [_STATS_FIELDS * r for r in rows[:-1]]), _STATS_FIELDS)
    starts += np.tile(np.arange(_STATS_FIELDS), len(rows)) * np.repeat(rows, _STATS_FIELDS)
    with np.errstate(invalid="ignore"):
        out = np.add.reduceat(v, starts).reshape(len(rows), _STATS_FIELDS)
        out[:, 2] = np.minimum.reduceat(v, starts).reshape(len(rows), _STATS_FIELDS)[:, 2]
        out[:, 3] = np.maximum.reduceat(v, starts).reshape(len(rows), _STATS_FIELDS)[:, 3]
    return out.tolist()


def graph_stats(x: torch.Tensor) -> list[float]:
    """The statistics of `x` as in-graph capture computes them: [Σx, Σx², min, max, NaN, +Inf, -Inf counts].

        >>> graph_stats(torch.tensor([1.0, 2.0, 4.0]))
        [7.0, 21.0, 1.0, 4.0, 0.0, 0.0, 0.0]
    """
    return combine_rows(graph_row_stats(x).cpu(), [math.prod(x.shape[:-1]) if x.dim() else 1])[0]


def stats_from_vector(v: Any, shape: tuple[int, ...], channel_dim: int | None,
                      dtype: torch.dtype = torch.float32) -> TensorStats:
    """`TensorStats` from the 7 statistics `graph_stats` or `combine_rows` gives (a tensor or a list) of a value of
    `dtype`."""
    s, ss, mn, mx, nan, pinf, ninf = (float(a) for a in (v.tolist() if hasattr(v, "tolist") else v))
    n = math.prod(shape)
    if dtype == torch.bool:   # as the eager statistics of a bool tensor
        return bool_stats(int(s), n)
    nan, pinf, ninf = int(nan), int(pinf), int(ninf)
    finite = n - nan - pinf - ninf
    if finite < n:   # the sums and extremes include the NaN/Inf: only the counts are known
        return TensorStats(numel=n, nan=nan, posinf=pinf, neginf=ninf, finite_frac=finite / n,
                           **channel_count(shape, channel_dim))
    mean = s / finite
    var = max(ss / finite - mean * mean, 0.0)
    return TensorStats(numel=n, nan=nan, posinf=pinf, neginf=ninf, finite_frac=finite / n, min=mn, max=mx,
                       mean=mean, std=math.sqrt(var), absmax=max(abs(mn), abs(mx)),
                       **channel_count(shape, channel_dim))


@dataclass
class _Entry:
    """One value of a compiled graph that is recorded, under one or more names (a node that ends a module call
    and its parent's call is both)."""

    node: Any
    names: list[tuple[str, str, int, str, tuple[str, ...]]]   # (name, module, call, op, inputs)
    shape: tuple[int, ...]
    full: bool   # returned whole (keep="full", or a dtype the in-graph statistics do not cover)
    kind: str = KIND_OUTPUT
    tags: tuple[str, ...] = ()
    index: int = -1   # its place among the plan's entries
    slot: int = -1    # its place among the full values, or among the entries with stacked statistics


@dataclass
class GraphPlan:
    """What one compiled graph records: its entries in record order, and how many outputs are the graph's own."""

    index: int
    entries: list[_Entry] = field(default_factory=list)
    outputs: int = 0
    nodes: int = 0
    stacked: bool = False   # the statistics of the entries that are not full come as one stacked output
    row_counts: list[int] = field(default_factory=list)   # per such entry, its rows there (`graph_row_stats`)
    # (entry index, name) in record order: a value that ends several calls (a child's output its parent returns
    # as is) is one extra output but several records, each at its call's place, as forward hooks make them
    order: list[tuple[int, tuple[str, str, int, str, tuple[str, ...]]]] = field(default_factory=list)

    def add(self, entry: _Entry, name: tuple) -> None:
        entry.names.append(name)
        if entry.index < 0:
            entry.index = self.entries.index(entry)
        self.order.append((entry.index, name))


def _meta_value(node) -> Any:
    return node.meta.get("val", node.meta.get("example_value"))


def _stack_calls(node, paths: dict[str, str]) -> list[tuple[str, str, int, str]]:
    """(stack key, module path, call index, class name) of every module call `node` was traced inside,
    outermost first."""
    stack = node.meta.get("nn_module_stack") or {}
    out = []
    for key, value in stack.items():
        ident, _, call = str(key).partition("@")
        path = paths.get(ident)
        if path is None:   # not a module of the model we know by identity: read dynamo's qualified name
            qual = value[0] if isinstance(value, tuple) else str(value)
            path = _normalise_qualname(qual)
        cls = value[1] if isinstance(value, tuple) and len(value) > 1 else None
        cls = getattr(cls, "__name__", None) or str(cls or "").rsplit(".", 1)[-1].strip("'>")
        out.append((str(key), path, int(call) if call.isdigit() else 0, cls))
    return out


def _normalise_qualname(qual: str) -> str:
    """"L['self'].generator.noise_res[0]" -> "generator.noise_res.0"."""
    q = re.sub(r"^L\['[^']*'\]\.?", "", qual)
    q = re.sub(r"\[(\d+)\]", r".\1", q)
    q = re.sub(r"\['([^']*)'\]", r".\1", q)
    return q.lstrip(".").replace("._modules.", ".")


def _is_tensor_meta(v: Any) -> bool:
    return isinstance(v, torch.Tensor)


def plan_module_level(gm, placeholder_names: dict[str, str], calls: dict[str, int], keep_full: bool,
                      wanted: Callable[[str], bool], index: int = 0) -> GraphPlan:
    """The module-call outputs of a dynamo graph, named as forward hooks name them.

    Each module call is marked in the graph by `tensorprobe::mark(outputs, inputs, path)`, the op our forward
    hooks call (dynamo traces hooks into the graph): its arguments are the call's outputs in return order
    (unused ones and an Identity's included) and its tensor inputs. The marks are removed here, so the real
    backend never sees them; `calls` counts each path's calls across graphs, in the order they are compiled
    (the order they first run)."""
    plan = GraphPlan(index=index, nodes=len(gm.graph.nodes))
    produced: dict[Any, str] = dict(placeholder_names_for(gm, placeholder_names))
    by_node: dict[Any, _Entry] = {}
    paths = {}
    for mark in [n for n in gm.graph.nodes if n.op == "call_function" and (n.target in _MARK_TARGETS
                                                                           or _draw_name(n) is not None)]:
        if mark.target not in _MARK_TARGETS:   # a random draw: recorded whole (kind rng), named as eager names it
            _plan_draw(mark, plan, calls, paths, produced)
            continue
        outs, ins, path, cls = mark.args
        call = calls.get(path, -1) + 1
        calls[path] = call
        inputs = tuple(dict.fromkeys(produced[a] for a in ins if isinstance(a, torch.fx.Node) and a in produced))
        outs = [o for o in outs if isinstance(o, torch.fx.Node) and _is_tensor_meta(_meta_value(o))]
        for i, n in enumerate(outs):
            name = record_name(path, call, output=i if len(outs) > 1 else None)
            if wanted(name):
                entry = by_node.get(n)
                if entry is None:
                    entry = by_node[n] = _new_entry(n, keep_full)
                    plan.entries.append(entry)
                plan.add(entry, (name, path, call, f"module:{cls}", inputs))
            produced[n] = name   # the outermost call's name, as eager's producer map ends up holding
        gm.graph.erase_node(mark)
    gm.graph.lint()
    gm.recompile()
    return plan


# Functions of a dynamo graph that draw random numbers (eager capture records them through `_RNG_ENTRY_POINTS`).
_DRAWS = ("rand", "randn", "rand_like", "randn_like", "randint", "randint_like", "randperm", "normal", "bernoulli",
          "multinomial", "poisson")


def _draw_name(n) -> str | None:
    if n.op != "call_function":
        return None
    name = getattr(n.target, "__name__", None)
    return name if name in _DRAWS and getattr(n.target, "__module__", "") in ("torch", "torch._C._VariableFunctions",
                                                                                None) else None


def _plan_draw(n, plan: GraphPlan, calls: dict[str, int], paths: dict, produced: dict) -> None:
    """A random draw of the compiled graph, named `<module>[@call]/<op>.<k>` like eager's record of it; its values
    are the compiled run's own (nothing replays them), which `diff` judges as draws that differ."""
    stack = n.meta.get("nn_module_stack") or {}
    module = ""
    if stack:
        ident = str(list(stack)[-1]).partition("@")[0]
        value = list(stack.values())[-1]
        module = plan_paths.get(ident) or _normalise_qualname(value[0] if isinstance(value, tuple) else str(value))
    call = calls.get(module, -1) + 1 if module else 0
    base = _draw_name(n)
    key = (module, call, base)
    k = paths.get(key, 0)
    paths[key] = k + 1
    if not _is_tensor_meta(_meta_value(n)):
        return
    op = f"aten.{base}.default"
    entry = _new_entry(n, True)
    entry.kind = KIND_RNG
    plan.entries.append(entry)
    plan.add(entry, (record_name(module, call, op, k), module, call, op, ()))
    produced[n] = entry.names[0][0]


plan_paths: dict[str, str] = {}   # module identity -> path of the model being captured (set by CompiledRun)


def remove_marks(gm) -> None:
    """Drop the module marks (op level names ops from AOT's graph, not from the marks)."""
    for mark in [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _MARK_TARGETS]:
        gm.graph.erase_node(mark)
    gm.recompile()


# The marker op our forward hooks call. Eagerly (code between compiled graphs, after a graph break) it records
# the call itself through `_EAGER_MARK`; in a compiled graph it is a node that names the call's values.
_LIB = torch.library.Library("tensorprobe", "FRAGMENT")
if not hasattr(torch.ops.tensorprobe, "mark"):
    _LIB.define("mark(Tensor[] outs, Tensor[] ins, str path, str cls) -> ()")

    def _mark_impl(outs, ins, path, cls):
        if _EAGER_MARK:
            _EAGER_MARK[-1](list(outs), list(ins), path, cls)

    _LIB.impl("mark", _mark_impl, "CompositeExplicitAutograd")
    torch.library.register_fake("tensorprobe::mark", lambda outs, ins, path, cls: None, lib=_LIB)
    torch.fx.node._side_effectful_functions.add(torch.ops.tensorprobe.mark.default)
_MARK_TARGETS = (torch.ops.tensorprobe.mark, torch.ops.tensorprobe.mark.default)
_EAGER_MARK: list[Callable] = []


def mark_hook(path: str, cls: str):
    """A forward hook that marks a module call for the compiled capture."""
    def hook(module, args, output):
        outs = module_tensors(output)
        if outs:
            torch.ops.tensorprobe.mark(outs, [a for a in module_tensors(args)], path, cls)
    return hook


def placeholder_names_for(gm, names_by_target: dict[str, str]) -> dict[Any, str]:
    return {n: names_by_target[n.target] for n in gm.graph.nodes
            if n.op == "placeholder" and n.target in names_by_target}


_getitem = __import__("operator").getitem


def _new_entry(n, keep_full: bool) -> _Entry:
    v = _meta_value(n)
    # integers are returned whole: their sums in float32 would not be exact, and eager's are
    full = keep_full or not (v.is_floating_point() or v.dtype == torch.bool) or v.numel() == 0
    return _Entry(node=n, names=[], shape=tuple(int(s) for s in v.shape), full=full)


def plan_op_level(gm, paths: dict[str, str], placeholder_names: dict[str, str], index: int, keep_full: bool,
                  wanted: Callable[[str], bool], counts: dict) -> GraphPlan:
    """Every aten op output of a graph after AOT autograd, named `<module>[@call]/<op>.<k>` as eager op level
    names it (aliasing ops are skipped, as there).

    A graph whose ops were decomposed (Inductor's) holds, for one eager op, the several ops it became: each node
    knows the eager op it comes from (`original_aten`). The node that hands the decomposition's result on is
    named as eager names that op (`act/leaky_relu.0`, so `diff` pairs it), the others inside it
    `act/leaky_relu.0.gt.0`."""
    plan = GraphPlan(index=index, nodes=len(gm.graph.nodes))
    produced: dict[Any, str] = dict(placeholder_names_for(gm, placeholder_names))
    groups = _decompositions(gm, paths)
    inner_counts: dict = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        base = n.target._schema.name.split("::")[-1]
        if base in SKIP_OPS:
            continue
        group = groups.get(n)
        inputs = tuple(dict.fromkeys(produced[a] for a in n.all_input_nodes if a in produced))
        if base in ALIAS_OPS:
            src = next(iter(n.all_input_nodes), None)
            if src in produced:
                produced[n] = produced[src]
            continue
        stack = _stack_calls(n, paths)
        module, call = (stack[-1][1], stack[-1][2]) if stack else ("", 0)
        v = _meta_value(n)
        outs = [(None, n)] if _is_tensor_meta(v) else []
        if isinstance(v, (tuple, list)):
            outs = [(u.args[1], u) for u in sorted(n.users, key=lambda u: u.args[1] if u.target is _getitem else 0)
                    if u.target is _getitem and _is_tensor_meta(_meta_value(u))]
        if not outs:
            continue
        op = str(n.target)
        multi = len(outs) > 1 or isinstance(v, (tuple, list))
        tags: tuple[str, ...] = ()
        if group is not None:
            tags = (f"{TAG_DECOMPOSES}{group.op}",)
            if group.k is None:   # numbered as eager numbers the op it comes from
                group.k = counts.get((module, call, group.base), 0)
                counts[(module, call, group.base)] = group.k + 1
            if group.output is n and not multi:   # the decomposition's result: eager's name for its op
                base, op = group.base, str(group.op)
            else:
                j = inner_counts.get((id(group), base), 0)
                inner_counts[(id(group), base)] = j + 1
                for i, node in outs:
                    name = record_name(module, call, f"{group.base}.{group.k}.{base}", j,
                                       output=i if multi else None)
                    _plan_value(plan, node, (name, module, call, op, inputs), keep_full, wanted, base, tags,
                                produced)
                continue
        key = (module, call, base)
        k = counts.get(key, 0) if group is None or group.output is not n else group.k
        if group is None:
            counts[key] = k + 1
        for i, node in outs:
            name = record_name(module, call, op, k, output=i if multi else None)
            _plan_value(plan, node, (name, module, call, op, inputs), keep_full, wanted, base, tags, produced)
    return plan


TAG_DECOMPOSES = "decomposes:"   # tag of a record made by one op of a decomposition: "decomposes:aten.gelu.default"


@dataclass
class _Decomposition:
    """The ops one eager op became in a decomposed graph (consecutive nodes of one module call with the same
    `original_aten`), and the node that hands its result on (None when several do)."""

    op: Any
    base: str
    nodes: list = field(default_factory=list)
    output: Any = None
    k: int | None = None


def _decompositions(gm, paths: dict[str, str]) -> dict[Any, _Decomposition]:
    """node -> its decomposition, for every node that a decomposition made (its `original_aten` is another op)."""
    out: dict[Any, _Decomposition] = {}
    current, current_key = None, None
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        orig = n.meta.get("original_aten")
        # compared by name: a graph's metadata holds copies of the op objects, which compare by identity
        if not isinstance(orig, torch._ops.OpOverload) or str(orig) == str(n.target):
            current = current_key = None
            continue
        stack = _stack_calls(n, paths)
        key = (str(orig), (stack[-1][1], stack[-1][2]) if stack else ("", 0))
        if key != current_key:
            current = _Decomposition(op=orig, base=short_op(str(orig)))   # eager's name for the op
            current_key = key
        current.nodes.append(n)
        out[n] = current
    for group in {id(g): g for g in out.values()}.values():
        members = set(group.nodes)
        leaving = [n for n in group.nodes if any(u not in members for u in n.users)]
        single = len(group.op._schema.returns) == 1
        group.output = leaving[0] if len(leaving) == 1 and single and isinstance(_meta_value(leaving[0]),
                                                                                  torch.Tensor) else None
    return out


def _plan_value(plan: GraphPlan, node, key: tuple, keep_full: bool, wanted: Callable[[str], bool], base: str,
                tags: tuple[str, ...], produced: dict) -> None:
    """Plan one op output, `key` = (record name, module, call, op, input names)."""
    name, op = key[0], key[3]
    if not wanted(name):
        return
    entry = _new_entry(node, keep_full)
    if base in RNG_OPS:
        entry.kind = KIND_RNG
        entry.full = True
    if str(op).startswith("quantized::"):
        entry.tags = (TAG_QUANTIZED,)
    entry.tags += tags
    plan.entries.append(entry)
    plan.add(entry, key)
    produced[node] = name


def _own_outputs(gm, plan: GraphPlan) -> tuple[Any, Any, tuple]:
    """(graph, its output node, the graph's own outputs); the plan notes how many it has."""
    graph = gm.graph
    out_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    own = out_node.args[0]
    own = tuple(own) if isinstance(own, (tuple, list)) else (own,)
    plan.outputs = len(own)
    return graph, out_node, own


def _set_outputs(gm, plan: GraphPlan, out_node, own: tuple, extra: list, stacked: bool) -> None:
    """The graph returns its own outputs, then the instrumented ones."""
    plan.stacked = stacked
    out_node.args = (own + tuple(extra),)
    gm.graph.lint()
    gm.recompile()


def instrument(gm, plan: GraphPlan) -> None:
    """Add each entry's statistics (or the value itself) to `gm`'s outputs, after the graph's own."""
    graph, out_node, own = _own_outputs(gm, plan)
    extra, stats = [], []
    for e in plan.entries:
        # taken right after the value is made: code after it may change it in place (Kokoro's `xs += block(x)`,
        # `rand_ini[:, 0] = 0`), and the record is the value the module returned, as a forward hook sees it
        with graph.inserting_after(e.node):
            node = graph.call_function(torch.clone if e.full else graph_row_stats, (e.node,))
        e.slot = len(extra) if e.full else _next_rows(plan, e)
        (extra if e.full else stats).append(node)
    if stats:   # one output: the host reads every statistic with one copy (one sync on a GPU)
        with graph.inserting_before(out_node):
            extra.append(graph.call_function(torch.cat, (stats,)))
    _set_outputs(gm, plan, out_node, own, extra, bool(stats))


def _next_rows(plan: GraphPlan, e: _Entry) -> int:
    """Give `e` the next rows of the plan's stacked statistics; its number among the entries that have them."""
    plan.row_counts.append(math.prod(e.shape[:-1]) if e.shape else 1)
    return len(plan.row_counts) - 1


def instrument_aten(gm, plan: GraphPlan) -> None:
    """`instrument` for a graph that only aten ops may enter (Inductor's, after AOT autograd): each value's
    statistics are `graph_row_stats` traced to aten ops with Inductor's decompositions (on a fake value of the
    entry's shape) and copied in; full values are returned as they are (the graph is functional: nothing changes a
    value after it is made)."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    graph, out_node, own = _own_outputs(gm, plan)
    extra, stats = [], []
    traced: dict[tuple, Any] = {}
    with graph.inserting_before(out_node):
        for e in plan.entries:
            if e.full:
                e.slot = len(extra)
                extra.append(e.node)
                continue
            e.slot = _next_rows(plan, e)
            v = _meta_value(e.node)
            key = (tuple(v.shape), v.dtype, str(v.device))
            if key not in traced:
                with FakeTensorMode(allow_non_fake_inputs=True):
                    example = torch.empty(key[0], dtype=v.dtype, device=v.device)
                traced[key] = make_fx(graph_row_stats, decomposition_table=select_decomp_table(),
                                      tracing_mode="fake")(example)
            stats.append(graph.graph_copy(traced[key].graph, {_placeholder(traced[key]): e.node}))
        if stats:   # torch.cat, as Inductor decomposes it
            device = _meta_value(plan.entries[0].node).device
            with FakeTensorMode(allow_non_fake_inputs=True):
                vectors = [torch.empty(n * _STATS_FIELDS, dtype=_meta_value(v).dtype, device=device)
                           for n, v in zip(plan.row_counts, stats)]
            stack = make_fx(lambda *v: torch.cat(v), decomposition_table=select_decomp_table(),
                            tracing_mode="fake")(*vectors)
            slots = [n for n in stack.graph.nodes if n.op == "placeholder"]
            extra.append(graph.graph_copy(stack.graph, dict(zip(slots, stats))))
    _set_outputs(gm, plan, out_node, own, extra, bool(stats))


def _placeholder(gm) -> Any:
    return next(n for n in gm.graph.nodes if n.op == "placeholder")


def split_outputs(plan: GraphPlan, outs: Any) -> tuple[Any, list]:
    """The graph's own outputs (as the uninstrumented graph returns them) and one value per plan entry: the tensor
    (full entries) or its statistics as a list of 7 numbers."""
    outs = list(outs) if not isinstance(outs, list) else outs
    own, extra = outs[:plan.outputs], outs[plan.outputs:]
    per_entry = combine_rows(extra[-1].cpu(), plan.row_counts) if plan.stacked else []
    return own, [extra[e.slot] if e.full else per_entry[e.slot] for e in plan.entries]


def user_frame(tb_or_stack: Any) -> str | None:
    """`file.py:123 (function)` of the innermost frame outside torch, tensorprobe and Python's own library (a
    `contextlib` decorator or the import machinery is never where a model fails)."""
    import os
    import sysconfig
    paths = sysconfig.get_paths()
    stdlib = paths["stdlib"] + os.sep
    installed = (paths["purelib"] + os.sep, paths["platlib"] + os.sep)   # inside stdlib's folder, and user code
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    own_dir = os.path.dirname(__file__) + os.sep
    frames = traceback.extract_tb(tb_or_stack) if hasattr(tb_or_stack, "tb_frame") else list(tb_or_stack or [])
    for f in reversed(frames):
        name = f.filename
        if (name.startswith(torch_dir) or name.startswith("<frozen")
                or (name.startswith(stdlib) and not name.startswith(installed))):
            continue
        if not (name.startswith(own_dir) and "examples" not in name):
            return f"{name}:{f.lineno} ({f.name})"
    return None


def compile_failure(e: BaseException, backend: str) -> InputError:
    """One line: where the model failed to compile and why (the innermost user frame, dynamo's reason)."""
    inner = getattr(e, "inner_exception", None) or e.__cause__ or e
    stack = getattr(e, "real_stack", None)
    where = user_frame(stack) if stack else None
    where = where or user_frame(e.__traceback__) or user_frame(getattr(inner, "__traceback__", None))
    why = _reason(inner)
    at = f" at {where}" if where else ""
    return InputError(f"torch.compile(backend={backend!r}) failed{at}: {type(inner).__name__}: {why}")


def _reason(e: BaseException) -> str:
    """The first line of dynamo's message, with its explanation when it has one: that is where the model's own
    error is (a fake kernel's: "RuntimeError when making fake tensor call" says nothing by itself)."""
    text = str(e).strip()
    if not text:
        return type(e).__name__
    lines = text.splitlines()
    explained = next((ln.strip()[len("Explanation:"):].strip() for ln in lines[1:]
                      if ln.strip().startswith("Explanation:")), None)
    return f"{lines[0]} ({explained})" if explained else lines[0]


def forget_compiles(backend: Any) -> None:
    """Drop what dynamo keeps of the compiles `backend` made (its cache entries, and its own reference to the
    backend), and nothing of the user's other compiled functions: a capture's graphs carry its instrumentation
    and hold the model, and are of no use after it. Dynamo keeps a code object's entries together, so one whose
    code a user also compiled (the same model class's forward) loses the user's entry too: a recompile.

    `torch._dynamo.reset()` would do it by clearing every compiled function of the process.
    """
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo import convert_frame, eval_frame

    def ours(b: Any) -> bool:   # torch.compile wraps the backend it is given (`compiler_fn`), maybe more than once
        for _ in range(8):
            if b is backend:
                return True
            b = getattr(b, "compiler_fn", None)
        return False

    for ref in [*convert_frame.input_codes.seen, *convert_frame.output_codes.seen]:
        code = ref()
        if code is not None and any(ours(e.backend) for e in _debug_get_cache_entry_list(code)):
            eval_frame.reset_code(code)
    eval_frame.cached_backends.pop(id(backend), None)


def graph_breaks(counters_before: dict) -> list[dict[str, Any]]:
    """Graph breaks dynamo counted during the run: reason and how often."""
    from torch._dynamo.utils import counters

    now = dict(counters.get("graph_break", {}))
    return [{"reason": str(k).strip().splitlines()[0], "count": int(v - counters_before.get(k, 0))}
            for k, v in now.items() if v - counters_before.get(k, 0) > 0]


def explain_breaks(model, inputs: tuple, kwinputs: dict) -> list[dict[str, Any]]:
    """Each break with its user source line (`torch._dynamo.explain`: one more trace, run only after a break)."""
    try:
        with torch.no_grad():
            ex = torch._dynamo.explain(model)(*inputs, **kwinputs)
    except Exception:   # explain is a second opinion: the counted reasons stand without it
        return []
    out = []
    for r in getattr(ex, "break_reasons", []) or []:
        where = user_frame(getattr(r, "user_stack", None))
        out.append({"reason": plain_reason(str(getattr(r, "reason", r)).strip().splitlines()[0]), "where": where})
    return out


# dynamo's terse break reasons, said in words (the reason itself is kept in front)
_REASONS = (("generic_jump TensorVariable", "a Python branch (if/while) on a tensor's value"),
            ("step_unsupported", "code dynamo does not trace (nn.GRU/nn.LSTM run eagerly, for one)"),
            ("data dependent operator", "an op whose output shape depends on the values (nonzero, unique, ...)"),
            ("Tensor.item", "a tensor turned into a Python number (.item(), float(t))"))


def plain_reason(reason: str) -> str:
    """dynamo's break reason, with what it means where it is terse.

        >>> plain_reason("generic_jump TensorVariable()")
        "generic_jump TensorVariable(): a Python branch (if/while) on a tensor's value"
    """
    words = next((w for key, w in _REASONS if key in reason), None)
    return f"{reason}: {words}" if words else reason


class CompiledRun:
    """A torch.compile backend that instruments each graph dynamo hands it; collects the records it makes.

    `record(entry_name_tuple, stats_or_tensor)` is called by the caller per record; this class only plans,
    instruments, compiles and returns what each graph run produced, in order."""

    def __init__(self, model: torch.nn.Module, *, level: str, backend: str, mode: str | None, keep_full: bool,
                 wanted: Callable[[str], bool], placeholder_names: Callable[[list], dict[str, str]],
                 on_graph_run: Callable[[GraphPlan, list], None], inductor_config: dict[str, Any] | None = None):
        if level == "op" and backend not in OP_LEVEL_BACKENDS:
            raise InputError(f"op-level capture of a compiled model supports backend "
                             f"{', '.join(OP_LEVEL_BACKENDS)} (the graph after AOT autograd); use level='module' "
                             f"with backend {backend!r}")
        if mode is not None and backend != "inductor":
            raise InputError(f"--mode {mode!r} is an Inductor setting; backend {backend!r} takes none")
        if inductor_config and backend != "inductor":
            raise InputError(f"Inductor settings ({', '.join(inductor_config)}) need backend inductor, not {backend!r}")
        self.inductor_config = dict(inductor_config or {})
        self.model = model
        self.level = level
        self.backend = backend
        self.mode = mode
        self.keep_full = keep_full
        self.wanted = wanted
        self.paths = {str(id(m)): p for p, m in model.named_modules()}
        plan_paths.clear()
        plan_paths.update(self.paths)
        self.placeholder_names = placeholder_names
        self.on_graph_run = on_graph_run
        self.plans: list[GraphPlan] = []
        self.op_counts: dict = {}
        self.calls: dict[str, int] = {}   # module path -> calls named so far (graphs and eager code alike)
        self.kernels: list[dict[str, Any]] = []   # Inductor's kernels and the module calls each computes

    def __deepcopy__(self, memo: dict) -> "CompiledRun":
        # One backend per capture, holding the model and what it recorded: a copy would record into nothing.
        # Lightning Fabric's patched torch.compile deep-copies its keyword arguments (a weight-normed model
        # cannot be copied at all: "Only Tensors created explicitly by the user support the deepcopy protocol").
        return self

    def __call__(self, gm, example_inputs):
        index = len(self.plans)
        names = self.placeholder_names(list(example_inputs)) if example_inputs else {}
        by_target = {n.target: names[i] for i, n in enumerate(p for p in gm.graph.nodes if p.op == "placeholder")
                     if i in names}
        if self.level == "op":
            remove_marks(gm)
            return self._aot(gm, example_inputs, index, by_target)
        plan = plan_module_level(gm, by_target, self.calls, self.keep_full, self.wanted, index)
        self.plans.append(plan)
        instrument(gm, plan)
        compiled = self._real_backend()(gm, example_inputs)
        return self._wrap(plan, compiled)

    def _real_backend(self):
        if self.backend == "inductor":
            from torch._inductor.compile_fx import compile_fx

            from .inductor_kernels import KernelRecorder

            recorder = KernelRecorder(self._module_call)
            self.kernels = recorder.kernels
            patches = self._inductor_patches()

            def compile_with_kernels(gm, ex):
                with _no_aot_cache():
                    return compile_fx(gm, ex, config_patches=patches, inner_compile=recorder)
            return compile_with_kernels
        from torch._dynamo import lookup_backend
        try:
            return lookup_backend(self.backend)
        except Exception as e:
            raise InputError(f"unknown torch.compile backend {self.backend!r}: {e}") from None

    def _inductor_patches(self) -> dict[str, Any]:
        """Inductor's settings for this run: the mode's, and provenance tracking (the kernels of each module)."""
        from .inductor_kernels import PROVENANCE

        if self.mode is not None and self.mode not in ("default", "reduce-overhead", "max-autotune",
                                                       "max-autotune-no-cudagraphs"):
            raise InputError(f"unknown --mode {self.mode!r}; use default, reduce-overhead, max-autotune or "
                             "max-autotune-no-cudagraphs")
        options = torch._inductor.list_mode_options(self.mode) if self.mode else {}
        return {**options, **self.inductor_config, **PROVENANCE}

    def _module_call(self, node) -> list[tuple[str, int]] | None:
        """(module path, call index) of each module call a graph node was traced inside, outermost first; [("", 0)]
        for the model's own code outside any submodule; None for the nodes tensorprobe added (no user source line)."""
        stack = _stack_calls(node, self.paths)
        if stack:
            return [(path, call) for _, path, call, _ in stack]
        return [("", 0)] if node.meta.get("stack_trace") else None

    def _wrap(self, plan: GraphPlan, compiled):
        def run(*args):
            own, extra = split_outputs(plan, compiled(*args))
            self.on_graph_run(plan, extra)
            return own
        return run

    def _aot(self, gm, example_inputs, index, by_target):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        # AOT's graph has one placeholder per flat input, in the dynamo graph's order
        aot_names = {f"arg{i}_1": by_target[p.target]
                     for i, p in enumerate(q for q in gm.graph.nodes if q.op == "placeholder") if p.target in by_target}

        def planned(agm, aten_only: bool = False) -> GraphPlan:
            targets = {n.target: aot_names.get(n.target) for n in agm.graph.nodes if n.op == "placeholder"}
            plan = plan_op_level(agm, self.paths, {k: v for k, v in targets.items() if v}, index, self.keep_full,
                                 self.wanted, self.op_counts)
            self.plans.append(plan)
            (instrument_aten if aten_only else instrument)(agm, plan)
            return plan

        if self.backend == "inductor":   # Inductor's own pipeline; its inner compile gets the decomposed graph
            from torch._inductor.compile_fx import compile_fx

            from .inductor_kernels import KernelRecorder

            recorder = KernelRecorder(self._module_call)
            self.kernels = recorder.kernels

            def inner(agm, ex, **kwargs):
                plan = planned(agm, aten_only=True)
                return _Stripped(recorder(agm, ex, **kwargs), plan, self.on_graph_run)

            with _no_aot_cache():
                return compile_fx(gm, example_inputs, config_patches=self._inductor_patches(), inner_compile=inner)

        def fw(agm, ex):
            plan = planned(agm)
            inner = agm.forward

            def run(*args):
                own, extra = split_outputs(plan, inner(*args))
                self.on_graph_run(plan, extra)
                return own
            return make_boxed_func(run)

        return aot_autograd(fw_compiler=fw)(gm, example_inputs)


def _no_aot_cache():
    """AOT autograd's cache off for one compile: a hit would skip Inductor's inner compile (where the kernels are
    read and the op-level statistics added), and what it saves is Inductor's compiled graph without the wrapper that
    takes the statistics off. Inductor's own FX graph cache (the C++ compile) still serves."""
    return torch._functorch.config.patch(enable_autograd_cache=False)


class _Stripped:
    """Inductor's compiled graph (an `OutputCode`) whose instrumented outputs are taken off before AOT autograd's
    runtime sees them, as the graph it traced returns them. Everything else is the compiled graph's."""

    _boxed_call = True

    def __init__(self, compiled: Any, plan: GraphPlan, on_graph_run: Callable[[GraphPlan, list], None]):
        self.__dict__["_compiled"] = compiled
        self.__dict__["_plan"] = plan
        self.__dict__["_on_graph_run"] = on_graph_run

    def __call__(self, *args: Any) -> Any:
        # boxed (one list of inputs), as AOT autograd calls an OutputCode; unboxed where a caller does not look
        boxed = list(args[0]) if len(args) == 1 and isinstance(args[0], list) else list(args)
        own, extra = split_outputs(self._plan, self._compiled(boxed))
        self._on_graph_run(self._plan, extra)
        return own

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_compiled"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["_compiled"], name, value)


def record_graph_run(recorder, plan: GraphPlan, extra: list, channel_dim: int | None) -> None:
    """Turn one compiled graph run's extra outputs into records (`capture._Recorder` stores them)."""
    stats: dict[int, TensorStats] = {}
    for i, (name, module, call, op, inputs) in plan.order:
        entry, value = plan.entries[i], extra[i]
        if entry.full:
            recorder.record(value, name=name, module=module, op=op, kind=entry.kind, call=call, inputs=inputs,
                            tags=entry.tags)
            continue
        if not recorder.wanted(name, entry.kind):
            continue
        meta = _meta_value(entry.node)
        if i not in stats:
            stats[i] = stats_from_vector(value, entry.shape, channel_dim, meta.dtype)
        rec = Record(name=name, module=module, op=op, order=recorder.order, shape=entry.shape,
                     dtype=dtype_name(meta.dtype), stats=stats[i], kind=entry.kind, call=call,
                     device=str(meta.device), inputs=inputs, tags=entry.tags + (TAG_COMPILED,))
        recorder.writer.add(rec, None)
        recorder.order += 1
        if recorder.on_record is not None:
            recorder.on_record(rec)


__all__ = ["CompiledRun", "GraphPlan", "OP_LEVEL_BACKENDS", "TAG_COMPILED", "combine_rows", "compile_failure",
           "forget_compiles", "graph_row_stats", "graph_stats", "stats_from_vector"]


def _capture_class(Capture: type) -> type:
    """The compiled `Capture` subclass of `Capture` (passed in by `capture.capture`: this module does not import
    the one that imports it)."""

    class CompiledCapture(Capture):
        """`Capture` of the model as `torch.compile(backend=...)` runs it (see the module docstring)."""

        def __init__(self, model: torch.nn.Module, *, backend: str = "inductor", mode: str | None = None,
                     explain: bool = True, inductor_config: dict[str, Any] | None = None, **kw: Any):
            super().__init__(model, **kw)
            if self.replay is not None:
                raise InputError("replay_rng is not supported with compile=True: a compiled graph draws its own "
                                 "random numbers")
            if self.record_inputs:
                raise InputError("record_inputs is not supported with compile=True")
            self.backend = backend
            self.mode = mode
            self.explain = explain
            self.inductor_config = inductor_config
            self.compile_info: dict[str, Any] = {}

        def _install(self) -> None:
            from .environment import collect

            # a backend that generates its own kernels (Inductor's fused C++/Triton) rounds otherwise than eager:
            # its runs are not the same arithmetic; aot_eager and eager run eager's kernels
            runtime = None if self.backend in _EAGER_KERNELS else {
                "name": f"torch.compile ({self.backend})", "version": torch.__version__}
            self._writer.set_header(environment=collect([*self.model.parameters(), *self.model.buffers()],
                                                        runtime=runtime))
            if self.record_weights:
                self._record_weights()
            self._mode = None

        def _uninstall(self) -> None:
            pass

        def run(self, *inputs: Any, **kwinputs: Any) -> Any:
            """Record the inputs, compile and run the forward (compile time measured apart), record the output."""
            import time

            from torch._dynamo.utils import counters

            self._record_model_inputs(inputs, kwinputs)
            rec = self._recorder
            ids: dict[int, str] = {id(t): n for n, _, t, _, _ in
                                   __import__("tensorprobe.weights", fromlist=["named_weights"]).named_weights(self.model)}
            for i, t in enumerate(inputs):
                if isinstance(t, torch.Tensor):
                    ids[id(t)] = f"input.{i}"
            for k, t in kwinputs.items():
                if isinstance(t, torch.Tensor):
                    ids[id(t)] = f"input.{k}"

            def placeholder_names(example: list) -> dict[int, str]:
                return {i: ids[id(t)] for i, t in enumerate(example) if id(t) in ids}

            runs: list[int] = []

            def on_graph_run(plan: GraphPlan, extra: list) -> None:
                runs.append(plan.index)
                record_graph_run(rec, plan, extra, self.channel_dim)

            backend = CompiledRun(self.model, level=self.level, backend=self.backend, mode=self.mode,
                                  inductor_config=self.inductor_config,
                                  keep_full=self.keep_full, wanted=lambda name: rec.wanted(name, KIND_OUTPUT),
                                  placeholder_names=placeholder_names, on_graph_run=on_graph_run)
            def eager_mark(outs: list, ins: list, path: str, cls: str) -> None:
                # a module call dynamo did not trace (code after a graph break runs eagerly): record it here
                call = backend.calls.get(path, -1) + 1
                backend.calls[path] = call
                names = rec.input_names(ins)
                for i, t in enumerate(outs):
                    rec.record(t.detach(), name=record_name(path, call, output=i if len(outs) > 1 else None),
                               module=path, op=f"module:{cls}", kind=KIND_OUTPUT, call=call, inputs=names)

            handles = []
            if self.level == "module":
                handles = [m.register_forward_hook(mark_hook(p, type(m).__name__))
                           for p, m in self.model.named_modules() if p]
            # (no `torch._dynamo.reset()`: a cached compile by another backend fails its backend guard, so ours
            # sees the graphs, and the user's other compiled functions keep theirs)
            # dynamo's table of torch functions is built once; built while an eager capture had wrapped torch.randn
            # & co. (its random-draw entry points) it would hold the wrappers, and every draw would break the graph
            torch._dynamo.trace_rules.clear_lru_cache()
            before = dict(counters.get("graph_break", {}))
            t0 = time.perf_counter()
            _EAGER_MARK.append(eager_mark)
            try:   # the hooks come off whatever fails, torch.compile itself included
                compiled = torch.compile(self.model, backend=backend, dynamic=False)
                with torch.no_grad():
                    output = compiled(*inputs, **kwinputs)
            except InputError:
                raise
            except Exception as e:
                if not backend.plans or not runs:   # failed while tracing or compiling: not the model's values
                    raise compile_failure(e, self.backend) from None
                raise
            finally:
                _EAGER_MARK.remove(eager_mark)
                for h in handles:
                    h.remove()
                forget_compiles(backend)   # the hooks are gone: drop the graphs traced with them
            first = time.perf_counter() - t0
            breaks = graph_breaks(before)
            # dynamo does not count every break (a branch on a tensor's value is not in its counters): more than
            # one graph for one forward is asked about too
            suspect = breaks or len(backend.plans) > 1
            where = explain_breaks(self.model, inputs, kwinputs) if suspect and self.explain else []
            self.compile_info = {
                "backend": self.backend, "mode": self.mode, **({"inductor_config": self.inductor_config}
                                                               if self.inductor_config else {}),
                "graphs": len(backend.plans),
                "graph_nodes": [p.nodes for p in backend.plans], "graph_runs": len(runs),
                "graph_breaks": where or breaks, "first_run_seconds": round(first, 3)}
            if backend.kernels:
                self.compile_info["kernels"] = backend.kernels
            self._writer.set_header(capture={**self._writer._header.get("capture", {}), "compile": self.compile_info})
            for b in where or breaks:
                at = f" at {b['where']}" if b.get("where") else ""
                self._warn(f"graph break{at}: {b['reason']} (the code between compiled graphs runs eagerly; its "
                           "module calls are recorded from eager values)")
            # the root module's output, as eager's forward hook records it, then the model outputs
            model_inputs = tuple(n for n in ids.values() if n.startswith("input."))
            flat = module_tensors(output)
            with torch.no_grad():
                for i, t in enumerate(flat):
                    rec.record(t, name=record_name("", 0, output=i if len(flat) > 1 else None), module="",
                               op=f"module:{type(self.model).__name__}", kind=KIND_OUTPUT, inputs=model_inputs)
            self.record_outputs(output)
            return output

        @property
        def keep_full(self) -> bool:
            return self.keep == "full"

    return CompiledCapture


def compiled_capture(base: type, model: torch.nn.Module, *, backend: str = "inductor", mode: str | None = None,
                     inductor_config: dict[str, Any] | None = None, **kw: Any):
    """A `Capture` (subclass of `base`, capture.Capture) that records the compiled model (`capture(..., compile=True)`
    builds it)."""
    return _capture_class(base)(model, backend=backend, mode=mode, inductor_config=inductor_config, **kw)
