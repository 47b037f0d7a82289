"""`spectune recommend` on constructed results with hand-computed answers.

``write_sweep`` / ``row`` / ``grid`` (tests/helpers/results_folders.py) build results folders with every
summary.csv column (docs/results-format.md).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spectune.backends.num_steps.sglang_config import parse_sglang_adaptive_config, parse_vllm_speculative_config
from spectune.backends.num_steps.ema_policy import AdaptivePolicy
from spectune.cli import app, main
from spectune.core.errors import UserError
from spectune.results.reader import load_results
from spectune.tune.configs import sglang_configs
from spectune.tune.ladders import SGLANG_GLOBALS, design_slot, settles, simulate_slot
from spectune.tune.recommend import RecommendOptions, build_slots, Choice, recommend

from helpers.engine_configs import vllm_config
from helpers.paths import EXAMPLES
from helpers.results_folders import accepted, grid, row, write_sweep

def chain_alpha(k: int, mean: float) -> float:
    """alpha with alpha + alpha^2 + ... + alpha^k = mean (bisection; the chain model of Leviathan et al.)."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** i for i in range(1, k + 1)) < mean else (lo, mid)
    return lo


def share_at(config: dict, acc: dict[int, float], batch_size: int, target: int, start: int, seed: int,
             batches: int = 3000) -> float:
    """Independent replay of SGLang's EMA policy on a whole emitted config: ``batch_size`` requests per verify,
    each reporting a per-request accepted count drawn (numpy, ``seed``; not the sampler or the seeds design_slot
    used) from the chain model whose mean is ``acc[k]``. Returns the share of the second half of ``batches`` verify
    batches that ran ``target``."""
    import numpy as np

    policy = AdaptivePolicy(parse_sglang_adaptive_config(config, strict=True), initial_steps=start)
    rng = np.random.default_rng(seed)
    alpha = {k: chain_alpha(k, acc[k]) for k in acc if k > 0}
    trace = []
    for _ in range(batches):
        k = policy.steps_for_batch(batch_size)
        trace.append(k)
        counts = []
        for _ in range(batch_size):
            n = 0
            while n < k and rng.random() < alpha[k]:
                n += 1
            counts.append(n)
        policy.on_verify(counts, batch_size)
    tail = trace[batches // 2:]
    return tail.count(target) / len(tail)


#: what "settles" promises (spectune/emit.py settles, docs/recommend.md): >= 90% of batches at the optimum under
#: per-request noise; at K* = 0 SGLang probes up at every decision, so half of them.
SETTLED_SHARE = {True: 0.9, False: 0.5}


CROSSOVER = {1: {0: 100, 1: 150, 3: 200}, 8: {0: 600, 1: 700, 3: 650}, 32: {0: 2000, 1: 1900, 3: 1500}}


def run(folder: Path, **opts) -> "object":
    return recommend(load_results(folder), RecommendOptions(**opts))


def test_crossover_slots_and_configs(tmp_path):
    folder = write_sweep(tmp_path / "r", grid(CROSSOVER))
    rec = run(folder)
    assert [(c.concurrency, c.steps) for c in rec.choices] == [(1, 3), (8, 1), (32, 0)]
    # geometric boundaries: round(sqrt(1*8)) = 3, round(sqrt(8*32)) = 16
    assert [(s.lower, s.upper, s.steps) for s in rec.slots] == [(1, 2, 3), (3, 15, 1), (16, None, 0)]
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["recommend", str(folder), "-o", str(out)])
    assert res.exit_code == 0, res.output
    custom = json.loads((out / "sglang-adaptive-custom.json").read_text())
    # no neighbour beats a slot's num_steps at the slot's concurrencies (K=1 150 < K=3 200 at c=1; K=0 600 and
    # K=3 650 < K=1 700 at c=8), so every custom ladder is the slot's num_steps alone: nothing to switch between
    assert custom == {
        "ema_alpha": 0.2, "update_interval": 5, "warmup_batches": 10,
        "1": {"candidate_steps": [3], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0.0},
        "3": {"candidate_steps": [1], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0.0},
        "16": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0.0},
    }
    cons = json.loads((out / "sglang-adaptive-conservative.json").read_text())
    assert [cons[k]["candidate_steps"] for k in ("1", "3", "16")] == [[3], [1], [0]]
    aggr = json.loads((out / "sglang-adaptive-aggressive.json").read_text())
    # aggressive slot 1: the ceiling (1.95 x EMA) caps a batch-1 EMA that swings below 1.03 about one batch in ten,
    # so under per-request noise 1 is left out
    assert [aggr[k]["candidate_steps"] for k in ("1", "3", "16")] == [[3], [0, 1], [0, 1]]
    assert aggr["1"]["ceiling_coeff"] == math.floor(100 * 3 / accepted(3)) / 100  # 1.95: ceil(1.533 * 1.95) = 3
    assert aggr["16"]["down_hysteresis"] == pytest.approx(accepted(1) - 0.5 + 0.25)  # returns to 0 after a probe
    vllm = json.loads((out / "vllm-speculative-config.json").read_text())
    assert vllm == {"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 15, 1],
                                                                                             [16, 32, 0]]}
    for preset in ("custom", "conservative", "aggressive"):
        parse_sglang_adaptive_config(json.loads((out / f"sglang-adaptive-{preset}.json").read_text()), strict=True)
    sched = parse_vllm_speculative_config(vllm)
    assert [sched.k_for_batch_size(b) for b in (1, 2, 3, 15, 16, 64)] == [3, 3, 1, 1, 0, 0]
    assert json.loads((out / "best-static.json").read_text())["num_steps"] == 1
    md = (out / "recommendation.md").read_text()
    assert "| 1 | 100 | 150 | 200 * |" in md
    assert "Best single static num_steps: **K=1**" in md
    assert json.loads((out / "recommendation.json").read_text())["slots"][0]["steps"] == 3


