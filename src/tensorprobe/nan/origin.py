"""What a NaN search finds: `NanOrigin` (where non-finite values are born, with evidence and a diagnosis)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..record import OP_UNKNOWN, dtype_name, module_place, op_place
from ..stats import TensorStats, compute_stats
from .masks import Mask

CAUSE_OP = "op"
CAUSE_MODEL_INPUT = "model_input"
CAUSE_PARAMETER = "parameter"
CAUSE_UNTRACKED = "untracked_input"
CAUSE_RECORD = "record"
CAUSE_UNRECORDED = "unrecorded_value"   # born in a value the bundle does not hold (a kernel not tapped)
CAUSE_MASK_OUTPUT = "mask_reaches_output"   # ±Inf a constant wrote on purpose (a mask) is still in a model output
# The module path the backward search names the loss function's ops under (`loss/log.0`; `<loss>/log.0` for a
# model that has a submodule named `loss`). The model's own root module is "" and is never "the loss":
# `NanOrigin.in_loss` says whether a finding ran inside loss_fn.
LOSS_MODULE = "loss"
LOSS_MODULE_ALT = "<loss>"


@dataclass(frozen=True)
class TensorSummary:
    """Name, shape, dtype and statistics of one tensor in a finding."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    stats: TensorStats

    @classmethod
    def of(cls, name: str, t: Any) -> "TensorSummary":
        """Summary of a torch tensor or NumPy array."""
        return cls(name, tuple(t.shape), dtype_name(t.dtype), compute_stats(t))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "stats": self.stats.to_dict()}


@dataclass(frozen=True)
class Spread:
    """How far the damage reached: one module output after the origin."""

    module: str
    finite_frac: float
    pattern: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "finite_frac": self.finite_frac, "pattern": self.pattern}


