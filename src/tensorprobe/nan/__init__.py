"""Find the op where NaN or Inf is born: in a live torch forward, or in any bundle.

- `live`       `find_first_nonfinite(model, *inputs)`: a dispatch mode over one forward (torch)
- `in_bundle`  `find_nonfinite_in_bundle(path)`: the first record born non-finite (NumPy only);
               `diagnose_record(bundle, name)`: the finding for a record the caller already knows
- `computation` `OpNode`: how a value was computed, as recorded (the evidence a diagnosis may cite)
- `diagnose`   the plain-words rules, one function each, in `RULES`
- `masks`      deliberate ±Inf (`Mask`): what a constant writes on purpose (`masked_fill(m, -inf)`, an ONNX `Pad`
               with a -inf initializer) is no finding until it reaches a model output or an op makes NaN of it
- `origin`     `NanOrigin`, the finding

`find_first_nonfinite` runs the forward once under a `TorchDispatchMode` that checks every op output
(a sum per output: finite sum ⇒ all finite; only a non-finite sum pays for an exact check). The first
op whose output holds a non-finite value while its inputs were finite is the origin. The forward then
goes on just long enough to show how the damage spreads (module outputs, until one is entirely
non-finite), and stops.

    >>> from tensorprobe.examples.kokoro import faulty_decoder      # doctest: +SKIP
    >>> origin = find_first_nonfinite(*faulty_decoder())            # doctest: +SKIP
    >>> origin.module, origin.op                                    # doctest: +SKIP
    ('generator.noise_res.0.adain1.0.norm', 'aten.rsqrt.default')
    >>> origin.output.channel_pattern()                             # doctest: +SKIP
    '38 of 256 channels entirely non-finite (channels 5, 10, 23, ...)'
"""

from __future__ import annotations

from typing import Any

from .in_bundle import diagnose_record, find_nonfinite_in_bundle
from .masks import Mask
from .origin import (CAUSE_MASK_OUTPUT, CAUSE_MODEL_INPUT, CAUSE_OP, CAUSE_PARAMETER, CAUSE_RECORD, CAUSE_UNRECORDED,
                     CAUSE_UNTRACKED, NanOrigin, Spread, TensorSummary)


def __getattr__(name: str) -> Any:
    if name == "find_first_nonfinite":   # needs torch: imported on first use
        from .live import find_first_nonfinite

        return find_first_nonfinite
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CAUSE_MASK_OUTPUT", "CAUSE_MODEL_INPUT", "CAUSE_OP", "CAUSE_PARAMETER", "CAUSE_RECORD", "CAUSE_UNRECORDED",
           "CAUSE_UNTRACKED", "Mask", "NanOrigin", "Spread", "TensorSummary", "diagnose_record", "find_first_nonfinite",
           "find_nonfinite_in_bundle"]
