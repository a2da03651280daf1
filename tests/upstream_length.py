"""The licensed variable-length reference loops (DAEDAL and rho-EOS), imported from a local copy.

dlmsearch's ``daedal`` and ``rho_eos`` decoders must decode what these loops decode; the parity
tests (``tests/test_length_parity.py``) run them beside dlmsearch on the same weights. A test
helper, not part of the package: the tests import it as ``upstream_length`` (pytest puts ``tests/``
on ``sys.path``). The code is never copied: the two modules are executed from
``$DLMSEARCH_UPSTREAM_ROOT`` (default ``../shared/upstream`` beside the checkout) under private
module names:

* ``daedal/models/LLaDA_DAEDAL.py`` (Li-Jinsong/DAEDAL, Apache-2.0), as
  ``dlmsearch_upstream_daedal``;
* ``rho-eos/models/LLaDA_rho_EOS.py`` (yjyddq/rho-EOS, Apache-2.0), as
  ``dlmsearch_upstream_rho_eos``.

Both modules define a module-level ``generate(model, prompt, tokenizer, initial_gen_length, ...)``
(batch of left-aligned prompts of one length; returns one 1-D tensor per row, prompt plus that
row's own generation length). Their tops also import the evaluation harness around the loop
(``accelerate``, ``datasets``, ``dllm_eval.*``), which the loop itself never uses: while a module
is imported, stand-in modules for those names are put into ``sys.modules`` (empty classes and
pass-through decorators, enough for the module's class definitions to execute) and the previous
entries are restored afterwards, so nothing else in the session sees them.

What this module provides:

* :func:`length_upstream_missing_reason`: None when the reference can run here, else why not.
* :class:`CountingModel`: wraps a model, counts its forward calls and records each call's input
  length; the loops are always run through one (pass your own to read its counters).
* :func:`daedal_generate`, :func:`rho_eos_generate`: one prompt (1-D) through the reference loop;
  the generated part (everything after the prompt, the sample's own final length).
* :func:`daedal_run`, :func:`rho_eos_run`: the same, returning a :class:`LengthRun` (tokens,
  model calls, the input length of every call, and the loop's own progress messages, each with
  the number of calls made when it was printed) from which the tests read what a run exercised.

Running the loops here (the shims, all applied to the privately loaded copies or around the call;
nothing in ``../shared`` is edited):

* ``generate`` runs under ``torch.autocast(device_type="cuda")``. On a machine without CUDA that
  only warns (silenced here). :class:`CountingModel` runs its inner model under
  ``torch.autocast("cuda", enabled=False)`` so that, on a CUDA machine too, the forward runs in the
  model's own dtype (the parity tests compare float32 on both sides).
* The loops print their progress (``print``); the output is captured, not shown, and kept in
  :attr:`LengthRun.log`.
* ``tokenizer`` is unused by both loops (``None`` is passed); temperature 0 and cfg 0 are the
  defaults here (the parity settings), any other reference keyword may be given.
* rho-EOS: see :func:`rho_eos_run` for its two density rules (as released, and the paper's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import io
import itertools
import os
import re
import sys
import threading
import types
import warnings
from pathlib import Path

import torch
from upstream import _load_file

UPSTREAM_ROOT: Path = Path(
    os.environ.get("DLMSEARCH_UPSTREAM_ROOT") or Path(__file__).resolve().parents[2] / "shared" / "upstream"
)
DAEDAL_FILE = UPSTREAM_ROOT / "daedal" / "models" / "LLaDA_DAEDAL.py"
RHO_EOS_FILE = UPSTREAM_ROOT / "rho-eos" / "models" / "LLaDA_rho_EOS.py"

_DAEDAL_MODULE = "dlmsearch_upstream_daedal"
_RHO_EOS_MODULE = "dlmsearch_upstream_rho_eos"
_REQUIRED_PACKAGES = ("transformers", "packaging", "tqdm")  # imported by the modules' tops for real

DENSITIES = ("tail_confidence", "masked_fraction")
"""rho-EOS density rules: as released (``tail_confidence``), the paper's (``masked_fraction``)."""

_TRANSFORMERS_NAMES = ("PreTrainedModel", "PreTrainedTokenizer", "PreTrainedTokenizerFast", "PretrainedConfig")
"""The ``transformers`` attributes the modules' class definitions read when they are executed."""

_lock = threading.RLock()


