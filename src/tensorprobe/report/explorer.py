"""Findings as Google Model Explorer overlays: node-data files for the graph the candidate ran.

Model Explorer (`pip install 'tensorprobe[explorer]'`, the `ai-edge-model-explorer` package) colours a graph's
nodes from "node data" JSON files: `{"results": {KEY: {"value": ..., "bgColor": ...}}, "thresholds": ...}`, where
KEY is a node id or one of a node's output tensor names (its `outputsMetadata` `tensor_name`). The files are
written here as plain JSON in that format (the package itself is needed only to *view* them, `tensorprobe
explore`), one file per overlay:

- `snr_db.json` (diff): per node, the SNR in dB of its output against the reference (the worst of its outputs;
  identical tensors at 160 dB), red where the diff fails it, green where it passes;
- `findings.json` (diff): per node, what the diff says of it in words: `first divergence: weights`,
  `strongest amplifier x40`, `fail: inherited`, `NaN born here (channels 3, 7)`, `pass`;
- `nan.json` (diff and nan): per node holding non-finite values, where they were born and their count.

Records map to graph nodes by the runtime's own name (`Record.runtime_name`: an ONNX Runtime capture keeps the
ONNX value name). With the ONNX file at hand, a value becomes the node that produces it and the key is the node
name (`tensorprobe explore` gives every node its name as id); without it, the key is the value name, which
Model Explorer matches against the node's output tensor names.

    >>> from tensorprobe.report.explorer import write_diff_node_data
    >>> write_diff_node_data(report, "overlays/", graph="model.onnx")   # doctest: +SKIP
    {'snr_db': PosixPath('overlays/snr_db.json'), 'findings': ..., 'nan': ...}
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..bundle import Bundle, atomic_write_bytes
from ..errors import InputError

SNR_CAP = 160.0        # dB written for identical tensors (JSON has no Infinity; Model Explorer needs a number)
SNR_FLOOR = -40.0      # dB written for an error larger than the signal by more than that (or no signal at all)

# colours of the findings overlay (CSS colours), strongest first: a node shows the colour of its worst finding
COLORS = {
    "nan_origin": ("#000000", "#ffffff"),
    "first_divergence": ("#b71c1c", "#ffffff"),
    "strongest_amplifier": ("#6a1b9a", "#ffffff"),
    "fail": ("#ef9a9a", "#000000"),
    "nonfinite": ("#616161", "#ffffff"),
    "not_proven": ("#fff59d", "#000000"),
    "pass": ("#c8e6c9", "#000000"),
}
_RANK = {k: i for i, k in enumerate(COLORS)}


@dataclass(frozen=True)
class GraphIndex:
    """What a graph file says about its values: which node produces each value (ONNX value name -> node id).

    Node ids are ONNX node names, or `<OpType>_<index>` for a node without a name (as `onnx_graph_json` names
    them)."""

    path: Path | None
    producer: Mapping[str, str]
    readers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)   # value name -> nodes reading it

    def key(self, value: str) -> str:
        return self.producer.get(value, value)


def onnx_node_ids(model: Any) -> list[str]:
    """Every node's id in graph order: its name, or `<OpType>_<index>` when it has none (or repeats one)."""
    ids, seen = [], set()
    for i, node in enumerate(model.graph.node):
        nid = node.name or f"{node.op_type}_{i}"
        if nid in seen:
            nid = f"{nid}_{i}"
        seen.add(nid)
        ids.append(nid)
    return ids


def graph_index(graph: str | os.PathLike | None) -> GraphIndex:
    """Index an ONNX file's values by producing node (an empty index when `graph` is None).

    Raises:
        InputError: the file is missing or not an ONNX model, or the onnx package is not installed.
    """
    if graph is None:
        return GraphIndex(None, {})
    path = Path(graph)
    if not path.is_file():
        raise InputError(f"{path}: no such graph file")
    if path.suffix != ".onnx":
        raise InputError(f"{path}: node data can be keyed by node for an ONNX graph only (.onnx); without a graph "
                         "the overlays are keyed by the runtime's value names")
    try:
        import onnx
    except ImportError:
        raise InputError("reading an ONNX graph needs the onnx package: pip install 'tensorprobe[onnx]'") from None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        raise InputError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    producer: dict[str, str] = {}
    readers: dict[str, list[str]] = {}
    for nid, node in zip(onnx_node_ids(model), model.graph.node):
        for out in node.output:
            if out:
                producer[out] = nid
        for inp in node.input:
            if inp:
                readers.setdefault(inp, []).append(nid)
    return GraphIndex(path, producer, {k: tuple(v) for k, v in readers.items()})


