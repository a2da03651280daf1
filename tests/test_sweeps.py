"""Sweeps: the statistics against known values, the collector on a hand-made sweep directory, the
confidence-depth expansion policy, the experiment presets' grids, and one real tiny multirun
through the CLI that ends in sweep.csv, sweep.md and the plots."""

from __future__ import annotations

import copy
import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch
import yaml
from conftest import make_requests, text_decoder
from omegaconf import OmegaConf

from dlmsearch.config import CONF_DIR, ConfigError, build, compose, decoder_presets
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search.components.expansion import ConfidenceDepth, FixedDepth, VarianceGate
from dlmsearch.search.driver import SearchDecoder
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.stats import pareto_front, sign_test, wilson_interval
from dlmsearch.sweeps.collect import SweepError, collect, find_baseline, main, write_all

torch.set_num_threads(1)

PNG = b"\x89PNG\r\n\x1a\n"


# --- statistics ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("successes", "trials", "low", "high", "tolerance"),
    [
        # Newcombe (1998), Stat. Med. 17:857, Table I, method 3 (score interval without correction)
        (81, 263, 0.2553, 0.3662, 5e-5),
        (15, 148, 0.0624, 0.1605, 5e-5),
        (0, 20, 0.0, 0.1611, 5e-5),
        (1, 29, 0.0061, 0.1718, 5e-5),
        # by hand: centre (p + z^2/2n) / (1 + z^2/n), half-width z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/4n^2)
        (5, 10, 0.236593, 0.763407, 1e-6),
        (0, 10, 0.0, 0.277533, 1e-6),
        (10, 10, 0.722467, 1.0, 1e-6),
    ],
)
def test_wilson_interval_known_values(successes: int, trials: int, low: float, high: float, tolerance: float) -> None:
    assert wilson_interval(successes, trials) == pytest.approx((low, high), abs=tolerance)


def test_wilson_interval_edges() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


@pytest.mark.parametrize(
    ("wins", "losses", "p"),
    [
        (1, 9, 22 / 1024),  # R: binom.test(1, 10)$p.value = 0.02148438
        (9, 1, 22 / 1024),
        (2, 10, 2 * 79 / 4096),  # binom.test(2, 12) = 0.03857422
        (0, 5, 2 / 32),
        (0, 20, 2 / 2**20),
        (5, 5, 1.0),
        (6, 5, 1.0),
        (0, 0, 1.0),
        (1, 0, 1.0),
    ],
)
def test_sign_test_exact_values(wins: int, losses: int, p: float) -> None:
    assert sign_test(wins, losses) == pytest.approx(p, rel=1e-12)


def test_sign_test_large_counts_stay_exact() -> None:
    p = sign_test(450, 550)  # normal approximation: z = 3.13, p ~ 0.0017
    assert 0.0015 < p < 0.0020
    assert sign_test(5000, 5000) == sign_test(5000, 5001) == 1.0 and sign_test(0, 1000) == 2.0**-999
    for wins, losses in [(3, 17), (40, 61), (7, 8)]:  # against the direct sum of binomial coefficients
        n = wins + losses
        direct = min(1.0, 2 * sum(math.comb(n, i) for i in range(min(wins, losses) + 1)) / 2**n)
        assert sign_test(wins, losses) == direct


def test_pareto_front_keeps_undominated_points_by_cost() -> None:
    costs = [1.0, 2.0, 3.0, 2.0, 4.0, 1.0]
    accuracies = [0.5, 0.6, 0.55, 0.7, 0.7, 0.5]
    assert pareto_front(costs, accuracies) == [0, 3]  # the duplicate (5) and the dominated (1, 2, 4) are off


# --- the collector on a hand-made sweep ------------------------------------------------------


