"""Name every value of an ONNX graph by the PyTorch module path it comes from.

The record-name grammar of `tensorprobe.record` is shared with PyTorch captures, so `diff` lines an ONNX
Runtime capture up with a PyTorch one by exact name:

    ONNX node (legacy exporter)                                   record
    /generator/noise_res.0/adain1.0/norm/InstanceNormalization    generator.noise_res.0.adain1.0.norm
    /generator/noise_res.0/adain1.0/Mul_1  (inner op)             generator.noise_res.0.adain1.0/Mul.1
    graph output                                                  <root>

Where the module scope of a node comes from, first match wins:

1. a mapping rule (`REGEX -> MODULE` lines in a rules file) matched against the node name;
2. `tensorprobe.scope`, stamped by `OnnxRuntimeAdapter` when it exports (module path and call index of
   every node, from the ExportedProgram's `nn_module_stack`);
3. `pkg.torch.onnx.name_scopes`, written by the dynamo exporter (module path, no call index);
4. a legacy-exporter node name `/a/b.0/c/OpType_3` (a repeated call shows up as `c_1`);
5. with mapping rules, a node none of the above names is at the root. Without rules, nodes with none of these (added by an optimizer or by `onnxruntime.quantization`) are grouped into
   connected clusters; a cluster takes the module of a parameter it reads (`conv.weight_quantized` ->
   `conv`), else the innermost module holding both the scoped node feeding it last and the one it feeds
   first; with a scoped node on one side only (an op appended after the last module, or put before
   the first) it is the root's own code.

A module's output is the data value (one that depends on a graph input) produced inside the module's
scope and consumed outside it; one such value is named like the PyTorch module record (`path`, `path@call`),
a module known to return a tuple gets `path:0`, `path:1`... matched by shape; otherwise the value
leaving the scope last is the module's output. Every other value is `<module>/<OpType>.<k>`.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from ...errors import InputError
from ...record import TAG_QSTEP, TAG_QUANTIZED, TAG_STANDS_FOR, record_name
from .quant import QUANTIZERS as _QUANTIZERS, quantization_roles

SCOPE_KEY = "tensorprobe.scope"
MODULE_OUTPUTS_KEY = "tensorprobe.module_outputs"   # {"path@call": [shape, ...]} for modules returning tuples
MODULE_OUTPUT_NODES_KEY = "tensorprobe.module_output_nodes"   # {"path@call": [fx node, ...]} where shapes tie
# {value: chain} for every value a stamped node makes: model metadata survives a quantizer, node metadata does not
VALUE_SCOPES_KEY = "tensorprobe.value_scopes"
ANGLE_OPS = {"Atan"}
ANGLE_PASS_OPS = {"Where", "Add", "Sub", "Neg", "ScatterND", "ScatterElements", "Identity"}
RNG_OPS = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
SHAPE_OPS = {"Shape", "Size"}
QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
             "QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu",
             "QLinearAveragePool", "QLinearConcat", "QGemm", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
             "DynamicQuantizeLSTM", "QAttention"}
# ONNX element types of floating-point tensors (FLOAT, FLOAT16, DOUBLE, BFLOAT16): a Cast between two of
# these changes the precision of a value, not the value.
FLOAT_ELEM_TYPES = {1, 10, 11, 16}
ANGLE_TARGETS = {"aten.atan2.default", "aten.angle.default"}
_FX_NODE = re.compile(r"^%(\S+) : .*?target=torch\.ops\.([\w.]+)")
_PARAM_SUFFIX = re.compile(r"(_quantized|_scale|_zero_point|_zp|_q|_dequantized)+$")
_LEGACY_CALL = re.compile(r"^(.*)_(\d+)$")

Chain = tuple[tuple[str, int], ...]   # ((module path, call), ...) outermost first, root excluded


@dataclass
class ValuePlan:
    """How one ONNX value becomes one or more records."""

    value: str
    names: list[str]
    module: str
    op: str
    node_index: int
    inputs: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    model_output: str | None = None   # the model-output record name of a graph output (`output`, `output.wav`)


@dataclass
class MappingRules:
    """`REGEX -> MODULE` pairs applied to ONNX node names (first match wins; `\\1` groups allowed).

    File format, one rule per line, `#` comments:

        ^/model/layers\\.(\\d+)/.*   ->   decoder.blocks.\\1
        ^conv_post_.*              ->   generator.conv_post
    """

    rules: list[tuple[re.Pattern, str]] = field(default_factory=list)

    @classmethod
    def from_file(cls, path: str) -> "MappingRules":
        try:
            text = open(path, encoding="utf-8").read()
        except OSError as e:
            raise InputError(f"{path}: can't read mapping rules ({e.strerror})") from None
        return cls.parse(text, source=str(path))

    @classmethod
    def parse(cls, text: str, source: str = "<rules>") -> "MappingRules":
        rules = []
        for i, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "->" not in line:
                raise InputError(f"{source}:{i}: expected 'REGEX -> MODULE', got {line!r}")
            pat, repl = (s.strip() for s in line.rsplit("->", 1))
            try:
                rules.append((re.compile(pat), repl))
            except re.error as e:
                raise InputError(f"{source}:{i}: invalid regex {pat!r}: {e}") from None
        return cls(rules)

    def module_of(self, node_name: str) -> str | None:
        for pat, repl in self.rules:
            m = pat.search(node_name)
            if m:
                return m.expand(repl).strip(".")
        return None


def chain_of_path(path: str, call: int = 0) -> Chain:
    """'a.b.c' -> (('a',0), ('a.b',0), ('a.b.c',call))."""
    if not path:
        return ()
    parts = path.split(".")
    return tuple((".".join(parts[:k]), 0) for k in range(1, len(parts))) + ((path, call),)


def chain_within(path: str, by_path: dict[str, Chain]) -> Chain:
    """The chain of module `path` as the graph's scoped nodes show its ancestors: a scoped node's own chain,
    else the chain of its deepest scoped ancestor with `path` appended, else `chain_of_path`. A container
    that is never called (`flows`, a ModuleList) is in no scoped chain, and a chain that invents it shares no
    prefix with its siblings' (('flows.0', 0) ...): what sits between them would fall to the root."""
    if path in by_path:
        return by_path[path]
    best: Chain = ()
    for chain in by_path.values():
        for k, (p, _) in enumerate(chain):
            if p == path:
                return chain[:k + 1]
            if path.startswith(p + ".") and k + 1 > len(best):
                best = chain[:k + 1]
    return best + ((path, 0),) if best else chain_of_path(path)


