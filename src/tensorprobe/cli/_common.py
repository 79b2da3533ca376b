"""Shared CLI plumbing: the Typer app, error handling, JSON output and progress display."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import Any, Iterator

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import EXIT_BAD_INPUT, InputError, TensorprobeError
from ..logs import quiet_third_party

app = typer.Typer(
    name="tensorprobe",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Piped output (CI logs, `| less`) gets a wide fixed width instead of rich's 80 columns, so tables stay tables.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, soft_wrap=True)  # one error = one line, whatever the width

JSON_SCHEMA_VERSION = 1

JsonOption = typer.Option(False, "--json", help="Print one JSON object (schema: docs/json.md) instead of tables.")


def emit_json(command: str, status: str, payload: dict[str, Any]) -> None:
    """Print the one JSON document every `--json` command produces (see docs/json.md)."""
    doc = {"tensorprobe": JSON_SCHEMA_VERSION, "command": command, "status": status, **payload}
    sys.stdout.write(json.dumps(doc, indent=2, default=_json_default, allow_nan=False) + "\n")


def _json_default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    """Print one red line and exit (no traceback)."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


@contextmanager
def progress(description: str, enabled: bool = True) -> Iterator[Any]:
    """A live spinner with a counter on a terminal; a no-op when piped or with --json.

    Yields a callable `advance(n=1, text=None)`.
    """
    if not enabled or not err_console.is_terminal:
        yield lambda n=1, text=None: None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TextColumn("{task.completed} records"),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task(description, total=None)

        def advance(n: int = 1, text: str | None = None) -> None:
            bar.update(task, advance=n, description=text or description)

        yield advance


VERBOSE_FLAGS = ("--verbose", "-v")


@app.callback()
def _global_options(
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="Show warnings and log lines of the runtimes and libraries tensorprobe uses."),
) -> None:
    """Numerical forensics for neural audio models: capture intermediates, find where NaN is born,
    diff a port against its reference, check audio."""


def run_app(argv: list[str] | None = None) -> None:
    """Run the Typer app, turning library errors into one line and exit code 2.

    `--verbose`/`-v` may stand anywhere on the command line; without it third-party noise is silenced.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = any(a in VERBOSE_FLAGS for a in args)
    args = [a for a in args if a not in VERBOSE_FLAGS]
    if not verbose:
        quiet_third_party()
    try:
        app(args=args, prog_name="tensorprobe")
    except TensorprobeError as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]")
        sys.exit(130)


def load_input_arrays(path: Any) -> dict[str, Any]:
    """`--inputs`: named arrays, in the file's order, from an `.npz` (fixed-width text arrays included, for
    models that take strings; object arrays refused: never unpickled) or `.safetensors`, or a bundle
    directory's records."""
    from pathlib import Path

    from ..bundle import Bundle
    from ..bundle.reader import load_arrays

    if Path(path).is_dir():
        feeds = Bundle.open(path)
        return {r.name: feeds.numpy(r.name) for r in feeds}
    return load_arrays(path)


def parse_options(pairs: list[str]) -> dict[str, object]:
    """`["kernels=true", "threads=2"]` -> `{"kernels": True, "threads": 2}` (bool, int, float, else text)."""
    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"runtime option {pair!r} must look like KEY=VALUE")
        value: object = text
        if text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            for cast in (int, float):
                try:
                    value = cast(text)
                    break
                except ValueError:
                    pass
        options[key.strip().replace("-", "_")] = value
    return options


def with_options(fn, runtime: str):
    """Turn an unknown keyword option into one clear error naming the runtime."""
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            if "unexpected keyword argument" in str(e):
                raise InputError(f"runtime {runtime!r} does not take that option ({e})") from None
            raise
    return call