def fake_run(
    root: Path,
    name: str,
    overrides: list[str],
    solved: set[int],
    *,
    items: int = 10,
    config: dict | None = None,
    steps: float = 10.0,
    rows: float = 20.0,
    extra: list[str] = (),
) -> Path:
    directory = root / name
    (directory / ".hydra").mkdir(parents=True)
    (directory / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    lines = [
        json.dumps(
            {
                "id": f"p{i}",
                "output": "x",
                "correct": i in solved,
                "steps": steps,
                "row_forwards": rows,
                "token_forwards": 81 * rows,
                "tokens_committed": 81,
                "wall_seconds": 0.5,
            }
        )
        for i in range(items)
    ]
    (directory / "results.jsonl").write_text("\n".join([*lines, *extra]) + "\n")
    if config is not None:
        (directory / "summary.json").write_text(json.dumps({"config": config}))
    return directory


@pytest.fixture
def fake_sweep(tmp_path: Path) -> Path:
    common = ["+experiment=fake", "task.limit=10"]
    fake_run(
        tmp_path,
        "0_base",
        ["decoder=llada", *common],
        set(range(5)),
        steps=40,
        rows=40,
        config={"decoder": {"name": "llada", "commit": {"steps": 81}}, "out_dir": "a"},
    )
    fake_run(
        tmp_path,
        "1_better",
        ["decoder=fast_dllm", *common],
        set(range(9)),
        steps=12,
        rows=12,
        config={"decoder": {"name": "fast_dllm", "commit": {"threshold": 0.9}}, "out_dir": "b"},
    )
    # one item ended in error, then a torn line: 9 judged items, the error left out
    error = json.dumps({"id": "p9", "error": "RuntimeError: boom", "correct": None, "wall_seconds": 0.1})
    fake_run(
        tmp_path,
        "2_other",
        ["decoder=adalook", *common],
        {5, 6, 7, 8},
        items=9,
        steps=11,
        rows=30,
        config={"decoder": {"name": "adalook", "commit": {"threshold": 0.9}}, "out_dir": "c"},
        extra=[error, '{"id": "p1'],
    )
    return tmp_path


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_collector_tables_pairs_and_plots(fake_sweep: Path) -> None:
    sweep = collect(fake_sweep, baseline="decoder=llada", group_by=["decoder.name"])
    written = write_all(sweep)
    assert {p.name for p in written} == {
        "sweep.csv",
        "sweep.md",
        "accuracy_vs_steps.png",
        "accuracy_vs_row_forwards.png",
    }
    for name in ("accuracy_vs_steps.png", "accuracy_vs_row_forwards.png"):
        assert (fake_sweep / name).read_bytes()[:8] == PNG
    rows = read_csv(fake_sweep / "sweep.csv")
    assert [r["label"] for r in rows] == ["decoder=llada", "decoder=fast_dllm", "decoder=adalook"]
    assert [r["group"] for r in rows] == ["llada", "fast_dllm", "adalook"]
    base, better, other = rows
    assert base["baseline"] == "True" and better["baseline"] == "False"
    assert (base["judged"], base["solved"], float(base["accuracy"])) == ("10", "5", 0.5)
    assert (float(base["wilson_low"]), float(base["wilson_high"])) == pytest.approx((0.236593, 0.763407), abs=1e-6)
    # paired: items p0-p4 both, p5-p8 only the config, p9 neither -> sign test 4 vs 0
    assert (better["both"], better["only_config"], better["only_baseline"], better["neither"]) == ("5", "4", "0", "1")
    assert float(better["sign_p"]) == pytest.approx(0.125)
    # p9 ended in error: 9 items in common; p0-p4 only the baseline, p5-p8 only the config
    assert (other["items"], other["judged"], other["errors"], other["paired_items"]) == ("10", "9", "1", "9")
    assert (other["only_config"], other["only_baseline"], float(other["sign_p"])) == ("4", "5", 1.0)
    assert float(other["mean_token_forwards"]) == 81 * 30
    # fronts: fast_dllm dominates on both costs; adalook is cheaper in steps but worse
    assert [r["pareto_steps"] for r in rows] == ["False", "True", "True"]
    assert [r["pareto_row_forwards"] for r in rows] == ["False", "True", "False"]
    # varying overrides and resolved-config keys become columns; common ones and out_dir do not
    assert (
        "decoder" in rows[0]
        and "decoder.commit.steps" in rows[0]
        and "task.limit" not in rows[0]
        and "out_dir" not in rows[0]
    )
    markdown = (fake_sweep / "sweep.md").read_text()
    assert markdown.startswith("# fake sweep")
    assert "| 1 | decoder=fast_dllm | 10 | 5 | 4 | 0 | 1 | +40.0 | 0.125 |" in markdown
    assert "50.0 % [23.7, 76.3]" in markdown and "(1 errors)" in markdown
    assert "![accuracy vs steps](accuracy_vs_steps.png)" in markdown


def test_baseline_is_found_by_label_directory_or_overrides(fake_sweep: Path) -> None:
    sweep = collect(fake_sweep)
    runs = sweep.runs
    assert find_baseline(runs, "decoder=fast_dllm").name == "1_better"
    assert find_baseline(runs, "2_other").name == "2_other"
    assert find_baseline(runs, "+decoder=adalook task.limit=10").name == "2_other"
    with pytest.raises(SweepError, match="matches 3 runs"):
        find_baseline(runs, "task.limit=10")
    with pytest.raises(SweepError, match="matches no run"):
        find_baseline(runs, "decoder=dream")
    assert sweep.baseline is None
    write_all(sweep, fake_sweep / "out")
    assert "No baseline named" in (fake_sweep / "out" / "sweep.md").read_text()


def test_collector_cli_takes_the_callback_settings_of_the_sweep(
    fake_sweep: Path, capsys: pytest.CaptureFixture
) -> None:
    (fake_sweep / "multirun.yaml").write_text(
        yaml.safe_dump(
            {
                "hydra": {
                    "callbacks": {
                        "collect_sweep": {
                            "_target_": "dlmsearch.sweeps.callback.CollectSweep",
                            "baseline": "decoder=fast_dllm",
                            "group_by": [],
                            "connect": True,
                        }
                    }
                }
            }
        )
    )
    assert main([str(fake_sweep)]) == 0
    assert [r["baseline"] for r in read_csv(fake_sweep / "sweep.csv")] == ["False", "True", "False"]
    assert main([str(fake_sweep), "--baseline", "decoder=dream"]) == 2
    assert "matches no run" in capsys.readouterr().err
    assert main([str(fake_sweep / "nothing")]) == 2


def test_collector_without_matplotlib_writes_the_tables(fake_sweep: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    written = write_all(collect(fake_sweep, baseline="decoder=llada"))
    assert [p.name for p in written] == ["sweep.csv", "sweep.md"]
    assert "Plots need matplotlib" in (fake_sweep / "sweep.md").read_text()


# --- the practitioner guide's heuristic ------------------------------------------------------


def test_confidence_depth_maps_top_confidence_to_depth() -> None:
    policy = ConfidenceDepth()
    top = torch.tensor([0.95, 0.9, 0.8, 0.7, 0.3, -float("inf")])
    assert policy.depth_for(top).tolist() == [1, 3, 3, 5, 5, 5]  # strictly above the thresholds
    assert ConfidenceDepth(max_depth=2).depth_for(top).tolist() == [1, 2, 2, 2, 2, 2]
    bound = attrs.evolve(policy, depths=torch.tensor([1, 3]))  # what for_roots() returns for two samples
    live = torch.ones(2, 4, dtype=torch.bool)
    assert bound.should_continue(torch.zeros(2, 4), live, 1).tolist() == [False, True]
    assert bound.should_continue(torch.zeros(2, 4), live, 3).tolist() == [False, False]
    with pytest.raises(RuntimeError, match="call its for_roots"):
        policy.should_continue(torch.zeros(2, 4), live, 1)


def test_confidence_depth_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="mid must not exceed high"):
        build(
            compose(["+decoder=adalook", "decoder/expansion=confidence_depth", "decoder.expansion.mid=0.95"]), "decoder"
        )


def planned(*overrides: str):
    return text_decoder("adalook", "decoder/expansion=confidence_depth", *overrides)


def same_decode(a, b, adapter: ModelAdapter) -> list:
    requests = make_requests([3, 0, 5, 2], 16, seed=11, fixed=2)
    first = a.decode(RolloutEngine(adapter=adapter), requests, 8)
    second = b.decode(RolloutEngine(adapter=adapter), requests, 8)
    for x, y in zip(first, second):
        assert torch.equal(x.tokens, y.tokens) and torch.equal(x.commit_depth, y.commit_depth)
        assert (x.steps, x.row_forwards) == (y.steps, y.row_forwards)
    return first


def test_confidence_depth_extremes_are_fixed_depths(adapter: ModelAdapter) -> None:
    # every root's top confidence is above 0: depth 1 everywhere, which is fixed depth 1 (ETE)
    same_decode(
        planned("decoder.expansion.high=0.0", "decoder.expansion.mid=0.0"),
        text_decoder("adalook", "decoder/expansion=fixed_depth", "decoder.expansion.depth=1"),
        adapter,
    )
    # no root is above 1: always the maximum depth
    results = same_decode(
        planned("decoder.expansion.high=1.0", "decoder.expansion.mid=1.0", "decoder.expansion.max_depth=3"),
        text_decoder("adalook", "decoder/expansion=fixed_depth", "decoder.expansion.depth=3"),
        adapter,
    )
    assert any((r.commit_depth >= 2).any() for r in results)


def test_confidence_depth_decides_per_sample_and_batch_free(
    adapter: ModelAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    decided: list[int] = []
    original = ConfidenceDepth.depth_for
    monkeypatch.setattr(
        ConfidenceDepth,
        "depth_for",
        lambda self, top: decided.extend(original(self, top).tolist()) or original(self, top),
    )
    decoder = planned("decoder.expansion.high=0.8", "decoder.expansion.mid=0.5", "decoder.expansion.max_depth=3")
    assert isinstance(decoder, SearchDecoder) and isinstance(decoder.expansion, ConfidenceDepth)
    requests = make_requests([3, 0, 5, 2], 16, seed=11, fixed=2)
    together = decoder.decode(RolloutEngine(adapter=adapter), requests, 8)
    assert {1, 3} <= set(decided), f"the thresholds should give both depths here, got {sorted(set(decided))}"
    for request, result in zip(requests, together):
        [alone] = decoder.decode(RolloutEngine(adapter=adapter), [request], 8)
        assert torch.equal(alone.tokens, result.tokens) and alone.row_forwards == result.row_forwards
    assert decoder.expansion.depths is None  # unbound again after every lookahead


# --- experiment presets ---------------------------------------------------------------------


def sweep_values(cfg, key: str) -> list[str]:
    return [v.strip() for v in str(cfg.hydra.sweeper.params[key]).split(",")]


def experiment_file(name: str):
    return OmegaConf.load(CONF_DIR / "experiment" / f"{name}.yaml")


@pytest.mark.parametrize(("name", "runs"), [("ablate_gate", 114), ("budget_curve", 45)])
def test_grid_sizes_are_the_documented_ones(name: str, runs: int) -> None:
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    raw = experiment_file(name)
    overrides = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in raw.hydra.sweeper.params.items()])
    assert len(BasicSweeper.split_arguments(overrides, None)[0]) == runs
    header = (CONF_DIR / "experiment" / f"{name}.yaml").read_text()
    assert f"= {runs} runs" in header


