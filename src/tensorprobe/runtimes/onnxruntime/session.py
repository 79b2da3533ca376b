"""Running an ONNX graph under ONNX Runtime for a capture: inputs, sessions that share weights, memory
estimates, and the segments whose outputs fit one reused buffer (IOBinding). No torch."""

from __future__ import annotations

import functools
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ...bundle.writer import PREFAULTED
from ...errors import InputError
from .names import ValuePlan, node_inputs

_MIN_BUDGET = 256 << 20
POOL_BYTES = 256 << 20  # reusable output buffer of a capture run (see `adapter._OrtRun._run_full`)


def save_model(proto: Any, path: Path) -> None:
    import onnx

    if proto.ByteSize() > (1 << 31) - (64 << 20):
        onnx.save(proto, str(path), save_as_external_data=True, location=path.name + ".data")
    else:
        onnx.save(proto, str(path))


def load_inputs(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Named input arrays from an `.npz` (never unpickled; text arrays included) or `.safetensors` file
    (`bundle.reader.load_arrays`; InputError when it can't be read).

    Example:
        >>> feeds = load_inputs("inputs.npz")       # doctest: +SKIP
    """
    from ...bundle.reader import load_arrays
    from ...errors import BundleError

    try:
        return load_arrays(path)
    except BundleError as e:
        raise InputError(str(e)) from None


def graph_feeds(model: Any, inputs: Any) -> dict[str, np.ndarray]:
    """Match `inputs` (a tuple in graph-input order, or a dict by name) to the graph's inputs."""
    import onnx

    inits = {i.name for i in model.graph.initializer}
    specs = [i for i in model.graph.input if i.name not in inits]
    names = [s.name for s in specs]
    if isinstance(inputs, dict):
        missing = [n for n in names if n not in inputs]
        extra = [k for k in inputs if k not in names]
        if missing or extra:
            raise InputError(f"inputs don't match the graph: missing {missing or 'none'}, unknown {extra or 'none'}; "
                             f"the graph takes {', '.join(_describe(s) for s in specs)}")
        values = [inputs[n] for n in names]
    else:
        values = list(inputs)
        if len(values) != len(names):
            raise InputError(f"the graph takes {len(names)} inputs ({', '.join(_describe(s) for s in specs)}), "
                             f"got {len(values)}")
    feeds = {}
    for spec, v in zip(specs, values):
        arr = v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)   # a torch tensor, or array-like
        elem = spec.type.tensor_type.elem_type
        if elem == onnx.TensorProto.STRING or arr.dtype.kind in "USO":
            arr = _string_feed(spec.name, arr, elem == onnx.TensorProto.STRING)
        want = onnx.helper.tensor_dtype_to_np_dtype(elem) if elem else arr.dtype
        if arr.dtype != want:
            if arr.dtype.kind != np.dtype(want).kind and not (arr.dtype.kind in "iu" and np.dtype(want).kind in "iu"):
                raise InputError(f"input {spec.name!r}: got {arr.dtype}, the graph expects {np.dtype(want)}")
            arr = arr.astype(want)
        dims = spec.type.tensor_type.shape.dim
        fixed = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        if dims and (len(fixed) != arr.ndim or any(f is not None and f != n for f, n in zip(fixed, arr.shape))):
            raise InputError(f"input {spec.name!r}: got shape {list(arr.shape)}, the graph expects {_describe(spec)} "
                             "(export with inputs of this shape, or with dynamic axes)")
        feeds[spec.name] = np.require(arr, requirements="C")   # not ascontiguousarray: it makes 0-d arrays 1-d
    return feeds


def _string_feed(name: str, arr: np.ndarray, wanted: bool) -> np.ndarray:
    """A text input as ONNX Runtime takes it: an object array of `str`, from fixed-width text (`<U`, bytes
    decoded as UTF-8). Text for a numeric input, or numbers for a text input, is refused by name."""
    if not wanted:
        raise InputError(f"input {name!r}: got text ({arr.dtype}), the graph expects numbers")
    if arr.dtype.kind == "S":
        arr = np.char.decode(arr, "utf-8")
    if arr.dtype.kind not in "UO":
        raise InputError(f"input {name!r}: got {arr.dtype}, the graph expects text (save it as np.array(..., dtype=str))")
    return arr.astype(object)


def _describe(spec: Any) -> str:
    import onnx

    t = spec.type.tensor_type
    dims = [d.dim_param or str(d.dim_value) if (d.dim_param or d.HasField("dim_value")) else "?" for d in t.shape.dim]
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)).name if t.elem_type else "?"
    return f"{spec.name}[{','.join(dims)}] {dtype}"


