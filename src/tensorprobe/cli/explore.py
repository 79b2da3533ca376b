"""`tensorprobe explore GRAPH --data OVERLAY.json`: open a graph in Google Model Explorer with tensorprobe's
overlays (`diff --model-explorer`, `nan --model-explorer`, `isolate --model-explorer`) loaded.

Needs the `explorer` extra (`pip install 'tensorprobe[explorer]'`, the `ai-edge-model-explorer` package); without
it the command prints one line and exits 2. An ONNX graph is converted here (`report.explorer.onnx_graph_json`:
node ids are node names, namespaces the PyTorch module paths, so the overlays meet their nodes); a `.pt2`
exported program or a `.tflite` file is read by Model Explorer's own adapters. The server runs on this machine
and makes no request outside it (Model Explorer's check for a newer release is switched off).
Exit codes: 0 after the server is stopped (Ctrl+C), 2 bad input or the extra missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..errors import InputError
from ._common import app, console

GRAPH_SUFFIXES = (".onnx", ".pt2", ".tflite", ".mlir", ".mlirbc", ".pb", ".pbtxt", ".graphdef")


def _overlay_files(data: list[Path]) -> list[Path]:
    files: list[Path] = []
    for d in data:
        if d.is_dir():
            # Model Explorer shows the overlay loaded last: the findings, when the directory holds them
            order = {"snr_db.json": 0, "local_snr_db.json": 0, "accumulated_snr_db.json": 0, "nan.json": 1,
                     "findings.json": 2, "isolate.json": 2}
            found = sorted(d.glob("*.json"), key=lambda p: (order.get(p.name, -1), p.name))
            if not found:
                raise InputError(f"{d}: no node-data .json files in this directory")
            files.extend(found)
        elif d.is_file():
            files.append(d)
        else:
            raise InputError(f"{d}: no such node-data file or directory")
    return files


def explorer_config(graph: Path, data: list[Path]):
    """A `model_explorer` config holding `graph` (converted here when it is ONNX) and the node-data files.

    Raises:
        InputError: the extra is missing, the graph or a data file is missing, or the graph's format is unknown.
    """
    try:
        import model_explorer
    except ImportError:
        raise InputError("Model Explorer is not installed: pip install 'tensorprobe[explorer]' "
                         "(the ai-edge-model-explorer package)") from None
    if not graph.is_file():
        raise InputError(f"{graph}: no such graph file")
    if graph.suffix not in GRAPH_SUFFIXES:
        raise InputError(f"{graph}: Model Explorer reads {', '.join(GRAPH_SUFFIXES)} graphs, not {graph.suffix!r}")
    files = _overlay_files(data)
    config = model_explorer.config()
    if graph.suffix == ".onnx":
        from ..report.explorer import onnx_graph_json

        try:
            graphs = onnx_graph_json(graph)
        except ImportError:
            raise InputError("reading an ONNX graph needs the onnx package: pip install 'tensorprobe[onnx]'") from None
        except Exception as e:
            raise InputError(f"{graph}: not a readable ONNX model ({type(e).__name__}: {e})") from None
        # the config's own form for converted graphs: graphs://NAME/INDEX into its graphs_list
        config.graphs_list.append(graphs)
        config.model_sources.append({"url": f"graphs://{graph.name}/{len(config.graphs_list) - 1}"})
    else:
        config.add_model_from_path(str(graph))
    for f in files:
        config.add_node_data_from_path(str(f))
    return config


@app.command("explore")
def explore_cmd(
    graph: Path = typer.Argument(..., help="The graph the candidate ran: model.onnx, an exported program .pt2, "
                                           ".tflite."),
    data: Optional[List[Path]] = typer.Option(None, "--data", "-d", metavar="NODE_DATA",
                                              help="A node-data .json file, or a directory of them (what "
                                                   "`diff --model-explorer DIR` wrote); repeatable."),
    host: str = typer.Option("localhost", "--host", help="Address the server listens on."),
    port: int = typer.Option(8080, "--port", help="Port (8080: the first free one from 8080 on)."),
    no_browser: bool = typer.Option(False, "--no-browser", help="Print the address; do not open a browser."),
) -> None:
    """Start Google Model Explorer on GRAPH with tensorprobe's overlays (SNR dB, findings, NaN) loaded."""
    config = explorer_config(graph, list(data or []))
    from model_explorer import server

    # no request leaves this machine: Model Explorer would ask PyPI and GitHub for a newer release
    server._check_new_version = lambda print_msg=True: {"version": "", "runningVersion": "", "releaseUrl": "",
                                                          "desktopAppUrl": ""}
    console.print(f"Model Explorer: {graph} with {len(config.node_data_sources)} overlay(s); Ctrl+C stops it")
    server.start(host=host, port=port, config=config, no_open_in_browser=no_browser)