def test_ablate_gate_grid_builds_every_arm() -> None:
    raw = experiment_file("ablate_gate")
    arms = sweep_values(raw, "ablate.arm")
    assert arms == list(raw.ablate.arms) and len(arms) == 38
    assert sweep_values(raw, "decoder.candidates.k") == ["2", "4", "8"]
    cfg = compose(["+experiment=ablate_gate"])
    kinds = {}
    for arm in arms:
        cfg.ablate.arm = arm
        decoder = build(cfg, "decoder")
        assert isinstance(decoder, SearchDecoder) and decoder.name == "adalook"
        kinds[arm] = decoder.expansion
    assert kinds["fixed_d3"] == FixedDepth(depth=3)
    assert kinds["gate_below_T1e-2_D4"] == VarianceGate(threshold=0.01, continue_if="below", max_depth=4)
    assert kinds["confdepth_D4"] == ConfidenceDepth(max_depth=4)
    assert sum(isinstance(e, VarianceGate) for e in kinds.values()) == 30
    assert sorted({e.max_depth for e in kinds.values() if isinstance(e, VarianceGate)}) == [2, 3, 4]


KNOBS = {
    "steps": ("llada", "random", "dream"),
    "threshold": ("fast_dllm", "fast_block", "ete", "adalook", "fixed_depth"),
    "factor": ("fast_dllm_factor",),
    "budget": ("fast_block", "ete", "adalook", "fixed_depth"),
}