# ---- sessions, sizes, segments ------------------------------------------------------------------------
class SharedInitializers:
    """The large initializers of a model, handed to each segment's session from memory.

    Serializing a segment with its weights inline, for ORT to parse them back, cost ~0.9 s over the 33
    segments of a 10 s Kokoro decoder (200 MB of weights, fresh memory each time). Each large initializer is
    instead read once into an `OrtValue`; segments carry a stub that marks its data external, and ORT copies
    the data in from the `OrtValue` before it optimizes the graph (`add_external_initializers`), so constant
    folding and weight pre-packing still see real weights.

        >>> w = SharedInitializers(model)                                                 # doctest: +SKIP
        >>> sess = make_session(segment, initializers=w.values_for(segment))              # doctest: +SKIP
    """

    # Smaller ones stay inline: shape-like constants must be readable by shape inference.
    MIN_BYTES = 4096

    def __init__(self, model: Any):
        import onnx
        import onnxruntime as ort

        self.protos: dict[str, Any] = {}  # name -> initializer proto to put in a segment (maybe a stub)
        self._values: dict[str, Any] = {}  # name -> OrtValue over the data (it keeps its array alive)
        for init in model.graph.initializer:
            self.protos[init.name] = init
            dtype = _BINDABLE.get(init.data_type)
            if dtype is None or init.data_location == onnx.TensorProto.EXTERNAL:
                continue
            raw = init.raw_data  # a copy, made once
            if len(raw) < self.MIN_BYTES:
                continue
            arr = np.frombuffer(raw, dtype=dtype).reshape(tuple(init.dims))
            stub = onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims,
                                    data_location=onnx.TensorProto.EXTERNAL)
            stub.external_data.add(key="location", value="tensorprobe-in-memory")
            self.protos[init.name] = stub
            self._values[init.name] = ort.OrtValue.ortvalue_from_numpy(arr)

    def values_for(self, model: Any) -> dict[str, Any]:
        """name -> OrtValue for the stubbed initializers `model` holds."""
        return {i.name: self._values[i.name] for i in model.graph.initializer if i.name in self._values}


def make_session(model: Any, threads: int | None = None, initializers: dict[str, Any] | None = None) -> Any:
    """An ONNX Runtime CPU session for an in-memory model (written to a temp dir past 2 GB).

    `initializers`: name -> OrtValue for initializers whose data the model marks external
    (see `SharedInitializers`)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if initializers:
        opts.add_external_initializers(list(initializers), list(initializers.values()))
    # ERROR lines repeat what the exception says, which the CLI prints as its one line; quiet keeps FATAL only
    from ...logs import is_quiet

    opts.log_severity_level = 4 if is_quiet() else 3
    # ORT's pool threads spin after a run; meanwhile the statistics (torch, multi-threaded) wait for cores
    # those threads hold: 40x slower statistics on a 2-core machine. Let them sleep instead.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    # A capture runs a session once. The memory pattern ORT plans after a run pre-allocates one block for
    # all values of the next run: with every value marked or reduced, faulting that block in made the
    # second run 4x slower than the first (6.1 s against 1.5 s for 3 s of Kokoro audio).
    opts.enable_mem_pattern = False
    if threads:
        opts.intra_op_num_threads = threads
    try:  # protobuf refuses to serialize past 2 GB; asking ByteSize() first would cost a serialization
        data = model.SerializeToString()
    except Exception:  # noqa: BLE001 - protobuf's EncodeError/ValueError, depending on the backend
        data = None
    if data is not None:
        return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tensorprobe-ort-") as d:
        path = Path(d) / "model.onnx"
        save_model(model, path)
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def with_outputs(model: Any, values: list[str]) -> Any:
    """A copy of `model` whose graph outputs are exactly `values` (the "mark all" step)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    known = {v.name: v for v in list(model.graph.value_info) + list(model.graph.output)}
    del out.graph.output[:]
    for v in values:
        out.graph.output.append(known[v] if v in known else onnx.helper.make_empty_tensor_value_info(v))
    return out