def _meta(node: Any) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def _scope_from_metadata(node: Any) -> Chain | None:
    md = _meta(node)
    if SCOPE_KEY in md:
        return tuple((p, int(c)) for p, c in json.loads(md[SCOPE_KEY]))
    scopes = md.get("pkg.torch.onnx.name_scopes")
    if scopes:
        try:
            names = ast.literal_eval(scopes)
        except (ValueError, SyntaxError):
            return None
        if isinstance(names, list) and len(names) >= 2:
            return tuple((n, 0) for n in names[1:-1] if n)
    return None


def _legacy_components(node_name: str) -> list[str] | None:
    if not node_name.startswith("/"):
        return None
    return node_name.split("/")[1:-1]


def _legacy_chain(comps: list[str], known: set[str]) -> Chain:
    """Components of a legacy name -> chain; `norm_1` is call 1 of `norm` unless `norm_1` is a module."""
    chain: list[tuple[str, int]] = []
    prefix = ""
    for c in comps:
        call = 0
        full = _paths([prefix, c])[-1] if prefix else c
        m = _LEGACY_CALL.match(c)
        if m and full not in known:
            stem = f"{prefix}.{m.group(1)}" if prefix else m.group(1)
            if stem in known:
                full, call = stem, int(m.group(2))
        chain.append((full, call))
        prefix = full
    return tuple(chain)


def _fix_legacy_calls(chains: list[Chain | None]) -> None:
    """The legacy exporter names the 2nd call of `blk` `/blk_1/` for its own ops but `/blk/lin_1/` for its
    children's: lift a child's call index to its parent when the parent is seen with that call."""
    seen = {key for c in chains if c for key in c}
    for i, chain in enumerate(chains):
        if not chain:
            continue
        fixed = list(chain)
        for j in range(len(fixed) - 1, 0, -1):
            (ppath, pcall), (_, call) = fixed[j - 1], fixed[j]
            if call and not pcall and (ppath, call) in seen:
                fixed[j - 1] = (ppath, call)
        chains[i] = tuple(fixed)


def _known_modules(graph: Any) -> set[str]:
    """Module paths named by parameters (`a.b.weight` -> a, a.b) and by legacy scopes without a suffix."""
    known: set[str] = set()
    for init in graph.initializer:
        parts = _PARAM_SUFFIX.sub("", init.name).split(".")[:-1]
        known.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
    for node in graph.node:
        comps = _legacy_components(node.name) or []
        known.update(path for path, c in zip(_paths(comps), comps) if not _LEGACY_CALL.match(c))
    return known


def _paths(comps: list[str]) -> list[str]:
    """The module path at each component of a legacy node name: `/a/b/` -> a, a.b; newer exports name a child of
    a Sequential by its full path (`/layer1/layer1.0/conv1/`), which is already the path."""
    out: list[str] = []
    for c in comps:
        prefix = out[-1] if out else ""
        out.append(c if prefix and c.startswith(f"{prefix}.") else f"{prefix}.{c}" if prefix else c)
    return out


