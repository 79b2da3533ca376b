"""Local vs accumulated error: is this layer wrong, or is it inheriting error?

For each module call, `isolate` runs the CANDIDATE's version of that module on the REFERENCE's inputs
for that call and compares with the reference output: that is the layer's *local* error, free of
everything upstream. Side by side, the *accumulated* error compares the two models' own runs (what
`diff` sees). The first layer whose local error alone fails the criteria is where the port goes wrong;
layers that fail only when accumulated are inheriting error.

    >>> from tensorprobe.isolate import isolate
    >>> from tensorprobe.examples import kokoro
    >>> ref, cand = kokoro.build_decoder(), kokoro.build_decoder()                # doctest: +SKIP
    >>> conv = dict(cand.named_modules())["decode.1.conv1x1"]                     # doctest: +SKIP
    >>> _ = conv.register_forward_hook(lambda m, a, out: out * (1 + 1e-3))        # doctest: +SKIP
    >>> report = isolate(ref, cand, *kokoro.decoder_inputs(0.25), min_snr=80)     # doctest: +SKIP
    >>> print(report.summary())                                                   # doctest: +SKIP
    Local error first exceeds the criteria at decode.1.conv1x1 (Conv1d: SNR 60.0 dB < 80 dB); 23 layer(s) fail only by inheritance.

Two passes (details in `isolate/passes.py`): the candidate's own forward, keeping each module call's
inputs and outputs (accumulated error); then the reference forward with hooks that clone each call's
inputs and, when the call returns, hand them to a `ModuleRunner` that runs the candidate's module of the
same path on them (cast to that module's parameter dtype and device). A candidate call that already saw
exactly those inputs is not run again. Outputs are compared in float64 with diff's metrics and criteria
(`tensorprobe.diff`). Random ops are replayed: the candidate's module sees the noise the reference drew
in the same call (generator state, or recorded tensors via `tensorprobe.rng`), so stochastic layers
(Kokoro's sine source) compare too.

Runtime adapters plug in through `ModuleRunner`: anything with `has(module_path)` and
`run(module_path, call, inputs)` can be the candidate. `TorchRunner` covers PyTorch (another dtype, a
patched, quantized or rewritten module; `transform=torch.compile` compiles each module it runs). An ONNX
or ExecuTorch adapter would export each reference module (or cut the candidate's graph at the module's
boundary tensors, as `runtimes/onnxruntime/names.py` names them), and in `run` convert `inputs.args` to NumPy,
run that sub-graph and return its outputs as tensors; its accumulated error then comes from a bundle the
adapter captured (`accumulated=BUNDLE`).
"""

from __future__ import annotations

from typing import Any

from .report import INHERITED, LOCAL, OK, UNKNOWN, IsolateReport, LayerError, local_snr_from_json

# The runners and `isolate` itself need torch: imported on first use (reading a report does not).
_CORE = ("isolate", "ModuleCall", "ModuleRunner", "TorchRunner", "select_modules", "compare_tensors", "CONTAINERS")


def __getattr__(name: str) -> Any:
    if name in _CORE:
        from . import core

        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


from .._api import make_callable  # noqa: E402

make_callable(__name__, "tensorprobe.isolate.core:isolate")  # `tp.isolate(...)`; `tensorprobe.isolate.passes` imports

__all__ = ["isolate", "IsolateReport", "LayerError", "ModuleCall", "ModuleRunner", "TorchRunner",
           "select_modules", "compare_tensors", "local_snr_from_json", "LOCAL", "INHERITED", "OK", "UNKNOWN"]