def test_emitted_ladders_settle_on_the_optimum(tmp_path):
    rows = grid({1: {0: 100, 1: 150, 2: 190, 3: 200, 5: 180}, 16: {0: 800, 1: 900, 2: 850, 3: 800, 5: 700}})
    rec = run(write_sweep(tmp_path / "r", rows))
    configs, _ = sglang_configs(rec)
    # neither K=2 (190) nor K=5 (180) beats K=3 (200) at concurrency 1: the custom ladder is K=3 alone
    assert configs.custom["1"]["candidate_steps"] == [3]
    # oracle: the true per-token acceptance of these rows is ALPHA at every K (row()), so replay the policy on
    # the whole config with per-request counts drawn from that chain, from every candidate as start, with seeds
    # (100 + start) that design_slot never used (it draws with random.Random(start))
    acc = {k: accepted(k) for k in (1, 2, 3, 5)}
    for preset, cfg in configs.by_preset().items():
        for slot in rec.slots:
            for start in cfg[str(slot.lower)]["candidate_steps"]:
                share = share_at(cfg, acc, slot.lower, slot.steps, start, seed=100 + start)
                assert share >= SETTLED_SHARE[slot.steps > 0], (preset, slot.lower, start, share)


def test_ladders_settle_under_per_request_noise():
    """A weak head (the bundled SmolLM2 head: 0.40, 0.57, 0.63 accepted drafts at K=1..3, best K=2 at batch 1):
    the ladder [1, 2, 3] with hysteresis that settles on the mean acceptance ping-pongs between tiers when each
    verify reports one request's count; the emitted ladder holds K=2."""
    acc = {0: 0.0, 1: 0.40, 2: 0.57, 3: 0.63}
    naive = {"candidate_steps": [1, 2, 3], "up_hysteresis": -0.35, "down_hysteresis": -0.25, "ceiling_coeff": 0.0}
    assert settles(naive, acc, 2)  # on the mean it is fine
    assert not settles(naive, acc, 2, batch_size=1)

    def switches(slot: dict, seed: int) -> int:
        trace = simulate_slot(slot, acc, 2, batches=1000, batch_size=1, seed=seed)
        return sum(a != b for a, b in zip(trace, trace[1:]))

    slot, notes = design_slot("custom", 2, [0, 1, 2, 3, 4], acc, batch_size=1)
    assert 2 in slot["candidate_steps"]
    for start in slot["candidate_steps"]:  # independent replay (share_at), seeds design_slot did not use
        assert share_at({**SGLANG_GLOBALS, "1": slot}, acc, 1, 2, start, seed=100 + start) >= SETTLED_SHARE[True]
    assert any("per-request noise at batch size 1" in n for n in notes)
    assert simulate_slot(slot, acc, 2, batches=1000, batch_size=1, seed=7)[-500:].count(2) >= 450
    assert sum(switches(naive, s) for s in range(4)) > 3 * sum(switches(slot, s) for s in range(4)) + 40
    # at batch 32 the mean of 32 requests is steady: the same ladder settles
    wide = design_slot("custom", 2, [0, 1, 2, 3, 4], acc, batch_size=32)[0]
    assert wide["candidate_steps"] == [1, 2, 3]  # nothing had to be left out at batch 32
    for start in wide["candidate_steps"]:
        assert share_at({**SGLANG_GLOBALS, "1": wide}, acc, 32, 2, start, seed=100 + start, batches=600) >= 0.9