def test_budget_curve_moves_each_preset_along_its_knob_and_keeps_the_rest() -> None:
    raw = experiment_file("budget_curve")
    presets = sweep_values(raw, "decoder")
    points = sweep_values(raw, "curve.point")
    assert (
        set(presets) == set(raw.curve.commit)
        and set(presets) <= set(decoder_presets())
        and points == list(raw.curve.steps)
    )
    for preset in presets:
        composed = compose(["+experiment=budget_curve", f"decoder={preset}"])
        own = OmegaConf.to_container(compose([f"+decoder={preset}"]).decoder.commit, resolve=True)
        knobs = {k for k, owners in KNOBS.items() if preset in owners}
        seen = set()
        for point in points:
            cfg = copy.deepcopy(composed)  # building resolves the chosen table entry in place: one copy per point
            cfg.curve.point = point
            commit = OmegaConf.to_container(cfg.decoder.commit, resolve=True)
            assert {k: v for k, v in commit.items() if k not in knobs} == {
                k: v for k, v in own.items() if k not in knobs
            }, preset
            seen.add(tuple(commit[k] for k in sorted(knobs)))
            decoder = build(cfg, "decoder")
            assert decoder.name == preset
        assert len(seen) == len(points), f"{preset} does not move along its knob"
    # the tie C*(N) = 0.5 + 0.075 log2 N, the midpoint of algorithms.md's band
    for point in points:
        n = raw.curve.budget[point]
        assert raw.curve.threshold[point] == pytest.approx(0.5 + 0.075 * math.log2(n))