def estimate_bytes(model: Any, feeds: dict[str, np.ndarray]) -> tuple[dict[str, int], dict[str, tuple[int, ...]],
                                                                      dict[str, int]]:
    """Bytes, shape and ONNX element type of each value, from shape inference with the concrete input shapes."""
    import onnx

    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = light.graph
    g.node.extend(model.graph.node)
    for init in model.graph.initializer:  # big weights become typed inputs: shapes without data
        if math.prod(init.dims) > 512:  # (not len(raw_data): each access copies the bytes)
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            g.initializer.append(init)
    for name, arr in feeds.items():
        g.input.append(onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
    # Data propagation (shapes computed by Shape/Gather/Concat chains) costs 13x the plain inference on the
    # Kokoro decoder (0.38 s against 0.03 s) and finds nothing more there: it is tried only when the plain
    # pass leaves many shapes unknown, as dynamic-axis exports do.
    shapes, types = _inferred_shapes(light, data_prop=False)
    n_values = sum(1 for node in model.graph.node for o in node.output if o)
    if n_values - len(shapes) > _UNKNOWN_SHAPES_RETRY * n_values:
        shapes_dp, types_dp = _inferred_shapes(light, data_prop=True)
        if len(shapes_dp) > len(shapes):
            shapes, types = shapes_dp, types_dp
    sizes = {v: math.prod(shape) * _itemsize(types[v]) for v, shape in shapes.items()}
    for name, arr in feeds.items():
        sizes[name] = arr.nbytes
    for node in model.graph.node:  # unknown: as large as the largest input of the node
        guess = max((sizes.get(v, 0) for v in node.input), default=0)
        for o in node.output:
            sizes.setdefault(o, guess)
    return sizes, shapes, types


_UNKNOWN_SHAPES_RETRY = 0.05  # fraction of values without a shape that makes `estimate_bytes` retry


def _inferred_shapes(light: Any, *, data_prop: bool) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """ONNX shape inference on `light`: (value -> concrete shape, value -> element type)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(light, data_prop=data_prop)
    except Exception:  # noqa: BLE001 - inference is an estimate: a model it cannot handle still runs
        inferred = light
    shapes: dict[str, tuple[int, ...]] = {}
    types: dict[str, int] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        t = vi.type.tensor_type
        if not t.elem_type:
            continue
        types[vi.name] = t.elem_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[vi.name] = tuple(d.dim_value for d in t.shape.dim)
    return shapes, types


@functools.lru_cache(maxsize=None)
def _itemsize(elem_type: int) -> int:
    import onnx

    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize


def default_budget() -> int:
    """A third of the memory available now (at least 256 MiB)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return max(_MIN_BUDGET, int(line.split()[1]) * 1024 // 3)
    except OSError:
        pass
    return 4 << 30


def split_segments(model: Any, plans: list[ValuePlan], sizes: dict[str, int], budget: int) -> list[tuple[int, int]]:
    """Consecutive node ranges whose selected outputs each fit in `budget` bytes."""
    per_node: dict[int, int] = {}
    for p in plans:
        per_node[p.node_index] = per_node.get(p.node_index, 0) + sizes.get(p.value, 0)
    n = len(model.graph.node)
    segments, lo, acc = [], 0, 0
    for i in range(n):
        cost = per_node.get(i, 0)
        if acc and acc + cost > budget:
            segments.append((lo, i))
            lo, acc = i, 0
        acc += cost
    segments.append((lo, n))
    return segments


class _OutputPool:
    """One pre-faulted byte buffer handed out as NumPy arrays for a segment's outputs, and reused by the
    next segment. It is sized to what the first segment needs, doubling up to `nbytes` (so a small model
    does not fault in 256 MiB), and past `nbytes` only for a segment that needs more on its own. The buffer
    comes from, and goes back to (`release`), the buffers kept between captures (`bundle.writer.PREFAULTED`):
    a second capture of a small model faults nothing in."""

    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self._buffer: np.ndarray | None = None
        self._owner: Any = None   # the torch buffer `_buffer` views, handed back by `release`

    def release(self) -> None:
        """Give the buffer back for a later capture; arrays handed out before must no longer be read."""
        if self._owner is not None:
            PREFAULTED.give(self._owner)
        self._buffer = self._owner = None

    @property
    def allocated(self) -> int:
        return 0 if self._buffer is None else self._buffer.nbytes

    def arrays(self, specs: dict[str, tuple[tuple[int, ...], np.dtype]]) -> dict[str, tuple[np.ndarray, int]]:
        """name -> (array of the given shape and dtype, its address), 64-byte aligned, valid until the next
        call. (The address is the buffer's plus the offset: `ndarray.ctypes.data` costs ~2 µs an array.)"""
        spans, end = [], 0
        for shape, dtype in specs.values():
            n = math.prod(shape) * dtype.itemsize
            spans.append(end)
            end += -(-n // 64) * 64
        if end > self.allocated or self._buffer is None:
            # a later segment that needs more: twice the old size (capped), so a slightly larger one after it
            # does not fault in a new buffer again
            grown = max(end, 64) if self._owner is None else max(end, min(self.nbytes, 2 * self.allocated))
            self.release()
            # a kept buffer up to 4x the need serves (same model, same shapes: the same size), within the cap
            self._owner = PREFAULTED.take(grown, at_most=min(max(self.nbytes, grown), 4 * grown))
            self._buffer = self._owner.numpy()
        buf, base = self._buffer, self._owner.data_ptr() if self._owner is not None else 0
        return {name: (np.ndarray(shape, dtype, buffer=buf, offset=start), base + start)
                for (name, (shape, dtype)), start in zip(specs.items(), spans)}


_STRING = 8   # TensorProto.STRING
_BINDABLE = {k: np.dtype(t) for k, t in {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32,
                                         7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64}.items()}
# (TensorProto element types NumPy holds as they are)


def run_bound(sess: Any, feeds: dict[str, np.ndarray], names: list[str], shapes: dict[str, tuple[int, ...]],
              types: dict[str, int], pool: _OutputPool) -> dict[str, np.ndarray]:
    """Run `sess`, each output of inferred shape written straight into `pool` (the others allocated by
    ORT), and return every output by name."""
    if any(a.dtype == object for a in feeds.values()) or any(types.get(v) == _STRING for v in names):
        # ORT binds no text tensors: a segment that reads or makes text runs plainly (outputs allocated by ORT)
        return dict(zip(names, sess.run(names, feeds)))
    specs = {v: (shapes[v], _BINDABLE[types[v]]) for v in names if v in shapes and types.get(v) in _BINDABLE}
    try:
        return _run_into(sess, feeds, names, pool.arrays(specs))
    except Exception:  # noqa: BLE001 - ORT refuses a buffer when shape inference was wrong: let it allocate
        if not specs:
            raise
        return _run_into(sess, feeds, names, {})


def _run_into(sess: Any, feeds: dict[str, np.ndarray], names: list[str], bufs: dict[str, tuple[np.ndarray, int]]
              ) -> dict[str, np.ndarray]:
    """Run `sess` with each output in `bufs` (name -> (array, address), from `_OutputPool.arrays`) written
    into that array and the others allocated by ORT."""
    io = sess.io_binding()
    for name, arr in feeds.items():
        io.bind_cpu_input(name, np.require(arr, requirements="C"))
    for v in names:
        if v in bufs:
            b, address = bufs[v]
            io.bind_output(v, "cpu", 0, b.dtype.type, b.shape, address)
        else:
            io.bind_output(v, "cpu")
    sess.run_with_iobinding(io)
    if all(v in bufs for v in names):   # (get_outputs wraps every output in an OrtValue: ~5 µs each)
        return {v: bufs[v][0] for v in names}
    got = io.get_outputs()
    return {v: bufs[v][0] if v in bufs else got[i].numpy() for i, v in enumerate(names)}


def _last_use(model: Any, segments: list[tuple[int, int]]) -> dict[str, int]:
    """value -> index of the last segment that reads it (graph outputs: past the end)."""
    seg_of = {}
    for k, (lo, hi) in enumerate(segments):
        for i in range(lo, hi):
            seg_of[i] = k
    last: dict[str, int] = {}
    for i, node in enumerate(model.graph.node):
        for v in node_inputs(node):
            last[v] = max(last.get(v, -1), seg_of[i])
    for o in model.graph.output:
        last[o.name] = len(segments)
    return last


def segment_model(model: Any, lo: int, hi: int, live: dict[str, np.ndarray], wanted: set[str],
                  needed_later: dict[str, int], k: int, inits: dict[str, Any] | None = None
                  ) -> tuple[Any, list[str], list[str]]:
    """Nodes [lo, hi) as a model reading the live values it needs and returning `wanted` + what later needs.
    `inits`: the initializer protos to use by name (default: the model's own)."""
    import onnx

    nodes = model.graph.node[lo:hi]
    if inits is None:
        inits = {i.name: i for i in model.graph.initializer}
    produced = {o for nd in nodes for o in nd.output if o}
    reads = list(dict.fromkeys(v for nd in nodes for v in node_inputs(nd) if v not in produced))
    seg_in = [v for v in reads if v in live]
    outs = [o for nd in nodes for o in nd.output if o and (o in wanted or needed_later.get(o, -1) > k)]
    sub = onnx.ModelProto()
    sub.ir_version = model.ir_version
    sub.opset_import.extend(model.opset_import)
    sub.functions.extend(model.functions)
    g = sub.graph
    g.name = f"segment_{k}"
    g.node.extend(nodes)
    g.initializer.extend(inits[v] for v in reads if v in inits and v not in live)
    for v in seg_in:
        arr = live[v]
        g.input.append(onnx.helper.make_tensor_value_info(v, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype),
                                                          list(arr.shape)))
    g.output.extend(onnx.helper.make_empty_tensor_value_info(o) for o in outs)
    return sub, seg_in, list(dict.fromkeys(outs))


def _one_line(e: BaseException) -> str:
    """An ORT exception as one line: its last line, without the '[ONNXRuntimeError] : 1 : FAIL :' prefix."""
    text = str(e).strip().splitlines()
    line = text[-1] if text else type(e).__name__
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", line)
