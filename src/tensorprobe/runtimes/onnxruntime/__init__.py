"""ONNX Runtime: export a PyTorch model to ONNX, expose every intermediate value, run it on CPU.

- `adapter`  `OnnxRuntimeAdapter` and one capture run (`_OrtRun`)
- `export`   `export_onnx`: torch.onnx.export with module scopes stamped on the nodes
- `names`    naming values back to PyTorch module paths (`GraphNamer`), mapping rules, weights
- `inline`   making a shipped graph capturable: topological order, If/Loop/Scan/functions, RNG seeds
- `session`  inputs, sessions, memory estimates, segments over one reused output buffer

Every intermediate value becomes a graph output ("mark all", as Polygraphy calls it) or, with
`include=REGEX`, a chosen subset. Values are named back to the PyTorch module path they come from
(see `names.py`), so a capture lines up with `tensorprobe.capture(model, ..., level="module")`:

    >>> from tensorprobe.runtimes import get_runtime
    >>> ort = get_runtime("onnxruntime")
    >>> b = ort.capture(model, inputs, out="ort_bundle")                              # doctest: +SKIP
    >>> b["generator.noise_res.0.adain1.0.norm"].runtime_name                          # doctest: +SKIP
    'instance_norm_25'
    >>> b = ort.capture_artifact("model_int8.onnx", {"asr": asr, ...}, out="int8")     # doctest: +SKIP

Memory: all outputs of a 10 s Kokoro decoder run take ~8 GB. The graph is cut into consecutive segments,
each run as its own session on the values the previous ones produced (every node still runs once), whose
outputs ORT writes into one reused buffer of min(`max_bytes`, 256 MiB); records are yielded one at a time,
each borrowed from that buffer until the next segment runs (see `adapter._OrtRun._run_full`).

What one capture leaves to the next capture of the same file (a sweep's items, a rerun): the plan, the
output buffer and, for a file of at most 32 MiB of weights and no random op, its sessions (at most four;
for runs whose values take at most 64 MiB: a session keeps its arena, which grows to the run's scratch).
`forget_kept()` lets all of it go but the buffers, `tensorprobe.bundle.writer.release_buffers()` the buffers.
"""

from __future__ import annotations

from .adapter import OnnxArtifact, OnnxRuntimeAdapter, forget_kept
from .export import EXPORTERS, export_onnx, tuple_output_shapes
from .session import (SharedInitializers, default_budget, estimate_bytes, graph_feeds, load_inputs, make_session,
                      segment_model, split_segments, with_outputs)

__all__ = ["EXPORTERS", "OnnxArtifact", "OnnxRuntimeAdapter", "SharedInitializers", "default_budget",
           "estimate_bytes", "export_onnx", "forget_kept", "graph_feeds", "load_inputs", "make_session",
           "segment_model", "split_segments", "tuple_output_shapes", "with_outputs"]