class GraphNamer:
    """Works out module scopes and record names for the values of one ONNX graph."""

    def __init__(self, model: Any, rules: MappingRules | None = None, input_records: dict[str, str] | None = None,
                 shapes: dict[str, tuple[int, ...]] | None = None, types: dict[str, int] | None = None):
        self.graph = model.graph
        self.input_records = input_records or {}
        self.shapes = shapes or {}
        self.types = dict(types or {})
        for vi in self.graph.input:
            self.types.setdefault(vi.name, vi.type.tensor_type.elem_type)
        for init in self.graph.initializer:
            self.types.setdefault(init.name, init.data_type)
        meta = {p.key: p.value for p in model.metadata_props}
        self.module_shapes: dict[str, list] = json.loads(meta.get(MODULE_OUTPUTS_KEY, "{}"))
        self.module_output_nodes: dict[str, list] = json.loads(meta.get(MODULE_OUTPUT_NODES_KEY, "{}"))
        self.value_scopes: dict[str, list] = json.loads(meta.get(VALUE_SCOPES_KEY, "{}"))
        self.nodes = list(self.graph.node)
        self.rules = rules or MappingRules()
        self.initializers = {i.name for i in self.graph.initializer}
        self.graph_inputs = [i.name for i in self.graph.input if i.name not in self.initializers]
        self.graph_outputs = [o.name for o in self.graph.output]
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for o in node.output:
                if o:
                    self.producer[o] = i
            for v in node_inputs(node):
                self.consumers.setdefault(v, []).append(i)
        self.known = _known_modules(self.graph)
        inits = {i.name: i for i in self.graph.initializer}
        data = self.data_values()
        self.roles = quantization_roles(self.nodes, self.producer, inits, self.types,
                                        lambda v: v not in data and v not in self.initializers)
        self.chains = self._scopes()

    # ---- scopes -----------------------------------------------------------------------------------------
    def _scopes(self) -> list[Chain]:
        chains: list[Chain | None] = []
        by_path: dict[str, Chain] = {}
        for node in self.nodes:
            chain = self._direct_scope(node)
            if chain:
                by_path[chain[-1][0]] = chain
            chains.append(chain)
        self._scope_replaced(chains)
        _fix_legacy_calls(chains)
        self._number_calls(chains)
        if self.rules.rules:    # with rules, a node they don't name stays at the root
            chains = [c if c is not None else () for c in chains]
        self._fill_clusters(chains, by_path)
        return [c if c is not None else () for c in chains]

    def _scope_replaced(self, chains: list[Chain | None]) -> None:
        """Scope the nodes a quantizer put in place of a stamped node from the export's value scopes.

        A quantizer drops node metadata but keeps the name of the value it replaces (`conv1d`, made by the
        rescale Mul that ends a ConvInteger's chain) and the model's metadata: that value keeps its module, and
        so do the quantizer's nodes that lead to it (its ConvInteger, Cast, scale Mul, the DynamicQuantizeLinear
        of its input). Without this, a conv whose weight is computed (weight_norm, folded into `mul`) and that
        has no bias names no module parameter, and its output would be the root's. A node that reads a module's
        weight is left to `_fill_clusters`."""
        if not self.value_scopes:
            return
        for i, node in enumerate(self.nodes):
            # (a kernel that reads a module's weight is that module's: `_fill_clusters` scopes it, and a conv the
            # exporter fused with the norm after it keeps the conv's name, though its value is the norm's)
            if chains[i] is not None or node.metadata_props or self._weight_module(node) is not None:
                continue
            scoped = [self.value_scopes[o] for o in node.output if o in self.value_scopes]
            if not scoped:
                continue
            chain = tuple((p, int(c)) for p, c in scoped[0])
            chains[i] = chain
            todo = [self.producer[v] for v in node_inputs(node) if v in self.producer]
            while todo:
                j = todo.pop()
                if chains[j] is None and not self.nodes[j].metadata_props and self._quantizer_node(self.nodes[j]) \
                        and self._weight_module(self.nodes[j]) is None:
                    chains[j] = chain
                    todo.extend(self.producer[v] for v in node_inputs(self.nodes[j]) if v in self.producer)

    def _number_calls(self, chains: list[Chain | None]) -> None:
        """Call indices for the scopes a user's dynamo export names without them (`pkg.torch.onnx.name_scopes`:
        the second call of a shared `act` is `act` again, and its value took the first call's name). A module's
        call ends once a node outside it reads what it made; its next node starts the next call. (Scopes this
        project stamps carry their call, and legacy names number theirs.)"""
        named = [i for i, node in enumerate(self.nodes) if chains[i] and SCOPE_KEY not in _meta(node)
                 and "pkg.torch.onnx.name_scopes" in _meta(node)]
        if not named:
            return
        renumber = set(named)
        call: dict[str, int] = {}
        ended: set[str] = set()
        carried: dict[str, set[str]] = {}   # value made by an unscoped node -> the scopes of what it was made from
        for i, node in enumerate(self.nodes):
            made_from = [self._scopes_of(v, chains, carried) for v in node_inputs(node)]
            if chains[i] is None:
                # a node the quantizer put in has no scope yet: one reading a module's weights (ConvInteger) is in
                # that module; the others (DynamicQuantizeLinear between two modules) pass on where their input
                # was made, so that reading it ends no call the quantizer merely sits inside
                owner = self._weight_module(node)
                if owner is None:
                    for o in node.output:
                        carried[o] = set().union(*made_from)
                    continue
                mine = {p for p, _ in chain_of_path(owner)}
            else:
                mine = {p for p, _ in chains[i]}
            for paths in made_from:
                ended.update(p for p in paths if p not in mine)
            if i not in renumber:
                continue
            numbered = []
            for path, _ in chains[i]:
                if path not in call:
                    call[path] = 0
                elif path in ended:
                    call[path] += 1
                ended.discard(path)
                numbered.append((path, call[path]))
            chains[i] = tuple(numbered)

    def _scopes_of(self, value: str, chains: list[Chain | None], carried: dict[str, set[str]]) -> set[str]:
        """The module paths `value` was made in: its producer's scope, or what an unscoped producer carried."""
        j = self.producer.get(value)
        if j is not None and chains[j]:
            return {p for p, _ in chains[j]}
        return carried.get(value, set())

    def _direct_scope(self, node: Any) -> Chain | None:
        ruled = self.rules.module_of(node.name) if self.rules.rules else None
        if ruled is not None:   # only the module named by the rule: its prefixes may not be modules
            return ((ruled, 0),) if ruled else ()
        chain = _scope_from_metadata(node)
        if chain is not None:
            return chain
        comps = _legacy_components(node.name)
        return _legacy_chain(comps, self.known) if comps is not None else None

    def _fill_clusters(self, chains: list[Chain | None], by_path: dict[str, Chain]) -> None:
        """Scope the nodes their names and metadata leave unscoped, cluster by connected cluster.

        A cluster that reads the weights of one module is that module's where it computes that module's
        output: the nodes reading its weights and the quantizer's own (the DynamicQuantizeLinear of its input,
        the ConvInteger, Cast, rescale and bias Add it puts in place of `conv1`'s Conv). What their result
        feeds (a Split of a quantized STFT conv's output, unscoped in the float export too) is scoped by its
        neighbours, as it would be without the quantizer. A cluster that reads several modules' weights (an
        old export that names no scope at all) gives each weight reader its module and splits."""
        for members in self._clusters([i for i, c in enumerate(chains) if c is None]):
            owners = {i: self._weight_module(self.nodes[i]) for i in members}
            modules = set(owners.values()) - {None}
            if len(modules) == 1:
                (path,) = modules
                owners = {i: path if owner or self._quantizer_node(self.nodes[i]) else None
                          for i, owner in owners.items()}
            for i, path in owners.items():
                if path is not None:
                    chains[i] = chain_within(path, by_path)
            rest = [i for i in members if chains[i] is None]
            for part in self._clusters(rest) if modules else [members]:
                chain = self._cluster_scope(part, chains)
                for i in part:
                    chains[i] = chain

    def _quantizer_node(self, node: Any) -> bool:
        """A node a quantizer put in: every value it makes is in the integer domain (a quantized activation,
        a scale, a zero point) or holds an integer kernel's result (its accumulator, Cast, rescale, bias)."""
        outs = [o for o in node.output if o]
        return bool(outs) and all(self.roles.integer(o) or self.roles.kernel_of(o) is not None for o in outs)

    def _clusters(self, nodes: list[int]) -> list[list[int]]:
        """`nodes` split into sets connected through values one of them makes and another reads."""
        parent = {i: i for i in nodes}

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for i in nodes:
            for v in node_inputs(self.nodes[i]):
                j = self.producer.get(v)
                if j is not None and j in parent:
                    parent[find(i)] = find(j)
        clusters: dict[int, list[int]] = {}
        for i in nodes:
            clusters.setdefault(find(i), []).append(i)
        return list(clusters.values())

    def _weight_module(self, node: Any) -> str | None:
        """The module whose weights `node` reads; for the Cast, rescale and bias Add a quantizer puts after an
        integer kernel, the module of that kernel's weight (they compute that module's output)."""
        kernels = (self.roles.kernel_of(o) for o in node.output if o)
        for v in [*node_inputs(node), *(k.weight for k in kernels if k is not None and k.weight)]:
            if v in self.initializers:
                path = ".".join(_PARAM_SUFFIX.sub("", v).split(".")[:-1])
                if path and path in self.known:
                    return path
        return None

    def _cluster_scope(self, members: list[int], chains: list[Chain | None]) -> Chain:
        """The scope of connected nodes that carry none: the innermost module holding both the scoped
        node that feeds them last and the one that reads them first. Ops between two submodules belong
        to their common parent (an activation between conv1 and conv2 is the block's), not to either.
        Ops with scoped nodes on one side only (reading no module's weights: those were given their
        module before) sit at an edge of the graph, between the model's inputs or outputs and its modules:
        they are the root's own code. A scale or a log a user appended after the last conv is the model's,
        not the conv's, however deep that conv (or the If branch it was inlined from) is nested."""
        mset = set(members)
        feeding = [self.producer[v] for i in members for v in node_inputs(self.nodes[i])
                   if v in self.producer and self.producer[v] not in mset and chains[self.producer[v]] is not None]
        fed = [j for i in members for o in self.nodes[i].output for j in self.consumers.get(o, ())
               if j not in mset and chains[j] is not None]
        before = chains[max(feeding)] or () if feeding else None
        after = chains[min(fed)] or () if fed else None
        if before is None or after is None:
            return ()
        common = 0
        while common < min(len(before), len(after)) and before[common] == after[common]:
            common += 1
        return before[:common]

    # ---- values -----------------------------------------------------------------------------------------
    def data_values(self) -> set[str]:
        """Values that depend on a graph input other than through its shape."""
        data = set(self.graph_inputs)
        for node in self.nodes:
            if node.op_type in SHAPE_OPS or node.op_type == "Constant":
                continue
            if any(v in data for v in node_inputs(node)):
                data.update(o for o in node.output if o)
        return data

    def module_outputs(self) -> dict[str, list[str]]:
        """value -> module-output record names (innermost module first)."""
        data = self.data_values()
        escaping: dict[tuple[str, int], list[str]] = {}
        outputs = set(self.graph_outputs)
        for i, node in enumerate(self.nodes):
            chain = self.chains[i]
            for o in node.output:
                if not o or o not in data or self.roles.integer(o):
                    continue   # a module returns float values: never the zero point its quantizer adds
                users = [set(self.chains[j]) for j in self._users(o)]
                for key in chain:
                    if o in outputs or any(key not in u for u in users):
                        escaping.setdefault(key, []).append(o)
        names: dict[str, list[str]] = {}
        for (path, call), values in escaping.items():
            for v, out in self._tuple_slots((path, call), values).items():
                names.setdefault(v, []).append(record_name(path, call, output=out))
        roots = self.graph_outputs
        for k, v in enumerate(roots):
            names.setdefault(v, []).append(record_name("", output=k if len(roots) > 1 else None))
        for v, lst in names.items():  # innermost module first
            lst.sort(key=lambda n: (n.startswith("<root>"), -n.count(".")))
        return names

    def _users(self, value: str) -> list[int]:
        """The nodes reading `value`, a quantizer that reads it standing for the nodes reading what it makes: the
        DynamicQuantizeLinear a quantizer puts after a ReLU (in the ReLU's scope, in a legacy export) hands the
        ReLU's value on to the next module in integer units."""
        out = []
        for j in self.consumers.get(value, ()):
            if self.nodes[j].op_type in _QUANTIZERS:
                out += [k for o in self.nodes[j].output if o for k in self.consumers.get(o, ())]
            else:
                out.append(j)
        return out

    def _tuple_slots(self, key: tuple[str, int], values: list[str]) -> dict[str, int | None]:
        """Which escaping values are the module's outputs, and at which tuple index.

        Without a record of the module's outputs (a user's file) or for a one-tensor module, the value
        leaving the scope last is the output. For a module known to return n tensors, values are matched
        to tuple slots by shape, then in production order.
        """
        shapes = self.module_shapes.get(f"{key[0]}@{key[1]}")
        if not shapes or len(shapes) == 1:
            return {values[-1]: None}
        slots: dict[str, int | None] = {}
        free = list(range(len(shapes)))
        nodes = self.module_output_nodes.get(f"{key[0]}@{key[1]}") or []
        for v in values:   # outputs of one shape: the graph node the export matched to each, by value
            fx = self._fx_node(v)
            if fx is not None and fx in nodes and nodes.index(fx) in free:
                slots[v] = nodes.index(fx)
                free.remove(slots[v])
        for v in values:
            if v in slots:
                continue
            shape = self.shapes.get(v)
            same = [i for i in free if shape is not None and tuple(shapes[i]) == shape]
            if same:
                pick = same[0]
            elif shape is None and free:
                pick = free[0]
            else:
                continue
            slots[v] = pick
            free.remove(pick)
        return slots

    def _fx_node(self, value: str) -> str | None:
        """The exported program's node that the ONNX node making `value` comes from (dynamo exports)."""
        i = self.producer.get(value)
        if i is None:
            return None
        m = re.match(r"^%(\S+) :", _meta(self.nodes[i]).get("pkg.torch.onnx.fx_node", ""))
        return m.group(1) if m else None

    def plan(self) -> list[ValuePlan]:
        """One ValuePlan per non-constant node output, in graph (topological) order.

        A Cast from one float type to another (the islands an fp16 converter or autocast leaves) is the
        same value at another precision, not a new one: it makes no record of its own. Its output is read
        as its input, and the module or model outputs it carries are named on the value it casts, so an
        fp16 graph lines up with its fp32 reference record for record.
        """
        mod_names = self.module_outputs()
        counters: dict[tuple[Chain, str], int] = {}
        primary = {v: self.input_records.get(v, f"input.{v}") for v in self.graph_inputs}
        primary.update(weight_record_names(self.graph))   # op records name the weights they read
        model_outputs = model_output_names(self.graph_outputs)
        angle: set[str] = set()
        plans: list[ValuePlan] = []
        planned: dict[str, ValuePlan] = {}   # value -> its plan; a float Cast's output -> its source's plan
        renamed: dict[str, str] = {}   # op record names a float Cast's module-output names replaced
        for i, node in enumerate(self.nodes):
            if node.op_type == "Constant":
                continue
            chain = self.chains[i]
            path, call = chain[-1] if chain else ("", 0)
            if self._casts_float_to_float(node):
                if self._merge_cast(node, primary, planned, mod_names, model_outputs, plans, renamed):
                    continue
            key = (chain, node.op_type)
            k = counters.get(key, 0)
            counters[key] = k + 1
            outs = [o for o in node.output if o]
            inputs = tuple(primary[v] for v in node_inputs(node) if v in primary)
            tags = self._tags(node, angle)
            for j, o in enumerate(outs):
                o_tags = tags + self.roles.tags(o, primary.get)
                names = mod_names.get(o) or [record_name(path, call, op=node.op_type, k=k,
                                                         output=j if len(node.output) > 1 else None)]
                primary[o] = names[0]
                if tags and "angle" in tags:
                    angle.add(o)
                planned[o] = ValuePlan(value=o, names=names, module=path, op=node.op_type, node_index=i,
                                       inputs=inputs, tags=tuple(dict.fromkeys(o_tags)), model_output=model_outputs.get(o))
                plans.append(planned[o])
        for p in plans if renamed else ():   # consumers of a cast value met before its Cast
            p.inputs = tuple(renamed.get(n, n) for n in p.inputs)
        return plans

    def _casts_float_to_float(self, node: Any) -> bool:
        if node.op_type != "Cast" or not node.input or not node.input[0]:
            return False
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        return to in FLOAT_ELEM_TYPES and self.types.get(node.input[0]) in FLOAT_ELEM_TYPES

    def _merge_cast(self, node: Any, primary: dict[str, str], planned: dict[str, ValuePlan],
                    mod_names: dict[str, list[str]], model_outputs: dict[str, str], plans: list[ValuePlan],
                    renamed: dict[str, str]) -> bool:
        """Read a float Cast's output as its input; False when the Cast must stay a record of its own
        (it is a module's output but what it casts has no record: a graph input or a weight)."""
        src, out = node.input[0], node.output[0]
        source = planned.get(src)
        names = mod_names.get(out, [])
        if source is None and names:
            return False
        if src in primary:
            primary[out] = primary[src]
        if source is None:
            return True
        planned[out] = source
        if names:
            own = [n for n in source.names if n not in mod_names.get(source.value, ())]
            # the cast's module-output names replace the op record name of what it casts, as they would
            # on the uncast graph; innermost module first, as module_outputs orders them
            merged = [n for n in source.names if n not in own] + [n for n in names if n not in source.names]
            merged.sort(key=lambda n: (n.startswith("<root>"), -n.count(".")))
            renamed.update((n, merged[0]) for n in own)
            source.names[:] = merged
            primary[out] = primary[src] = merged[0]
        if out in model_outputs:   # the model output is the cast value, as the graph returns it
            plans.append(ValuePlan(value=out, names=[], module=source.module, op=source.op,
                                   node_index=source.node_index, inputs=(source.names[0],),
                                   model_output=model_outputs[out]))
        return True

    def _tags(self, node: Any, angle: set[str]) -> tuple[str, ...]:
        if node.op_type in RNG_OPS:
            return ("rng", *_draw_tag(node))
        if node.op_type == "DequantizeLinear" and node.input:
            q = self.producer.get(node.input[0])
            if q is not None and self.nodes[q].op_type == "QuantizeLinear" and self.nodes[q].input:
                # QDQ: what consumers of the quantized value see stands for the float value it quantized
                return (TAG_QUANTIZED, f"{TAG_STANDS_FOR}{self.nodes[q].input[0]}")
        if node.op_type in QUANT_OPS:
            return (TAG_QUANTIZED,)
        md = _meta(node)
        fx = _FX_NODE.match(md.get("pkg.torch.onnx.fx_node", ""))
        if node.op_type in ANGLE_OPS or (fx and fx.group(2) in ANGLE_TARGETS and fx.group(1) in node.output):
            return ("angle",)
        if node.op_type in ANGLE_PASS_OPS and any(v in angle for v in node.input):
            return ("angle",)
        return ()