def test_measured_boundary_rule():
    choices = [Choice(1, 3), Choice(4, 3), Choice(16, 1), Choice(64, 0)]
    assert [(s.lower, s.upper, s.steps) for s in build_slots(choices, "measured")] == [(1, 15, 3), (16, 63, 1),
                                                                                       (64, None, 0)]
    # geometric: round(sqrt(4*16)) = 8, round(sqrt(16*64)) = 32; 1 and 2 -> 2
    assert [s.lower for s in build_slots(choices, "geometric")] == [1, 8, 32]
    assert [s.lower for s in build_slots([Choice(1, 3), Choice(2, 1)], "geometric")] == [1, 2]


def test_tie_within_noise_band_prefers_smaller_k(tmp_path):
    folder = write_sweep(tmp_path / "r", grid({4: {0: 90, 1: 100, 3: 101.5}}))
    assert run(folder).choices[0].steps == 1  # 101.5 is within 2% of 100
    assert run(folder, noise_band=0.01).choices[0].steps == 3  # 100 < 101.5 * 0.99
    assert "noise band" in run(folder).choices[0].reason


def test_best_cells_repeat_spread_widens_the_band(tmp_path):
    # K=3 repeats 100, 104, 108: median 104, MAD 4 -> spread 1.4826*4/104 = 5.7% (> 2%), K=1 at 99 is within it;
    # max_spread 10% keeps K=3 quiet.
    rows = [row(3, 4, v, rep=i) for i, v in enumerate((100, 104, 108))] + [row(1, 4, 99, rep=i) for i in range(3)]
    ch = run(write_sweep(tmp_path / "r", rows), max_spread=0.10).choices[0]
    assert ch.steps == 1
    assert ch.band == pytest.approx(1.4826 * 4 / 104)


def test_slo_violating_optimum_is_not_eligible(tmp_path):
    rows = grid({8: {0: 500, 1: 600}}) + [row(3, 8, 700, tpot_p99_ms=45.0)]
    rec = run(write_sweep(tmp_path / "r", rows), slo_tpot_ms=30.0)
    ch = rec.choices[0]
    assert ch.steps == 1
    assert ch.tier == "quiet"
    assert "TPOT p99 45.0 ms > SLO 30 ms" in ch.reason
    assert not rec.cell(3, 8).eligible
    # attainment rule: K=1 meets TPOT but only 80% of requests meet the SLOs -> K=0
    rows = [row(0, 8, 500, slo_attainment=0.95), row(1, 8, 600, slo_attainment=0.8),
            row(3, 8, 700, tpot_p99_ms=45.0, slo_attainment=0.5)]
    assert run(write_sweep(tmp_path / "r2", rows), slo_tpot_ms=30.0).choices[0].steps == 0
    # nothing meets the SLO: the objective decides, flagged
    rows = [row(k, 8, 500 + 100 * k, tpot_p99_ms=50.0) for k in (0, 1)]
    ch = run(write_sweep(tmp_path / "r3", rows), slo_tpot_ms=30.0).choices[0]
    assert ch.steps == 1
    assert ch.tier == "slo-unmet"


def test_single_concurrency_sweep(tmp_path):
    rec = run(write_sweep(tmp_path / "r", grid({16: {0: 800, 2: 1000, 4: 900}})))
    assert [(s.lower, s.upper, s.steps) for s in rec.slots] == [(1, None, 2)]
    assert vllm_config(rec) == {"num_speculative_tokens": 2}  # one K: the static server, no schedule
    configs, _ = sglang_configs(rec)
    assert list(configs.custom) == ["ema_alpha", "update_interval", "warmup_batches", "1"]
    assert configs.custom["1"]["candidate_steps"] == [2]  # neither K=0 nor K=4 beats K=2
    rec = run(write_sweep(tmp_path / "r2", grid({1: {0: 100, 2: 150}, 16: {0: 800, 2: 600}})), max_batch_size=64)
    assert vllm_config(rec)["num_speculative_tokens_per_batch_size"] == [[1, 3, 2], [4, 64, 0]]  # boundary sqrt(16)