# --- one real multirun through the CLI ------------------------------------------------------


def test_cli_multirun_of_an_experiment_is_collected(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    env = {**os.environ, "HYDRA_FULL_ERROR": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlmsearch",
            "-m",
            "+experiment=ablate_gate",
            "ablate.arm=fixed_d1,confdepth_D2",
            "decoder.candidates.k=4",
            "task.limit=2",
            "examples=0",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0_fixed_d1_k4", "1_confdepth_D2_k4"]
    rows = read_csv(sweep / "sweep.csv")
    assert [(r["label"], r["baseline"], r["judged"]) for r in rows] == [
        ("arm=fixed_d1", "True", "2"),
        ("arm=confdepth_D2", "False", "2"),
    ]
    assert rows[1]["decoder.expansion._target_"] == "dlmsearch.search.components.expansion.ConfidenceDepth"
    assert float(rows[0]["mean_steps"]) > 0 and float(rows[0]["mean_row_forwards"]) >= float(rows[0]["mean_steps"])
    markdown = (sweep / "sweep.md").read_text()
    assert markdown.startswith("# ablate_gate sweep") and "## Paired against the baseline" in markdown
    assert "| 1 | arm=confdepth_D2 | 2 |" in markdown
    for name in ("accuracy_vs_steps.png", "accuracy_vs_row_forwards.png"):
        assert (sweep / name).read_bytes()[:8] == PNG


def test_a_directory_of_links_compares_runs_of_several_sweeps(
    fake_sweep: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    compare = tmp_path_factory.mktemp("compare")
    for name in ("0_base", "2_other"):
        (compare / name).symlink_to(fake_sweep / name, target_is_directory=True)
    sweep = collect(compare, baseline="decoder=llada")
    assert [r["label"] for r in sweep.rows] == ["decoder=llada", "decoder=adalook"]


def test_statistics_agree_with_scipy() -> None:
    """Wilson intervals and the exact sign test against scipy's own implementations."""
    scipy_stats = pytest.importorskip("scipy.stats")
    for successes, trials in [(0, 10), (1, 10), (5, 10), (10, 10), (37, 256), (200, 256), (128, 256), (3, 7)]:
        expected = scipy_stats.binomtest(successes, trials).proportion_ci(confidence_level=0.95, method="wilson")
        low, high = wilson_interval(successes, trials)
        assert low == pytest.approx(expected.low, abs=1e-12) and high == pytest.approx(expected.high, abs=1e-12)
    for wins, losses in [(0, 0), (1, 0), (5, 1), (10, 2), (30, 31), (57, 3), (61, 3), (120, 80), (0, 40)]:
        if wins + losses:
            assert sign_test(wins, losses) == pytest.approx(
                scipy_stats.binomtest(wins, wins + losses, 0.5).pvalue, rel=1e-9, abs=1e-300
            )