@dataclass(frozen=True)
class NanOrigin:
    """Where non-finite values first appear, with evidence and a diagnosis. `found` is False for a clean run."""

    found: bool
    cause: str | None = None
    record: str | None = None
    op: str | None = None
    module: str | None = None
    module_type: str | None = None
    source: str | None = None
    op_index: int | None = None
    inputs: tuple[TensorSummary, ...] = ()
    output: TensorSummary | None = None
    diagnosis: tuple[str, ...] = ()
    spread: tuple[Spread, ...] = ()
    ops_checked: int = 0
    note: str | None = None
    incomplete: str | None = None      # a bundle whose capture stopped early: where, and why (nothing found)
    direction: str = "forward"         # "backward": a gradient born non-finite (`find_first_nonfinite_backward`)
    backward_op: str | None = None     # the autograd node that made it (SqrtBackward0)
    elements: str | None = None        # where the non-finite values are: batch rows, channels, frames
    reaches: tuple[str, ...] = ()      # parameters whose gradient ends non-finite
    masked: bool = False               # the incoming gradient was 0 there: a value selected away downstream
    # A module-level record whose input no record made: the NaN may have been born in this module's parent's
    # own code before the call (`<root> (Model)`); None when the bundle shows it was born in the module.
    or_born_in: str | None = None
    # ±Inf written on purpose by constants (`nan.masks`), met before the finding or in a clean run: not findings
    # while no model output holds them and no op turns them into NaN
    masks: tuple[Mask, ...] = ()
    in_loss: bool = False              # the op ran inside loss_fn (backward search), not in the model

    def place(self) -> str:
        """Where the op ran, in words: 'the loss (spectral_loss)', 'the model's own forward (Vocoder.forward,
        model.py:12)' for an op of the top-level module's own code, or the module's path."""
        if self.in_loss:
            named = self.module_type not in (None, "", LOSS_MODULE, LOSS_MODULE_ALT, "<lambda>")
            return f"the loss ({self.module_type})" if named else "the loss"
        if self.module is None:
            return "an op no watched forward made" if self.direction == "backward" else module_place("")
        if self.op and not self.op.startswith("module:") and self.op != OP_UNKNOWN:
            return op_place(self.module, self.module_type, self.source)
        return module_place(self.module, self.module_type)

    def headline(self) -> str:
        if not self.found and self.incomplete:
            return (f"No NaN or Inf in the {self.ops_checked} records captured, but {self.incomplete}: what ran "
                    "after it was not checked.")
        if not self.found and self.direction == "backward":
            return (f"No NaN or Inf in the backward pass: forward, loss and the gradients of all "
                    f"{self.ops_checked} backward ops are finite.")
        if not self.found and self.masks:
            n = len(self.masks)
            return (f"No NaN or Inf born: every model output is finite, and the only ±Inf {'is' if n == 1 else 'are'} "
                    f"{n} deliberate mask{'s' if n > 1 else ''} (±Inf written by a constant), consumed before any "
                    "output.")
        if not self.found:
            return f"No NaN or Inf: all {self.ops_checked} op outputs are finite."
        if self.direction == "backward":
            where = self.place()
            lands = (f"reaches {len(self.reaches)} parameter gradients" if self.reaches
                     else "masked before any parameter")
            return (f"NaN/Inf gradient born in the backward pass at {self.backward_op}, the gradient of {self.op} "
                    f"in {where} ({self.record}); forward and loss finite; {lands}")
        if self.cause == CAUSE_MODEL_INPUT:
            return f"The model inputs are already non-finite ({self.record}): nothing inside the model is to blame."
        if self.cause == CAUSE_PARAMETER:
            return f"Parameter {self.record} is non-finite: the weights were broken before the forward ran."
        where = self.place()
        if self.cause == CAUSE_MASK_OUTPUT:
            out = self.output.name if self.output else "a model output"
            m = next((m for m in self.masks if m.record == self.record), None)
            what = (f"The {m.value} constant {m.record} ({m.op})" if m is not None and m.constant == m.record
                    else f"A deliberate {m.value if m else '±inf'} mask written by {self.op} in {where} ({self.record})")
            return f"{what} reaches the model output {out}: nothing after it consumes the ±Inf"
        pattern = self.output.stats.channel_pattern() if self.output else None
        tail = f" — {pattern}" if pattern else ""
        if self.cause == CAUSE_UNRECORDED and self.op is None:
            code = op_place("", self.module_type) if not self.module else f"{where}'s own code"
            return f"NaN/Inf born in {code}, before it called {self.record.split(':')[0]}{tail}"
        if self.cause == CAUSE_UNRECORDED:
            return f"NaN/Inf born inside {where} (its kernel's output is not in the bundle; its module output holds it){tail}"
        if self.op and self.op.startswith("module:") and self.or_born_in:
            return (f"NaN/Inf first seen in the output of {where}: born inside it, or in the code of "
                    f"{self.or_born_in} that made its input{tail}")
        if self.op and self.op.startswith("module:"):
            return f"NaN/Inf born in {where}, first seen in its module output (its ops are not recorded){tail}"
        if self.op == OP_UNKNOWN:   # a plain tensor file: its names are all we know, no op, no module
            return (f"NaN/Inf first appears in {self.record}, the first tensor holding it in the file's order (the file "
                    f"records no op){tail}")
        return f"NaN/Inf born at {self.op} in {where}{tail}"

    def summary(self) -> str:
        lines = [self.headline()]
        if self.source:
            lines.append(f"  source: {self.source}")
        if self.elements:
            lines.append(f"  elements: {self.elements}")
        lines += [f"  - {d}" for d in self.diagnosis]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "found": self.found, "cause": self.cause, "record": self.record, "op": self.op,
            "module": self.module, "module_type": self.module_type, "source": self.source,
            "op_index": self.op_index, "inputs": [i.to_dict() for i in self.inputs],
            "output": self.output.to_dict() if self.output else None, "diagnosis": list(self.diagnosis),
            "spread": [s.to_dict() for s in self.spread], "ops_checked": self.ops_checked,
            "headline": self.headline(), "note": self.note, "incomplete": self.incomplete,
            "direction": self.direction, "backward_op": self.backward_op, "elements": self.elements,
            "reaches": list(self.reaches), "masked": self.masked, "or_born_in": self.or_born_in,
            "masks": [m.to_dict() for m in self.masks], "in_loss": self.in_loss,
        }