_QUANTIZED = re.compile(r"^(?P<base>.+?)_quantized$")
_TRANSPOSED = "_Transposed"   # onnxruntime.quantization renames a Gemm weight it transposes for MatMulInteger


def model_output_names(outputs: list[str]) -> dict[str, str]:
    """Graph output value -> model-output record name: `output` for one output, `output.<name>` for several
    (a PyTorch capture says `output.0`, `output.wav`; `diff` pairs model outputs by name, then position)."""
    if len(outputs) == 1:
        return {outputs[0]: "output"}
    return {v: f"output.{v}" for v in outputs}


def weight_record_names(graph: Any) -> dict[str, str]:
    """Initializer -> the weight record that stands for it: its own name, or for a quantized weight
    (`W_quantized`, with `W_scale` and `W_zero_point`) the dequantized `W` (quantizer suffixes undone)."""
    names = {}
    inits = {i.name for i in graph.initializer}
    for name in inits:
        m = _QUANTIZED.match(name)
        names[name] = _weight_base(m.group("base")) if m else name
    return names


def _weight_base(base: str) -> str:
    return base[: -len(_TRANSPOSED)] if base.endswith(_TRANSPOSED) else base


# How exporters name the constants they fold into initializers (an eps, a 0.5, a length): `val_3`,
# `scalar_tensor_default_2`, `_tensor_constant0` (torch.export), `onnx::Mul_23`, `/Constant_output_0`
# (TorchScript), `const_fold_opt__12`, `model/dense/BiasAdd:0` (TensorFlow converters).
_GENERATED_NAME = re.compile(r"(::|/|:)|^(_?val|scalar_tensor_default|_?tensor_constant|const(ant)?(_fold_opt)?)[_\d]*$",
                             re.IGNORECASE)