def candidate_graph(cand: Bundle) -> Path | None:
    """The ONNX file an ONNX Runtime capture ran, when it still exists (as recorded, or beside the bundle)."""
    for raw in (cand.runtime.get("onnx_file"), (cand.manifest.get("model") or {}).get("artifact")):
        if not isinstance(raw, str) or not raw.endswith(".onnx"):
            continue
        p = Path(raw)
        for c in (p, Path(cand.path).parent / p, Path(cand.path).parent / p.name):
            if c.is_file():
                return c
    return None


@dataclass
class _Node:
    snr: float | None = None
    status: str | None = None
    labels: list[str] | None = None
    rank: int = len(COLORS)
    nan: str | None = None

    def mark(self, kind: str, label: str) -> None:
        self.labels = (self.labels or []) + [label]
        self.rank = min(self.rank, _RANK[kind])


def _snr_value(v: float | None) -> float | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return float(min(max(v, SNR_FLOOR), SNR_CAP))


def _channels(stats: Any) -> str:
    """` (channels 3, 7 of 256)`: the channels (dim 1) holding NaN/Inf, as the statistics kept them."""
    idx = tuple(getattr(stats, "nonfinite_channel_idx", ()) or ())
    n = getattr(stats, "nonfinite_channels", 0) + getattr(stats, "partial_nonfinite_channels", 0)
    of = f" of {stats.channels}" if getattr(stats, "channels", None) else ""
    if not n:
        return ""
    if not idx:
        return f" ({n} channel{'s' if n > 1 else ''}{of})"
    shown = ", ".join(str(i) for i in idx[:8]) + (", …" if n > min(len(idx), 8) else "")
    return f" (channel{'s' if n > 1 else ''} {shown}{of})"


def _nonfinite(stats: Any) -> int:
    return int(getattr(stats, "nan", 0) + getattr(stats, "posinf", 0) + getattr(stats, "neginf", 0))