def length_upstream_missing_reason() -> str | None:
    """Why the DAEDAL / rho-EOS reference loops cannot be used here, or None when they can."""
    for path in (DAEDAL_FILE, RHO_EOS_FILE):
        if not path.is_file():
            return (
                f"variable-length reference code not found at {path} (set DLMSEARCH_UPSTREAM_ROOT to a folder "
                "holding daedal/models/LLaDA_DAEDAL.py and rho-eos/models/LLaDA_rho_EOS.py; CI has ../shared/upstream)"
            )
    absent = [name for name in _REQUIRED_PACKAGES if importlib.util.find_spec(name) is None]
    if absent:
        return f"the variable-length reference code needs {', '.join(absent)} (pip install {' '.join(absent)})"
    return None


# ---------------------------------------------------------------------------------------------
# Loading the modules under private names, with stand-ins for their evaluation-harness imports
# ---------------------------------------------------------------------------------------------


class _StandIn:
    """Any class the module tops import from the evaluation harness (subclassed, annotated with)."""


def _register_model(*names):
    """``dllm_eval.api.registry.register_model``: returns the class unchanged."""
    return lambda cls: cls


def _stand_in_modules() -> dict[str, types.ModuleType]:
    """Stand-ins for exactly the names the two module tops import and the loops never use."""
    contents = {
        "accelerate": {"Accelerator": _StandIn, "InitProcessGroupKwargs": _StandIn},
        "accelerate.utils": {"get_max_memory": lambda *args, **kwargs: {}},
        "datasets": {"Dataset": _StandIn},
        "dllm_eval": {},
        "dllm_eval.api": {},
        "dllm_eval.api.instance": {"Instance": _StandIn},
        "dllm_eval.api.model": {"LM": _StandIn, "TemplateLM": _StandIn},
        "dllm_eval.api.registry": {"register_model": _register_model},
        "dllm_eval.models": {},
        "dllm_eval.models.utils": {
            "get_dtype": lambda dtype: dtype,
            "configure_pad_token": lambda tokenizer: tokenizer,
        },
        "dllm_eval.models.modeling_llada": {"LLaDAModelLM": _StandIn},
    }
    modules = {}
    for name, attributes in contents.items():
        module = types.ModuleType(name, "stand-in (tests/upstream_length.py): the reference loop does not use it")
        module.__dict__.update(attributes)
        modules[name] = module
    for name, module in modules.items():  # ``import a.b`` also reads ``a.b`` as an attribute of ``a``
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(modules[parent], leaf, module)
            modules[parent].__path__ = []
    return modules


@contextlib.contextmanager
def _stand_ins_installed():
    """The stand-in modules in ``sys.modules`` for the duration of the block, the previous entries after."""
    stand_ins = _stand_in_modules()
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous


def _load_module(name: str, path: Path) -> types.ModuleType:
    reason = length_upstream_missing_reason()
    if reason is not None:
        raise RuntimeError(reason)
    with _lock:
        if name in sys.modules:
            return sys.modules[name]
        # The real packages the module tops import, imported first: transformers probes for
        # ``accelerate`` / ``datasets`` when it is first imported, which must not see the stand-ins.
        for real in ("transformers", "transformers.models.auto.modeling_auto", "packaging.version", "tqdm"):
            importlib.import_module(real)
        transformers = sys.modules["transformers"]
        for lazy in _TRANSFORMERS_NAMES:  # resolved now (lazily imported submodules), not under the stand-ins
            getattr(transformers, lazy)
        with _stand_ins_installed(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _load_file(name, path)  # the one loader of a reference file under a private name


@functools.cache
def daedal_module() -> types.ModuleType:
    """DAEDAL's ``models/LLaDA_DAEDAL.py``, loaded once under a private name."""
    return _load_module(_DAEDAL_MODULE, DAEDAL_FILE)


@functools.cache
def rho_eos_module() -> types.ModuleType:
    """rho-EOS's ``models/LLaDA_rho_EOS.py``, loaded once under a private name."""
    return _load_module(_RHO_EOS_MODULE, RHO_EOS_FILE)


# ---------------------------------------------------------------------------------------------
# Counting model calls
# ---------------------------------------------------------------------------------------------


class CountingModel(torch.nn.Module):
    """A model wrapper that counts forward calls: ``calls`` (int) and ``lengths`` (each call's
    input length, ``input_ids.shape[1]``). ``forward`` returns the inner model's own output (the
    loops read ``.logits`` off it), computed under ``torch.autocast("cuda", enabled=False)``."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0
        self.lengths: list[int] = []

    @property
    def device(self) -> torch.device:
        return next(self.inner.parameters()).device

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        self.calls += 1
        self.lengths.append(int(input_ids.shape[1]))
        with torch.autocast("cuda", enabled=False):
            return self.inner(input_ids, attention_mask=attention_mask, **kwargs)


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class LengthRun:
    """One prompt through a reference loop.

    ``tokens``: the generated part (1-D long, CPU, the final length). ``calls``: model forward
    calls of this run. ``lengths``: the generation length (input length less the prompt) of each
    call, in order. ``log``: the loop's printed lines, each as (calls made when printed, line).
    """

    prompt_length: int
    tokens: torch.Tensor
    calls: int
    lengths: list[int]
    log: list[tuple[int, str]]

    # DAEDAL -----------------------------------------------------------------------------------

    @property
    def stage1_calls(self) -> int:
        """DAEDAL: calls made in its first stage (initial length adjustment), all on masks only."""
        return next(calls for calls, line in self.log if line.startswith("[Stage-2]"))

    @property
    def stage1_length(self) -> int:
        """DAEDAL: the generation length the first stage settled on (its last call's length)."""
        return self.lengths[self.stage1_calls - 1]

    @property
    def stage2_lengths(self) -> list[int]:
        """DAEDAL: the generation length of each second-stage call."""
        return self.lengths[self.stage1_calls :]

    @property
    def insertions(self) -> list[int]:
        """DAEDAL: the growth of each mask insertion in the second stage, in order (the only
        length change there; ``expansion_factor - 1`` unless cut at ``max_gen_length``)."""
        lengths = self.stage2_lengths
        growth = [b - a for a, b in itertools.pairwise(lengths)]
        assert all(g >= 0 for g in growth), f"DAEDAL's second stage never shortens: {lengths}"
        return [g for g in growth if g > 0]

    # rho-EOS ----------------------------------------------------------------------------------

    @property
    def adjustments(self) -> list[tuple[float, int, int, int]]:
        """rho-EOS: one (density, action, generation length before, after) per step, from its
        ``[Step k]`` line (action 0 keep, 1 contract, 2 expand; density rounded to 4 places)."""
        rows = []
        for _, line in self.log:
            match = re.match(r"\[Step (\d+)\] density=\[(.*)\] action=\[(.*)\] gen=\[(.*)\] -> \[(.*)\]", line)
            if match:
                rows.append((float(match[2]), int(match[3]), int(match[4]), int(match[5])))
        return rows

    # both ---------------------------------------------------------------------------------------

    def printed(self, text: str) -> bool:
        """Whether the loop printed a line containing ``text`` (e.g. ``"denoise-only"``, ``"stagnant"``)."""
        return any(text in line for _, line in self.log)


class _Lines(io.TextIOBase):
    """A stdout stand-in keeping each printed line with the model's call count at that moment."""

    def __init__(self, model: CountingModel, start: int) -> None:
        self.model, self.start, self.lines, self._partial = model, start, [], ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._partial += text
        *done, self._partial = self._partial.split("\n")
        self.lines.extend((self.model.calls - self.start, line) for line in done)
        return len(text)


_DEFAULTS = {"temperature": 0.0, "cfg_scale": 0.0}


def _run(generate, model: torch.nn.Module, prompt: torch.Tensor, settings: dict) -> LengthRun:
    if prompt.dim() != 1:
        raise ValueError(f"prompt must be 1-D (one prompt), got shape {tuple(prompt.shape)}")
    counting = model if isinstance(model, CountingModel) else CountingModel(model)
    start, first = counting.calls, len(counting.lengths)
    row = prompt.to(device=counting.device, dtype=torch.long)[None]
    out = _Lines(counting, start)
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # autocast(device_type="cuda") without CUDA
        outputs = generate(counting, row, None, **{**_DEFAULTS, **settings})
    assert len(outputs) == 1
    n = row.shape[1]
    return LengthRun(
        prompt_length=n,
        tokens=outputs[0][n:].cpu(),
        calls=counting.calls - start,
        lengths=[length - n for length in counting.lengths[first:]],
        log=out.lines,
    )


def daedal_run(model: torch.nn.Module, prompt: torch.Tensor, **settings) -> LengthRun:
    """DAEDAL's ``generate`` on one prompt (1-D). ``settings``: its keywords
    (``initial_gen_length``, ``max_gen_length``, ``block_length``, ``high_conf_threshold``,
    ``low_conf_threshold``, ``expansion_factor``, ``mask_id``, ``eos_token_id``,
    ``eos_confidence_threshold``, ``expand_eos_confidence_threshold``, ``eos_check_tokens``;
    temperature and cfg_scale default to 0)."""
    with _lock:
        return _run(daedal_module().generate, model, prompt, settings)


def daedal_generate(model: torch.nn.Module, prompt: torch.Tensor, **settings) -> torch.Tensor:
    """DAEDAL's ``generate`` on one prompt: the generated part (see :func:`daedal_run`)."""
    return daedal_run(model, prompt, **settings).tokens


def _masked_fraction(logits: torch.Tensor, total_lengths, prompt_length, eos_token_id, eos_check_tokens):
    """Stands in for rho-EOS's ``_calculate_eos_confidence`` during a ``density="masked_fraction"``
    run (see :func:`rho_eos_run`): the paper's density, by the module's own ``_calculate_eos_density``."""
    caller = sys._getframe(1)
    module = rho_eos_module()
    if caller.f_code is not module.generate.__wrapped__.__code__:
        raise AssertionError(f"_calculate_eos_confidence called from {caller.f_code.co_name}, not rho-EOS's generate")
    # the canvas the step's forward read: its masked positions are the paper's "remaining MASK at step t"
    x, mask_id = caller.f_locals["x_before_step"], caller.f_locals["mask_id"]
    assert x.shape == logits.shape[:2], "the canvas and the logits must be of the same step"
    inside = torch.arange(x.shape[1], device=x.device)[None] < total_lengths.to(x.device)[:, None]
    masked = (x == mask_id) & inside
    density, _eos_count, _non_eos_count, first_eos = module._calculate_eos_density(logits, masked, eos_token_id)
    return density, first_eos


def rho_eos_run(
    model: torch.nn.Module, prompt: torch.Tensor, *, density: str = "tail_confidence", **settings
) -> LengthRun:
    """rho-EOS's ``generate`` on one prompt (1-D). ``settings``: its keywords
    (``initial_gen_length``, ``max_gen_length``, ``block_length``, ``high_conf_threshold``,
    ``expansion_factor``, ``mask_id``, ``eos_token_id``, ``eos_check_tokens``,
    ``low_density_threshold``, ``high_density_threshold``, ``scheduler``; temperature and
    cfg_scale default to 0; its DAEDAL keywords are accepted and unused).

    ``density`` picks the rule each step's length decision reads:

    * ``"tail_confidence"``: the code as released. Its ``generate`` takes the "density" from
      ``_calculate_eos_confidence`` (DAEDAL's tail EOS confidence: scanning the row from its last
      position back to the first generated one, over every position whatever its state, the
      softmax probability of EOS at the first ``eos_check_tokens`` positions whose argmax is EOS,
      summed and divided by ``eos_check_tokens``, however many were found).
    * ``"masked_fraction"``: the paper's rule, which the same file defines as
      ``_calculate_eos_density`` but never calls. For the duration of the call the module function
      ``_calculate_eos_confidence`` is replaced by a shim returning
      ``(density, first_eos_position)`` in place of the released ``(confidence, None)`` (the loop
      unpacks two values and never reads the second). The shim reads the loop's ``x`` and
      ``mask_id`` from the calling frame (``generate``'s) and returns
      ``_calculate_eos_density(logits, masked, eos_token_id)``'s density and first EOS position,
      where ``masked`` = the positions ``p < total_lengths[b]`` with ``x_before_step[b, p] ==
      mask_id``: the canvas the step's forward read (``x_before_step``, the loop's copy from before
      this step's fill), so the density is, among the positions masked when the model was called
      (the authors' README: "implicit EOS at step t / remaining MASK at step t", and the loop's own
      ``currently_masked``), the fraction whose argmax (of the logits, temperature 0) is EOS. A row
      the loop still runs always has a masked position there. In denoise-only mode the loop then
      clamps it into ``[low, high]`` as it does the released value.
    """
    if density not in DENSITIES:
        raise ValueError(f"density={density!r}: expected one of {DENSITIES}")
    module = rho_eos_module()
    with _lock:
        if density == "tail_confidence":
            return _run(module.generate, model, prompt, settings)
        released = module._calculate_eos_confidence
        module._calculate_eos_confidence = _masked_fraction
        try:
            return _run(module.generate, model, prompt, settings)
        finally:
            module._calculate_eos_confidence = released


def rho_eos_generate(
    model: torch.nn.Module, prompt: torch.Tensor, *, density: str = "tail_confidence", **settings
) -> torch.Tensor:
    """rho-EOS's ``generate`` on one prompt: the generated part (see :func:`rho_eos_run`)."""
    return rho_eos_run(model, prompt, density=density, **settings).tokens