def test_no_speculation_anywhere(tmp_path):
    folder = write_sweep(tmp_path / "r", grid({1: {0: 100, 1: 90}, 8: {0: 600, 1: 500}}))
    out = tmp_path / "out"
    assert CliRunner().invoke(app, ["recommend", str(folder), "-o", str(out)]).exit_code == 0
    assert not (out / "vllm-speculative-config.json").exists()
    for preset in ("custom", "conservative"):
        cfg = json.loads((out / f"sglang-adaptive-{preset}.json").read_text())
        assert [s.candidate_steps for s in parse_sglang_adaptive_config(cfg).slots] == [(0,)]
    assert json.loads((out / "best-static.json").read_text())["num_steps"] == 0
    assert "no vLLM schedule written" in (out / "recommendation.md").read_text()


def test_missing_cells_are_reported_not_chosen(tmp_path):
    plan = {"steps": [0, 1, 3], "concurrency": [1, 8, 64], "repeats": 1}
    rows = grid({1: {0: 100, 1: 150}, 8: {0: 600, 1: 700, 3: 650}})  # K=3 at c=1 and all of c=64 missing
    rec = run(write_sweep(tmp_path / "r", rows, plan=plan))
    assert rec.cell(3, 1).status == "missing"
    assert rec.cell(0, 64).status == "missing"
    assert [(c.concurrency, c.steps) for c in rec.choices] == [(1, 1), (8, 1), (64, None)]
    assert "K=3 missing" in rec.choices[0].reason
    assert "no usable measurement" in rec.choices[2].reason
    assert [(s.lower, s.upper, s.steps) for s in rec.slots] == [(1, None, 1)]


def test_failed_points_are_ineligible_and_never_averaged(tmp_path):
    rows = grid({4: {0: 300, 1: 400}}) + [row(3, 4, 900, rep=0), row(3, 4, rep=1, status="failed")]
    rec = run(write_sweep(tmp_path / "r", rows))
    cell = rec.cell(3, 4)
    assert cell.status == "failed"
    assert not cell.eligible
    assert cell.n_runs == 2
    assert cell.n_ok == 1
    assert rec.choices[0].steps == 1
    assert "K=3 failed (1/2 repeat(s) failed: boom)" in rec.choices[0].reason


def test_repeats_whose_windows_stopped_early_give_no_spread(tmp_path):
    """A window stopped early reports its statistic over its first prompts: two such runs of one cell 8% apart
    differ by their prompts, and the cell is not flagged noisy (a guided sweep's settle run, 2026-11-27)."""
    rows = [row(1, 4, v, rep=i, stopped_early=True, early_stop_reason="below_best") for i, v in enumerate((92, 100))]
    rec = run(write_sweep(tmp_path / "r", rows + [row(0, 4, 90)]))
    assert not rec.cell(1, 4).noisy


def test_repeats_measured_in_full_8_percent_apart_are_noisy(tmp_path):
    rows = [row(1, 4, v, rep=i, stopped_early=False, early_stop_reason="") for i, v in enumerate((92, 100))]
    rec = run(write_sweep(tmp_path / "r", rows + [row(0, 4, 90)]))
    assert rec.cell(1, 4).noisy


def test_noisy_repeats_are_flagged_and_not_trusted(tmp_path):
    rows = [row(3, 4, v, rep=i) for i, v in enumerate((140, 200, 260))] + [row(1, 4, 150, rep=i) for i in range(3)]
    rec = run(write_sweep(tmp_path / "r", rows))
    assert rec.cell(3, 4).noisy
    assert rec.cell(3, 4).spread == pytest.approx(1.4826 * 60 / 200)
    assert rec.choices[0].steps == 1
    assert "noisy" in rec.choices[0].reason
    assert any("the noisy K=3 (median 200" in w and "more repeats" in w for w in rec.warnings)
    only_noisy = [row(3, 4, v, rep=i) for i, v in enumerate((140, 200, 260))]
    assert run(write_sweep(tmp_path / "r2", only_noisy)).choices[0].tier == "noisy"


