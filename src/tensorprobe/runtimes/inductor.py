"""torch.compile as a runtime: `tensorprobe compare TARGET --runtime inductor` (or `aot_eager`, or any registered
backend with `-O backend=NAME`, `-O mode=max-autotune-no-cudagraphs`, and Inductor's precision settings
`-O emulate_precision_casts=true`, `-O fallback_random=true`).

The model runs as `torch.compile` runs it, captured by `tensorprobe.compiled` (statistics or values taken inside
the compiled graph, records named as an eager capture names them); this adapter hands those records to the
runtime interface, so `compare` lines them up with the eager PyTorch capture by module name and names the first
module where the compiled model parts from eager.

    >>> from tensorprobe.runtimes import get_runtime                                    # doctest: +SKIP
    >>> bundle = get_runtime("inductor").capture(model, inputs, out="compiled")          # doctest: +SKIP
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from ..record import KIND_MODEL_INPUT, WEIGHT_KINDS
from .base import RuntimeAdapter, RuntimeTensor, Selection


@dataclass
class CompiledArtifact:
    model: torch.nn.Module
    backend: str
    mode: str | None
    compile_info: dict | None = None   # the last run's graphs, breaks and first-call time (`capture.compile`)
    inductor_config: dict | None = None   # Inductor settings (-O emulate_precision_casts=true)


class InductorAdapter(RuntimeAdapter):
    """The model compiled by `torch.compile(backend="inductor")` (the default backend)."""

    name = "inductor"
    package = "torch"
    extra = ""
    default_backend = "inductor"

    def _prepare(self, model: torch.nn.Module, inputs: tuple, workdir: Path, *, backend: str | None = None,
                 mode: str | None = None, emulate_precision_casts: bool | None = None,
                 fallback_random: bool | None = None) -> CompiledArtifact:
        """Nothing to export: the compile happens at the first run, inside the capture (compile time counts there).
        `emulate_precision_casts` (round float16/bfloat16 intermediates as eager does) and `fallback_random`
        (draw eager's random numbers) are Inductor's settings of those names."""
        config = {k: v for k, v in {"emulate_precision_casts": emulate_precision_casts,
                                    "fallback_random": fallback_random}.items() if v is not None}
        return CompiledArtifact(model, backend or self.default_backend, mode, inductor_config=config or None)

    def _run(self, artifact: CompiledArtifact, inputs: Any, selection: Selection) -> Iterator[RuntimeTensor]:
        from ..capture import capture

        with tempfile.TemporaryDirectory(prefix="tensorprobe-compiled-") as tmp:
            b = capture(artifact.model, *inputs, keep="full", compile=True, backend=artifact.backend,
                        mode=artifact.mode, inductor_config=artifact.inductor_config, out=Path(tmp) / "compiled",
                        weights=False)
            artifact.compile_info = (b.manifest.get("capture") or {}).get("compile")
            for r in sorted(b.records, key=lambda r: r.order):
                if r.kind in WEIGHT_KINDS or r.kind == KIND_MODEL_INPUT:
                    continue
                value = b.tensor(r.name).clone()   # the bundle's files go with the temporary directory
                yield RuntimeTensor(runtime_name=r.name, module=r.module, op=r.op, value=value, name=r.name,
                                    inputs=r.inputs, tags=r.tags, call=r.call, kind=r.kind)

    def _weights(self, artifact: CompiledArtifact) -> Iterator[RuntimeTensor]:
        from ..weights import named_weights

        for name, module, t, kind, tags in named_weights(artifact.model):
            yield RuntimeTensor(runtime_name=name, module=module, op=kind, value=t.detach(), name=name, kind=kind,
                                tags=tags)

    def runtime_info(self, artifact: Any = None) -> dict[str, Any]:
        info = {"name": self.name, "version": torch.__version__}
        if isinstance(artifact, CompiledArtifact):
            info.update(backend=artifact.backend, mode=artifact.mode)
            if artifact.inductor_config:
                info["inductor_config"] = artifact.inductor_config
            if artifact.compile_info:
                info["compile"] = artifact.compile_info
        return info


class AotEagerAdapter(InductorAdapter):
    """`torch.compile(backend="aot_eager")`: dynamo and AOT autograd without Inductor's code generation."""

    name = "aot_eager"
    default_backend = "aot_eager"


__all__ = ["AotEagerAdapter", "CompiledArtifact", "InductorAdapter"]