_QUANTIZER_SUFFIXES = ("_scale", "_zero_point")
# torch.export's graph signature, which the dynamo exporter keeps in the graph's metadata: one line per input,
# `p_conv_bias: PARAMETER target='conv.bias'`, `b_eps: BUFFER target='eps' persistent=True`.
_SIGNATURE_KEY = "pkg.torch.export.ExportedProgram.graph_signature"
_STATE_ENTRY = re.compile(r":\s*(?:PARAMETER|BUFFER)\s+target='([^']+)'")


def exported_state_names(model: Any) -> frozenset[str] | None:
    """The state-dict names a dynamo-exported file declares (its torch.export graph signature), or None for
    a file without one (another exporter, a converter)."""
    for prop in model.graph.metadata_props:
        if prop.key == _SIGNATURE_KEY:
            return frozenset(_STATE_ENTRY.findall(prop.value))
    return None


def is_weight(name: str, size: int, state_names: frozenset[str] | None = None) -> bool:
    """Whether a float initializer of `size` elements is a weight to record. Any with more than one element;
    one of a single element (a mono conv's bias, a learned gain) only when it is a weight by name: in the
    state dict of the model it was exported from (`state_names`: the model's own, or the graph signature a
    dynamo export keeps), or else not named as exporters name the constants they fold (`val_3`,
    `scalar_tensor_default`, `onnx::Mul_23`).

        >>> is_weight("decoder.2.bias", 1), is_weight("val_0", 1), is_weight("rsqrt", 1, frozenset({"gain"}))
        (True, False, False)
    """
    if size > 1:
        return True
    if size == 0:
        return False
    if state_names is not None:
        return name in state_names
    return not _GENERATED_NAME.search(name) and not name.endswith(_QUANTIZER_SUFFIXES)


