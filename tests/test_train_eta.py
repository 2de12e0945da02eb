"""train.py's ETA against a plain count of what the run will still do: the steps left and the dev evaluations left
(every --eval-every steps and the last step), each evaluation as long as those so far; and train_loop's log line
on a fake clock, where a step takes 1 s and an evaluation 10 s."""
import types

import pytest

import train


def plain_eta(step, total, eval_every, per_step, per_eval):
    """The oracle: walk the steps still to come; the evaluation at `step` itself is still to come at its log line."""
    evals = sum(1 for k in range(step, total + 1) if k % eval_every == 0 or k == total)
    return (total - step) * per_step + evals * per_eval


@pytest.mark.parametrize("total, eval_every", [(1079, 50), (300, 50), (10, 3), (7, 7), (5, 50), (1, 1), (68, 50)])
def test_eta_counts_the_steps_and_the_evaluations_left(total, eval_every):
    for step in range(1, total + 1):
        got = train.eta_seconds(step, total, eval_every, 0.7, 30.0)
        assert got == pytest.approx(plain_eta(step, total, eval_every, 0.7, 30.0)), step


def test_eta_at_step_1_of_the_leaderboards_sg_opt_run():
    """The issue's run: 1,079 steps, dev every 50: at step 1 the steps alone said 6.8 min, and the run took 21.2; 22
    evaluations are still to come (50, 100, ..., 1050 and the last step), at ~39 s each what the 14.4 minutes held."""
    per_step, per_eval = 6.8 * 60 / 1078, 39.0
    assert train.eta_seconds(1, 1079, 50, per_step, 0.0) == pytest.approx(6.8 * 60)
    assert train.eta_seconds(1, 1079, 50, per_step, per_eval) == pytest.approx(6.8 * 60 + 22 * per_eval)


class Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_train_loops_log_line_gives_the_eta_of_the_steps_and_evaluations(monkeypatch, capsys):
    clock = Clock()
    cfg = types.SimpleNamespace(overfit_batch=False, log_every=2, eval_every=3, batch_size=4, early_stop="code",
                                patience=0)
    one = types.SimpleNamespace(item=lambda: 1.0)

    def step(*_):
        clock.now += 1.0  # a training step: 1 s
        return one, one, one, 1e-5
    run = types.SimpleNamespace(cfg=cfg, total=7, rank=0, world=1, device=types.SimpleNamespace(type="cpu"),
                                step=step)  # Run.step: the batch's training step

    def evaluation(*_):
        clock.now += 10.0  # a dev evaluation: 10 s
        return None

    monkeypatch.setattr(train, "time", types.SimpleNamespace(perf_counter=clock.perf_counter, time=lambda: 0.0))
    monkeypatch.setattr(train, "batches", lambda run: iter([(["a"], ["a"])] * 100))
    monkeypatch.setattr(train, "evaluation", evaluation)
    stop, stats = train.train_loop(run, keeper=None)
    assert stop is None and stats["eval_seconds"] == [10.0, 10.0, 10.0, 10.0]  # steps 0, 3, 6 and the last, 7
    etas = {int(line.split()[1].split("/")[0]): float(line.split("ETA ")[1].split()[0])
            for line in capsys.readouterr().out.splitlines() if line.startswith("step ")}
    assert set(etas) == {1, 2, 4, 6, 7}
    for s, eta in etas.items():  # the log line prints minutes to 0.1
        assert eta == pytest.approx(plain_eta(s, 7, 3, 1.0, 10.0) / 60, abs=0.05), s
    assert etas[1] == pytest.approx((6 + 3 * 10) / 60, abs=0.05)  # 6 steps and the evaluations at 3, 6 and 7