def test_a_noisy_cell_that_wins_beyond_its_spread_is_chosen(tmp_path):
    """K=3's repeats 185/200/215 (spread 11%) against a quiet K=1 at 150: even its slowest repeat is 23% ahead."""
    rows = [row(3, 4, v, rep=i) for i, v in enumerate((185, 200, 215))] + [row(1, 4, 150, rep=i) for i in range(3)]
    rec = run(write_sweep(tmp_path / "r", rows))
    assert rec.cell(3, 4).noisy
    assert rec.choices[0].steps == 3
    assert "beats the best quiet K beyond its own spread" in rec.choices[0].reason


def test_tpot_objective_and_best_static_aggregate(tmp_path):
    rows = [row(k, c, tpot_p50_ms=t) for c, by_k in {1: {0: 20.0, 2: 10.0}, 8: {0: 25.0, 2: 40.0}}.items()
            for k, t in by_k.items()]
    rec = run(write_sweep(tmp_path / "r", rows), objective="tpot")
    assert [(c.concurrency, c.steps) for c in rec.choices] == [(1, 2), (8, 0)]
    # K=0: sqrt(10/20 * 25/25) = 0.707; K=2: sqrt(10/10 * 25/40) = 0.791 -> K=2
    assert rec.static_scores[0] == pytest.approx(math.sqrt(0.5))
    assert rec.best_static == 2


def test_goodput_needs_slos_and_recomputes_from_requests(tmp_path):
    folder = write_sweep(tmp_path / "r", grid({4: {0: 100, 1: 120}}))
    with pytest.raises(UserError, match="goodput needs"):
        run(folder, objective="goodput")
    # requests: K=0 has 4/4 meeting TTFT <= 100 ms, K=1 has 2/4 -> goodput 0.4 vs 0.2 req/s over 10 s
    reqs = [{"steps": k, "concurrency": 4, "repeat": 0, "error": None, "chunk_times": [0.0], "ttft_ms": t,
             "tpot_ms": 5.0} for k, ts in ((0, (50, 60, 70, 80)), (1, (50, 60, 150, 160))) for t in ts]
    folder = write_sweep(tmp_path / "r2", grid({4: {0: 100, 1: 120}}), plan={"steps": [0, 1]}, requests=reqs)
    rec = run(folder, objective="goodput", slo_ttft_ms=100.0, min_slo_attainment=0.4)
    assert rec.cell(0, 4).objective == pytest.approx(0.4)
    assert rec.cell(1, 4).metrics["slo_attainment"] == 0.5
    assert rec.choices[0].steps == 0


def test_cli_bad_input_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["spectune", "recommend", str(tmp_path / "nope")])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    assert "no such file or folder" in " ".join(capsys.readouterr().err.split())
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    monkeypatch.setattr(sys, "argv", ["spectune", "recommend", str(tmp_path / "bad.csv")])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    assert "missing column" in " ".join(capsys.readouterr().err.split())


def test_points_jsonl_only_folder_and_truncated_last_line(tmp_path):
    pts = [{"steps": k, "concurrency": 2, "repeat": 0, "status": "ok", "metrics": row(k, 2, v)}
           for k, v in ((0, 100.0), (2, 180.0))]
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "points.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pts) + '{"steps": 3, "conc')
    res = load_results(folder)
    assert res.source.name == "points.jsonl"
    assert list(res.summary["steps"]) == [0, 2]
    assert recommend(res, RecommendOptions()).choices[0].steps == 2


def launch_flags(md: str) -> list[str]:
    """The flags of recommendation.md's "SGLang launch" line."""
    import re

    return re.search(r"SGLang launch: `([^`]*)`", md).group(1).split()


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_sglang_launch_line_obeys_sglangs_start_up_rule(tmp_path):
    """Batch size 1 runs best without speculation, batch size 8 at K=3: the custom config's candidate union has no 1,
    and SGLang refuses to start when --speculative-num-steps is outside it (_init_adaptive_speculative_params)."""
    folder = write_sweep(tmp_path / "r", grid({1: {0: 200, 3: 100}, 8: {0: 500, 3: 800}}))
    sweep = {"plan": {}, "backend": {"backend": "sglang", "algorithm": "EAGLE3"}}
    (folder / "sweep.json").write_text(json.dumps(sweep))
    out = tmp_path / "out"
    assert CliRunner().invoke(app, ["recommend", str(folder), "-o", str(out)]).exit_code == 0
    union = parse_sglang_adaptive_config(json.loads((out / "sglang-adaptive-custom.json").read_text())).candidate_steps
    args = launch_flags((out / "recommendation.md").read_text())
    assert int(flag(args, "--speculative-num-steps")) in union
    assert flag(args, "--speculative-algorithm") == "EAGLE3"
    assert flag(args, "--speculative-adaptive-config") == "sglang-adaptive-custom.json"