def graph_weights(graph: Any, state_names: frozenset[str] | None = None) -> Iterator[tuple[str, Any, tuple[str, ...]]]:
    """(record name, float array, tags) of every weight an ONNX graph holds: float initializers by name
    (one-element ones only when they are weights by name: `is_weight`), and quantized ones
    (onnxruntime.quantization's `W_quantized` + `W_scale` + `W_zero_point`, dynamic or QDQ) dequantized to
    float32 as `W`, transposed back when the quantizer transposed them (a Gemm's `_Transposed` weight, the W and
    R of a `DynamicQuantizeLSTM`), tagged `dequantized:int8` (or uint8,
    int32). Scales, zero points and the exporter's folded constants are left out."""
    import numpy as np
    from onnx import numpy_helper

    inits = {i.name: i for i in graph.initializer}
    axis_of = {n.input[0]: next((a.i for a in n.attribute if a.name == "axis"), 1)
               for n in graph.node if n.op_type == "DequantizeLinear" and n.input}
    # DynamicQuantizeLSTM stores W and R as [directions, input, 4*hidden]: ONNX's LSTM's last two axes swapped
    lstm_transposed = {v for n in graph.node if n.op_type == "DynamicQuantizeLSTM" for v in list(n.input)[1:3] if v}
    side = set()
    for name in inits:
        m = _QUANTIZED.match(name)
        if m:
            side.update(f"{p}{s}" for p in (m.group("base"), name) for s in ("_scale", "_zero_point"))
    for name, init in inits.items():
        if name in side:
            continue
        m = _QUANTIZED.match(name)
        if m is None:
            arr = numpy_helper.to_array(init)
            if arr.dtype.kind == "f" and is_weight(name, arr.size, state_names):
                yield name, arr, ()
            continue
        base = m.group("base")
        scale = inits.get(f"{base}_scale") or inits.get(f"{name}_scale")
        if scale is None:
            continue
        zp = inits.get(f"{base}_zero_point") or inits.get(f"{name}_zero_point")
        q = numpy_helper.to_array(init)
        s = numpy_helper.to_array(scale).astype(np.float32)
        z = numpy_helper.to_array(zp).astype(np.float32) if zp is not None else np.float32(0)
        if s.ndim == 1 and s.size > 1 and q.ndim > 1:   # per-channel: along the DequantizeLinear's axis
            axis = axis_of.get(name, 1 if q.shape[1:2] == s.shape else 0) % q.ndim
            shape = [1] * q.ndim
            shape[axis] = s.size
            s, z = s.reshape(shape), (z.reshape(shape) if np.ndim(z) else z)
        value = (q.astype(np.float32) - z) * s
        if base.endswith(_TRANSPOSED) and value.ndim == 2:
            value = np.ascontiguousarray(value.T)
        elif name in lstm_transposed and value.ndim == 3:
            value = np.ascontiguousarray(value.swapaxes(1, 2))
        # one quantisation step: the rounding dequantisation is allowed (per channel: the largest scale of a
        # channel that holds values; an all-zero channel, a DFT basis's sine row at 0 Hz, gets scale 1)
        step = float(np.max(np.abs(s)))
        if np.size(s) > 1 and s.ndim == q.ndim:
            held = np.any(q.astype(np.float32) != z, axis=tuple(a for a in range(q.ndim) if s.shape[a] == 1),
                          keepdims=True)
            if held.any():
                step = float(np.max(np.abs(np.broadcast_to(s, held.shape)[held])))
        yield _weight_base(base), value, (f"dequantized:{q.dtype.name}", f"{TAG_QSTEP}{step:.6g}")


