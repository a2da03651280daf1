"""A tensor-parallel group decides as one (issue 47, defect 4): two gloo ranks of a sharded tiny LLaDA,
where only one rank's clock crosses the deadline, only one runs out of memory, only one gets the stop
signal, decode what one process decodes under the same decisions, and neither hangs (the launch is
bounded). Metamorphic: a tensor-parallel run equals one process under deadlines, out-of-memory and
stop signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tp_decisions_worker import decode_cases
from tp_worker import load, write_checkpoint

WORKER = Path(__file__).with_name("tp_decisions_worker.py")
ROOT = WORKER.parent.parent
TIMEOUT_S = 240


def launch(directory: Path, scratch: Path, processes: int = 2) -> list[dict]:
    """Every rank's cases under torchrun, or the test fails (a rank's error, or a hang past TIMEOUT_S)."""
    out = scratch / "out.pt"
    # the checkout the test runs from, not whichever one is installed (the worker's own folder comes first)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(map(str, (WORKER.parent, ROOT)))}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes), "--standalone"]
    with subprocess.Popen(
        [*command, str(WORKER), str(directory), str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout ends the workers too
    ) as run:
        try:
            _, stderr = run.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
            pytest.fail(f"{processes} ranks hung: not finished within {TIMEOUT_S} s")
    assert run.returncode == 0, stderr[-3000:]
    return [torch.load(f"{out}.rank{rank}") for rank in range(processes)]


def test_a_group_decides_as_one_process(tmp_path: Path) -> None:
    directory = write_checkpoint("llada", tmp_path / "llada")
    ranks = launch(directory, tmp_path)
    alone = decode_cases(load("llada", str(directory), 1), True, tmp_path / "alone")
    for rank, found in enumerate(ranks):
        assert found.pop("diverged").startswith(
            f"tensor-parallel rank {rank} failed inside the sharded model's forward"
        )
        assert found == alone, rank
    # the clock crossed mid-decode (the lookahead ran before it), and the rank that did not run out of memory backed off too
    assert all(alone["deadline"]["deadline_hit"]) and alone["out_of_memory"]["budget"] is not None
    assert alone["stop"]["stopped"].startswith("interrupted by SIGTERM after 1 items were written")


def test_one_process_agrees_with_itself() -> None:
    """No group: every value comes back as given, with no collective; errors pass through as raised."""
    from dlmsearch.models.group_decisions import GroupDecisions

    alone = GroupDecisions()
    flags = torch.tensor([True, False])
    assert alone.any(flags) is flags and alone.highest(True) == 1 and alone.least(7) == 7
    with pytest.raises(torch.OutOfMemoryError), alone.paired(lambda error: True):
        raise torch.OutOfMemoryError("out of memory")