def test_best_static_flags_name_the_algorithm(tmp_path):
    folder = write_sweep(tmp_path / "r", grid(CROSSOVER))
    (folder / "sweep.json").write_text(json.dumps({"plan": {}, "backend": {"backend": "vllm", "method": "eagle3"}}))
    out = tmp_path / "out"
    assert CliRunner().invoke(app, ["recommend", str(folder), "-o", str(out)]).exit_code == 0
    args = json.loads((out / "best-static.json").read_text())["sglang_args"]
    assert flag(args, "--speculative-algorithm") == "EAGLE3"


def test_example_sweep_launch_line_is_accepted_by_sglangs_rule(tmp_path):
    """The committed smollm2-cpu sweep (bundled EAGLE-3 head): the launch line's num_steps is in the custom
    config's candidate union and the algorithm is EAGLE3."""
    example = EXAMPLES / "smollm2-cpu" / "sweep"
    out = tmp_path / "out"
    assert CliRunner().invoke(app, ["recommend", str(example), "-o", str(out)]).exit_code == 0
    union = parse_sglang_adaptive_config(json.loads((out / "sglang-adaptive-custom.json").read_text())).candidate_steps
    args = launch_flags((out / "recommendation.md").read_text())
    assert int(flag(args, "--speculative-num-steps")) in union
    assert flag(args, "--speculative-algorithm") == "EAGLE3"
    # its summary.csv: at concurrency 1 K=1 (94.6 tok/s) beats K=0 (77.7) by 1.218x [1.177, 1.262], so a vLLM schedule
    # is written and starts with K=1 at batch size 1
    schedule = parse_vllm_speculative_config(json.loads((out / "vllm-speculative-config.json").read_text()))
    assert schedule.k_for_batch_size(1) == 1


def test_slots_keyed_on_measured_batch_size(tmp_path):
    """The engine ran batches of 1, 5 and 18 requests at concurrency 1, 8 and 32 (prefills, stragglers): slot
    boundaries fall at round(sqrt(1*5)) = 2 and round(sqrt(5*18)) = 9, not at 3 and 16 as concurrency would put
    them, and recommendation.md says the slots follow the measured batch size and from which gauge."""
    measured = {1: 1.0, 8: 5.0, 32: 18.0}
    rows = [row(k, c, v, batch_size_mean=measured[c], batch_size_p50=measured[c],
                batch_size_source="vllm:num_requests_running")
            for c, by_k in CROSSOVER.items() for k, v in by_k.items()]
    folder = write_sweep(tmp_path / "r", rows)
    rec = run(folder)
    assert [(s.lower, s.upper, s.steps) for s in rec.slots] == [(1, 1, 3), (2, 8, 1), (9, None, 0)]
    assert vllm_config(rec)["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 8, 1], [9, 32, 0]]
    out = tmp_path / "out"
    assert CliRunner().invoke(app, ["recommend", str(folder), "-o", str(out)]).exit_code == 0
    md = (out / "recommendation.md").read_text()
    assert ("keyed on the engine's measured running batch size (`batch_size_mean`, from `vllm:num_requests_running`"
            in md)
    assert json.loads((out / "recommendation.json").read_text())["slot_key"] == "vllm:num_requests_running"


def test_concurrency_stays_the_key_when_a_chosen_cell_lacks_batch_size(tmp_path):
    rows = grid(CROSSOVER)
    for r in rows:
        if r["concurrency"] != 32:
            r.update(batch_size_mean=0.5 * r["concurrency"], batch_size_source="vllm:num_requests_running")
    rec = run(write_sweep(tmp_path / "r", rows))
    assert [(s.lower, s.upper) for s in rec.slots] == [(1, 2), (3, 15), (16, None)]
    assert rec.batch_size_source == "concurrency"


def test_data_parallel_sweep_is_warned(tmp_path):
    folder = write_sweep(tmp_path / "r", grid(CROSSOVER))
    sweep = {"plan": {}, "backend": {"backend": "vllm", "data_parallel_size": 2}}
    (folder / "sweep.json").write_text(json.dumps(sweep))
    rec = run(folder)
    assert any("data-parallel size 2" in w for w in rec.warnings)