def node_inputs(node: Any) -> list[str]:
    """Names a node reads, including outer-scope names used inside its subgraphs (If/Loop/Scan)."""
    names = [v for v in node.input if v]
    for attr in node.attribute:
        # a graph attribute's type says so; one without a type (a hand-made proto) is looked into
        if attr.type in (_GRAPH, _GRAPHS) or (attr.type == 0 and (attr.HasField("g") or len(attr.graphs))):
            for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
                names.extend(_outer_refs(g))
    return names


_GRAPH, _GRAPHS = 5, 10   # AttributeProto.GRAPH, AttributeProto.GRAPHS


def _outer_refs(graph: Any) -> Iterable[str]:
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    for node in graph.node:
        for v in node_inputs(node):
            if v not in defined:
                yield v
        defined.update(node.output)


def _draw_tag(node: Any) -> tuple[str, ...]:
    """The `draw:` tag of an ONNX random node (`RandomNormalLike` with mean 0, scale 1: normal(mean=0,std=1)),
    so that replay and `diff` compare what each side draws."""
    from ...rng.draws import draw_of_onnx

    attrs = [(a.name, a.f if a.type == 1 else a.i if a.type == 2 else None) for a in node.attribute]
    d = draw_of_onnx(node.op_type, attrs)
    return (d.tag(),) if d is not None else ()