def _overlay(name: str, results: Mapping[str, Mapping[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"name": name, "results": dict(results), **extra}


def diff_node_data(report: Any, cand: Bundle | None = None, *, graph: str | os.PathLike | None = None,
                   nan_origin: Any = None) -> dict[str, dict[str, Any]]:
    """The overlays of a `DiffReport` as Model Explorer GraphNodeData dicts: {"snr_db": ..., "findings": ...,
    "nan": ...} ("nan" only when the candidate holds non-finite values or `nan_origin` found them).

    Args:
        cand: the candidate bundle (opened from the report when omitted): its records' runtime names.
        graph: the ONNX file the candidate ran (found from the bundle's manifest when omitted and it exists).
        nan_origin: a `NanOrigin` of the candidate bundle, to mark where its NaN/Inf was born (searched here
            when omitted and the candidate holds NaN/Inf).
    """
    cand = cand or Bundle.open(report.cand)
    index = graph_index(graph if graph is not None else candidate_graph(cand))
    nodes: dict[str, _Node] = {}

    def node_of(cand_name: str) -> str:
        rec = cand.get(cand_name)
        return index.key((rec.runtime_name if rec is not None and rec.runtime_name else None) or cand_name)

    amp = report.strongest_amplifier
    for p in report.pairs:
        if p.kind in ("model_input", "param", "buffer"):
            continue
        key = node_of(p.cand_name)
        n = nodes.setdefault(key, _Node())
        snr = _snr_value(p.metric("snr_db")) if p.metrics else None
        if snr is not None:
            n.snr = snr if n.snr is None else min(n.snr, snr)
        if p.name == report.first_divergence:
            n.mark("first_divergence", f"first divergence: {p.cause or 'own'}" + (f" ({p.name})" if key != p.name else ""))
        if amp is not None and p.name == amp.name:
            n.mark("strongest_amplifier", f"strongest amplifier x{amp.gain:.3g}")
        if p.failed:
            n.status = "fail"
            if p.name != report.first_divergence:
                n.mark("fail", f"fail: {p.cause}" if p.cause else "fail")
        elif p.status == "not_proven":
            n.status = n.status or "not_proven"
            n.mark("not_proven", "not proven (statistics only)")
        elif p.passed:
            n.status = n.status or "pass"
            n.mark("pass", "pass")
    if nan_origin is None and any(_nonfinite(r.stats) for r in cand if r.kind not in ("param", "buffer")):
        from ..nan import find_nonfinite_in_bundle      # where the candidate's NaN/Inf was born, to mark it

        nan_origin = find_nonfinite_in_bundle(cand)
    _mark_nonfinite(nodes, cand, index, nan_origin)

    snr = {k: {"value": n.snr, **_bg("fail" if n.status == "fail" else "pass")}
           for k, n in nodes.items() if n.snr is not None}
    out = {"snr_db": _overlay("tensorprobe: SNR dB vs reference", snr, hideAggregatedStats=["sum", "avg"]),
           "findings": _overlay("tensorprobe: diff findings", _labels(nodes), showExpandedSummaryOnGroupNode=True,
                                showLabelCountColumnsInChildrenStatsTable=True)}
    nan = {k: {"value": n.nan, **_bg("nan_origin" if "born" in n.nan else "nonfinite")}
           for k, n in nodes.items() if n.nan}
    if nan:
        out["nan"] = _overlay("tensorprobe: NaN/Inf", nan, showExpandedSummaryOnGroupNode=True)
    return out


def nan_node_data(origin: Any, bundle: Bundle, *, graph: str | os.PathLike | None = None) -> dict[str, dict[str, Any]]:
    """The `nan` overlay of a NaN search in a bundle (`find_nonfinite_in_bundle`): the node where NaN/Inf was
    born (its diagnosis' first sentence, its channels) and every node its values reach, with their counts."""
    index = graph_index(graph if graph is not None else candidate_graph(bundle))
    nodes: dict[str, _Node] = {}
    _mark_nonfinite(nodes, bundle, index, origin)
    return {"nan": _overlay("tensorprobe: NaN/Inf", {k: {"value": n.nan, **_bg(
        "nan_origin" if "born" in n.nan else "nonfinite")} for k, n in nodes.items() if n.nan},
        showExpandedSummaryOnGroupNode=True)}


def _mark_nonfinite(nodes: dict[str, _Node], bundle: Bundle, index: GraphIndex, origin: Any) -> None:
    born = getattr(origin, "record", None) if origin is not None and getattr(origin, "found", False) else None
    weight = bundle.get(born) if born is not None else None
    if weight is not None and weight.kind in ("param", "buffer"):
        # A weight is no node of the graph Model Explorer draws (an initializer shows as a node's input): NaN/Inf
        # enters the forward at the first node that reads it, which the graph names, else (no graph) the first
        # op output holding non-finite values in execution order, the op the weight fed.
        readers = set(index.readers.get(weight.runtime_name or weight.name, ()))
        entry = next((r for r in bundle if r.kind not in ("model_input", "param", "buffer") and _nonfinite(r.stats)
                      and (not readers or index.key(r.runtime_name or r.name) in readers)), None)
        if entry is not None:
            key = index.key(entry.runtime_name or entry.name)
            why = (origin.diagnosis[0] if getattr(origin, "diagnosis", ()) else origin.cause) or "non-finite"
            n = nodes.setdefault(key, _Node())
            n.nan = f"NaN/Inf born here from weight {weight.name}{_channels(entry.stats)}: {why}"[:240]
            n.mark("nan_origin", f"NaN/Inf born here from weight {weight.name}{_channels(entry.stats)}")
            born = entry.name
    for rec in bundle:
        if rec.kind in ("model_input", "param", "buffer"):
            continue
        count = _nonfinite(rec.stats)
        if not count and rec.name != born:
            continue
        key = index.key(rec.runtime_name or rec.name)
        n = nodes.setdefault(key, _Node())
        if rec.name == born:
            if n.nan and "born" in n.nan:
                continue        # the weight's reader, marked above
            why = (origin.diagnosis[0] if getattr(origin, "diagnosis", ()) else origin.cause) or "non-finite"
            n.nan = f"NaN/Inf born here{_channels(rec.stats)}: {why}"[:240]
            n.mark("nan_origin", f"NaN/Inf born here{_channels(rec.stats)}")
        elif not (n.nan and "born" in n.nan):
            n.nan = f"{count} non-finite of {rec.stats.numel}{_channels(rec.stats)}"
            n.mark("nonfinite", "non-finite (inherited)" if born else "non-finite")


def _bg(kind: str) -> dict[str, str]:
    bg, fg = COLORS[kind]
    return {"bgColor": bg, "textColor": fg}


def _labels(nodes: Mapping[str, _Node]) -> dict[str, dict[str, Any]]:
    out = {}
    for k, n in nodes.items():
        if not n.labels:
            continue
        # the strongest finding leads; "pass" is dropped beside any other finding
        labels = list(dict.fromkeys(l for l in n.labels if l != "pass" or len(set(n.labels)) == 1))
        kind = list(COLORS)[n.rank]
        out[k] = {"value": "; ".join(labels), **_bg(kind)}
    return out


def write_node_data(overlays: Mapping[str, Mapping[str, Any]], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write each overlay as `OUT_DIR/<name>.json` (atomically); returns {name: path}."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory (--model-explorer takes a directory)")
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, data in overlays.items():
        paths[name] = out / f"{name}.json"
        atomic_write_bytes(paths[name], json.dumps(data, indent=1).encode("utf-8"))
    return paths


def write_diff_node_data(report: Any, out_dir: str | os.PathLike, **kw: Any) -> dict[str, Path]:
    """`diff_node_data` written into `out_dir` (one JSON file per overlay); returns {name: path}."""
    return write_node_data(diff_node_data(report, **kw), out_dir)


# ---- the graph Model Explorer draws -------------------------------------------------------------------------
def onnx_graph_json(path: str | os.PathLike) -> str:
    """An ONNX file as Model Explorer's graph JSON (what its adapters return): one node per ONNX node, its id
    the node's name (as the overlays are keyed), its namespace the PyTorch module path tensorprobe's export
    stamped on it (`tensorprobe.scope`) or the legacy exporter's `/a/b/` scope, and every output value's name
    as `tensor_name` (overlays keyed by value name match it). Graph inputs and initializers read by a node
    are shown on the node as inputs, not as nodes of their own, except the model's inputs.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    ids = onnx_node_ids(model)
    producer: dict[str, tuple[str, int]] = {}
    nodes: list[dict[str, Any]] = []
    for inp in g.input:
        producer[inp.name] = (f"input:{inp.name}", 0)
        nodes.append({"id": f"input:{inp.name}", "label": "Input", "namespace": "",
                      "attrs": [{"key": "name", "value": inp.name}],
                      "outputsMetadata": [{"id": "0", "attrs": [{"key": "tensor_name", "value": inp.name}]}]})
    for nid, node in zip(ids, g.node):
        for k, out in enumerate(node.output):
            producer[out] = (nid, k)
    spaces = _namespaces(g, ids)
    for nid, node in zip(ids, g.node):
        edges = [{"sourceNodeId": producer[v][0], "sourceNodeOutputId": str(producer[v][1]),
                  "targetNodeInputId": str(i)} for i, v in enumerate(node.input) if v in producer]
        attrs = [{"key": "name", "value": node.name or nid}] + [
            {"key": a.name, "value": _attr_text(a)} for a in node.attribute if a.type != onnx.AttributeProto.GRAPH]
        nodes.append({"id": nid, "label": node.op_type, "namespace": spaces[nid],
                      "attrs": attrs, "incomingEdges": edges,
                      "inputsMetadata": [{"id": str(i), "attrs": [{"key": "tensor_name", "value": v}]}
                                         for i, v in enumerate(node.input)],
                      "outputsMetadata": [{"id": str(k), "attrs": [{"key": "tensor_name", "value": v}]}
                                          for k, v in enumerate(node.output)]})
    for k, out in enumerate(g.output):
        if out.name in producer:
            src = producer[out.name]
            nodes.append({"id": f"output:{out.name}", "label": "Output", "namespace": "",
                          "attrs": [{"key": "name", "value": out.name}],
                          "incomingEdges": [{"sourceNodeId": src[0], "sourceNodeOutputId": str(src[1]),
                                             "targetNodeInputId": "0"}]})
    name = Path(path).name
    return json.dumps({"graphCollections": [{"label": name, "graphs": [{"id": g.name or name, "nodes": nodes}]}]})


def _namespaces(g: Any, ids: list[str]) -> dict[str, str]:
    """Each node's namespace. A node tensorprobe's export scoped keeps its scope (`[]`: the root); a node added
    after the export (a quantizer's DynamicQuantizeLinear, ConvInteger, its rescale Mul) takes the namespace of
    the node that reads its output, else of the node whose output it reads, so an int8 graph folds into the same
    modules as its float original."""
    own = {nid: _namespace(node) for nid, node in zip(ids, g.node)}
    known = {nid for nid, node in zip(ids, g.node)
             if any(p.key == "tensorprobe.scope" for p in node.metadata_props) or node.name.startswith("/")}
    if not known:
        return own
    # an added node that reads a module's weight (conv1.weight_quantized, conv1.weight_scale) is that module's
    weights = {i.name for i in g.initializer}
    for nid, node in zip(ids, g.node):
        if nid in known:
            continue
        for v in node.input:
            base = re.sub(r"(_quantized|_scale|_zero_point)$", "", v) if v in weights else ""
            if "." in base:
                own[nid] = "/".join(base.rsplit(".", 1)[0].split("."))
                known.add(nid)
                break
    made = {out: nid for nid, node in zip(ids, g.node) for out in node.output}
    readers: dict[str, list[str]] = {}
    for nid, node in zip(ids, g.node):
        for v in node.input:
            readers.setdefault(v, []).append(nid)
    for _ in range(8):          # a chain of added nodes takes a few passes
        changed = False
        for nid, node in zip(ids, g.node):
            if nid in known:
                continue
            near = [r for out in node.output for r in readers.get(out, ()) if r in known] + \
                   [made[v] for v in node.input if v in made and made[v] in known]
            if near:
                own[nid] = own[near[0]]
                known.add(nid)
                changed = True
        if not changed:
            break
    return own


def _namespace(node: Any) -> str:
    for p in node.metadata_props:
        if p.key == "tensorprobe.scope" and p.value:
            try:        # [[module path, call], ...], outermost first
                scope = json.loads(p.value)
                return "/".join(str(scope[-1][0]).split(".")) if scope else ""
            except (ValueError, TypeError, IndexError, KeyError):
                return ""
    if node.name.startswith("/"):
        return "/".join(c for c in node.name.split("/")[1:-1] if c)
    return ""


def _attr_text(a: Any) -> str:
    import onnx

    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if hasattr(v, "dims"):        # a tensor attribute: its shape, not its data
        return f"tensor{list(v.dims)}"
    text = str(v)
    return text if len(text) <= 200 else text[:200] + "…"



# ---- a sweep: where items first diverge ----------------------------------------------------------------------
def sweep_node_data(results: str | os.PathLike, *, graph: str | os.PathLike | None = None) -> dict[str, dict[str, Any]]:
    """The `sweep` overlay of a RESULTS directory: per node, the share of the sweep's compared items whose
    first divergence it is (value: percent; label in the side panel: `first divergence in 12 of 12 items`).

    Item records name their first divergence by its reference record name; a kept item's own bundles (a
    sweep keeps the items with a finding) say which candidate record, and so which graph node, that is.
    Raises InputError when no item with a first divergence kept its bundles."""
    from collections import Counter

    from ..sweep import ResultStore

    items = [r for r in ResultStore(results).read().values() if r.get("status") == "done"]
    firsts = Counter(r["first_divergence"] for r in items if r.get("first_divergence"))
    keys: dict[str, str] = {}
    index: GraphIndex | None = GraphIndex(None, {}) if graph is None else graph_index(graph)
    for r in items:
        if not r.get("bundle") or not r.get("first_divergence") or r["first_divergence"] in keys:
            continue
        kept = Path(r["bundle"])
        cand_dirs = [m.parent for m in kept.glob("*/manifest.json") if m.parent.name != "ref"]
        if not (kept / "ref").is_dir() or len(cand_dirs) != 1:
            continue
        from ..diff import diff

        cand = Bundle.open(cand_dirs[0])
        if graph is None and not index.producer:
            index = graph_index(candidate_graph(cand))
        report = diff(kept / "ref", cand)
        for p in report.pairs:
            if p.name in firsts and p.name not in keys:
                rec = cand.get(p.cand_name)
                keys[p.name] = index.key((rec.runtime_name if rec is not None else None) or p.cand_name)
    if firsts and not keys:
        raise InputError(f"{results}: no item with a first divergence kept its bundles; the overlay needs one")
    shares: dict[str, int] = Counter()
    for name, n in firsts.items():
        if name in keys:
            shares[keys[name]] += n
    done = len(items)
    results_: dict[str, dict[str, Any]] = {}
    for key, n in shares.items():
        results_[key] = {"value": round(100.0 * n / done, 3), **_bg("first_divergence" if n == max(shares.values())
                                                                   else "fail")}
    labels = {k: {"value": f"first divergence in {n} of {done} items", **_bg("first_divergence")}
              for k, n in shares.items()}
    return {"sweep_first_divergence": _overlay("tensorprobe: % of items first diverging here", results_),
            "sweep_labels": _overlay("tensorprobe: sweep first divergence", labels)}


# ---- isolate: each module call's own error, on the candidate's graph ----------------------------------------
def _module_chains_exported(ep: Any, model: Any = None) -> dict[str, list[tuple[str, int]]]:
    """fx node name -> its module chain, for the graph's op nodes, as tensorprobe's ONNX export stamps it
    (`tensorprobe.scope`; `runtimes.onnxruntime.export.module_chains`)."""
    from ..runtimes.onnxruntime.export import module_chains

    ops = {n.name for n in ep.graph.nodes if n.op == "call_function"}
    return {k: v for k, v in module_chains(ep, model).items() if k in ops}


def _module_chains_onnx(path: Path) -> dict[str, list[tuple[str, int]]]:
    """ONNX node id -> its module chain, from tensorprobe's `tensorprobe.scope` (or the legacy exporter's
    `/a/b/op` node names, call 0)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    chains: dict[str, list[tuple[str, int]]] = {}
    for nid, node in zip(onnx_node_ids(model), model.graph.node):
        chain: list[tuple[str, int]] = []
        scope = next((p.value for p in node.metadata_props if p.key == "tensorprobe.scope"), None)
        if scope:
            try:
                chain = [(str(p), int(c)) for p, c in json.loads(scope)]
            except (ValueError, TypeError):
                chain = []
        elif node.name.startswith("/"):
            parts = [c for c in node.name.split("/")[1:-1] if c]
            chain = [(".".join(parts[:i + 1]), 0) for i in range(len(parts))]
        chains[nid] = chain
    return chains


def module_call_nodes(chains: Mapping[str, list[tuple[str, int]]]) -> dict[tuple[str, int], str]:
    """(module path, call) -> the graph node that gives that call's output: the last node (graph order) inside
    the call, not counting tuple unpacking (`getitem`), so an LSTMCell's call is its `lstm_cell` node."""
    out: dict[tuple[str, int], str] = {}
    for nid, chain in chains.items():
        if re.fullmatch(r"getitem(_\d+)?", nid) and chain and all(k in out for k in chain):
            continue
        for m, c in chain:
            out[(m, c)] = nid       # later nodes replace earlier ones: the last node of the call
    return out


def isolate_node_data(report: Any, nodes: Mapping[tuple[str, int], str]) -> dict[str, dict[str, Any]]:
    """The overlays of an `IsolateReport` on the candidate's graph, given which node gives each module call's
    output (`module_call_nodes`): {"local_snr_db": ..., "accumulated_snr_db": ..., "isolate": ...}.

    - `local_snr_db`: the module call's own error (run alone on the reference's inputs), red where it fails;
    - `accumulated_snr_db`: the error of the candidate's own run at that output, red where it fails;
    - `isolate`: in words, `wrong on its own: <reasons>` (the first such call: `first wrong on its own`, dark
      red; the module an ascent found above the isolated ones likewise), `inherits error (local 97 dB)`, `pass`.
    A module call with no node in the graph (the model's root, a module the export inlined away) is left out.

        >>> nodes = module_call_nodes(_module_chains_onnx(Path("cand.onnx")))     # doctest: +SKIP
        >>> isolate_node_data(report, nodes)["isolate"]["results"]                # doctest: +SKIP
        {'node_conv1d_2': {'value': 'first wrong on its own: SNR 31.2 dB < 60', ...}, ...}
    """
    per: dict[str, _Node] = {}
    acc: dict[str, float] = {}
    acc_fail: set[str] = set()
    local_fail: set[str] = set()
    layers = list(report.layers)
    ascent = getattr(report, "ascent", None)
    if ascent is not None:
        layers += [x for x in ascent.tested if x.name not in {y.name for y in layers}]
    culprit = report.culprit
    for layer in layers:
        key = nodes.get((layer.module, layer.call))
        if key is None or not layer.module:
            continue
        n = per.setdefault(key, _Node())
        lsnr = _snr_value((layer.local or {}).get("snr_db"))
        if lsnr is not None:
            n.snr = lsnr if n.snr is None else min(n.snr, lsnr)
        asnr = _snr_value((layer.accumulated or {}).get("snr_db"))
        if asnr is not None:
            acc[key] = min(acc.get(key, asnr), asnr)
        if layer.accumulated_fails:
            acc_fail.add(key)
        why = "; ".join(layer.local_reasons)
        if layer.name == culprit:
            local_fail.add(key)
            n.mark("first_divergence", f"first wrong on its own ({layer.name}): {why}" if why
                   else f"first wrong on its own ({layer.name})")
        elif layer.local_fails:
            local_fail.add(key)
            n.mark("strongest_amplifier", f"wrong on its own ({layer.name}): {why}")
        elif layer.verdict == "inherited":
            own = ("" if lsnr is None else ", identical alone" if lsnr >= SNR_CAP else f", local {lsnr:.3g} dB")
            n.mark("fail", f"inherits error ({layer.name}{own})")
        elif layer.verdict == "ok":
            n.mark("pass", "pass")
    local = {k: {"value": n.snr, **_bg("fail" if k in local_fail else "pass")} for k, n in per.items()
             if n.snr is not None}
    accumulated = {k: {"value": v, **_bg("fail" if k in acc_fail else "pass")} for k, v in acc.items()}
    return {"local_snr_db": _overlay("tensorprobe isolate: local SNR dB (module alone)", local,
                                     hideAggregatedStats=["sum", "avg"]),
            "accumulated_snr_db": _overlay("tensorprobe isolate: accumulated SNR dB", accumulated,
                                           hideAggregatedStats=["sum", "avg"]),
            "isolate": _overlay("tensorprobe isolate: findings", _labels(per), showExpandedSummaryOnGroupNode=True,
                                showLabelCountColumnsInChildrenStatsTable=True)}


def write_isolate_node_data(report: Any, out_dir: str | os.PathLike, *, graph: str | os.PathLike | None = None,
                            model: Any = None, args: tuple = (), kwargs: Mapping[str, Any] | None = None
                            ) -> dict[str, Path]:
    """`isolate_node_data` written into `out_dir`, keyed by the nodes of `graph` (an ONNX file of the candidate
    that tensorprobe exported, or one of the legacy exporter) or, without a graph, of the candidate `model`
    exported here with `torch.export` on `args` and saved as `OUT_DIR/candidate.pt2` (what `tensorprobe explore
    OUT_DIR/candidate.pt2 --data OUT_DIR` opens; Model Explorer names its nodes by the fx node names the
    overlays use). Returns {name: path}, the graph under "graph" when written here.

    Raises:
        InputError: the graph is missing or not ONNX, or the candidate does not export (then pass --graph).
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory (--model-explorer takes a directory)")
    written: dict[str, Path] = {}
    if graph is not None:
        index = graph_index(graph)       # the same checks (exists, .onnx, readable) as diff's --graph
        chains = _module_chains_onnx(index.path)
    else:
        if model is None:
            raise InputError("isolate overlays need the candidate's graph: --graph model.onnx, or the model")
        import torch

        try:
            ep = torch.export.export(model.eval(), tuple(args), dict(kwargs or {}), strict=False)
        except Exception as e:      # the exporter's own failure: say it in one line and how to go on
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise InputError(f"the candidate does not export with torch.export ({type(e).__name__}: {msg[:200]}); "
                             "pass its ONNX file with --graph model.onnx") from None
        chains = _module_chains_exported(ep, model)
        out.mkdir(parents=True, exist_ok=True)
        import io

        buf = io.BytesIO()
        torch.export.save(ep, buf)
        written["graph"] = out / "candidate.pt2"
        atomic_write_bytes(written["graph"], buf.getvalue())
    written.update(write_node_data(isolate_node_data(report, module_call_nodes(chains)), out))
    return written
