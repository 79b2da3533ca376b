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
    replayed = [TAG_REPLAYED in r.tags for r in recs]
    _table(entries, f"{len(entries)} random ops in {bundle}", replayed)
    console.print(escape(replayed_words(entries, replayed)))


def replayed_words(entries: list[NoiseEntry], replayed: list[bool]) -> str:
    """Which random ops were replayed, in a sentence: the table's column said in words, so that a reader (or a
    log) sees it without the JSON.

    >>> from tensorprobe.rng import NoiseEntry
    >>> e = [NoiseEntry(n, "aten.randn.default", (2,), "float32", i) for i, n in enumerate(["a/randn.0", "b/rand.0"])]
    >>> print(replayed_words(e, [True, False]))
    Replayed 1 of 2 random ops from a recording: a/randn.0. Drawn by this run's own generator: b/rand.0.
    """
    if not entries:
        return "No random op ran: nothing to replay."
    done = [e.name for e, r in zip(entries, replayed) if r]
    fresh = [e.name for e, r in zip(entries, replayed) if not r]
    if not done:
        return (f"None of the {len(entries)} random ops was replayed: every one drew from this run's own generator "
                "(capture --replay-rng BUNDLE replays a recording).")
    if not fresh:
        return f"All {len(entries)} random ops were replayed from a recording."
    return (f"Replayed {len(done)} of {len(entries)} random ops from a recording: {_names(done)}. "
            f"Drawn by this run's own generator: {_names(fresh)}.")


def _names(names: list[str], limit: int = 8) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _table(entries: list[NoiseEntry], title: str, replayed: list[bool] | None = None) -> None:
    table = Table(title=escape(title), title_justify="left", show_edge=False, pad_edge=False)
    cols = ("#", "name", "op", "draws", "shape", "dtype") + (("replayed",) if replayed is not None else ()) + ("source",)
    for col in cols:
        table.add_column(col, no_wrap=col != "source")
    for i, e in enumerate(entries):
        row = [str(e.order), escape(e.name), escape(e.op), escape((e.draw or "?").split(":")[0]),
               "×".join(map(str, e.shape)) or "scalar", e.dtype]
        if replayed is not None:
            row.append("yes" if replayed[i] else "no")
        table.add_row(*row, escape(e.source or ""))
    console.print(table)
