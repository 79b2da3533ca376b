"""`tensorprobe rng export BUNDLE -o noise.safetensors` and `tensorprobe rng show BUNDLE`.

Replaying a recording into a PyTorch run is `tensorprobe capture TARGET --replay-rng BUNDLE`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import InputError, TensorprobeError
from ._common import JsonOption, app, console, emit_json, fail

if TYPE_CHECKING:
    from ..rng import NoiseEntry

rng_app = typer.Typer(help="Recorded randomness: list it, export it for a port in another language.",
                      no_args_is_help=True)
app.add_typer(rng_app, name="rng")


@rng_app.command("export")
def export_cmd(
    bundle: Path = typer.Argument(..., help="A captured bundle (random outputs are always stored)."),
    out: Path = typer.Option(..., "-o", "--out", help="The .safetensors file to write."),
    json_out: bool = JsonOption,
) -> None:
    """Write every recorded random tensor, named by call site and order, to one .safetensors file
    (metadata: op, shape, dtype, source line) for a Swift/MLX/C++ port to load instead of its own RNG."""
    from ..rng import export_noise

    try:
        if out.suffix != ".safetensors":
            raise InputError(f"{out}: the noise file must end in .safetensors")
        entries = export_noise(bundle, out)
    except TensorprobeError as e:
        fail(str(e))
    if json_out:
        emit_json("rng export", "ok", {"bundle": str(bundle), "out": str(out),
                                       "entries": [e.to_dict() for e in entries]})
        return
    _table(entries, f"{len(entries)} random tensors written to {out}")


@rng_app.command("show")
def show_cmd(
    bundle: Path = typer.Argument(..., help="A captured bundle."),
    json_out: bool = JsonOption,
) -> None:
    """List the random ops a capture recorded, in call order (and whether they were replayed)."""
    from ..bundle import Bundle
    from ..record import KIND_RNG, TAG_REPLAYED
    from ..rng import NoiseEntry

    try:
        b = Bundle.open(bundle)
    except TensorprobeError as e:
        fail(str(e))
    recs = [r for r in b if r.kind == KIND_RNG]
    entries = [NoiseEntry.from_record(r, i) for i, r in enumerate(recs)]
    if json_out:
        emit_json("rng show", "ok", {"bundle": str(bundle), "entries": [
            {**e.to_dict(), "replayed": TAG_REPLAYED in r.tags} for e, r in zip(entries, recs)]})
        return
    replayed = sum(TAG_REPLAYED in r.tags for r in recs)
    _table(entries, f"{len(entries)} random ops in {bundle}" + (f", {replayed} replayed" if replayed else ""))


def _table(entries: list[NoiseEntry], title: str) -> None:
    table = Table(title=escape(title), title_justify="left", show_edge=False, pad_edge=False)
    for col in ("#", "name", "op", "draws", "shape", "dtype", "source"):
        table.add_column(col, no_wrap=col != "source")
    for e in entries:
        table.add_row(str(e.order), escape(e.name), escape(e.op), escape((e.draw or "?").split(":")[0]),
                      "×".join(map(str, e.shape)) or "scalar", e.dtype, escape(e.source or ""))
    console.print(table)
