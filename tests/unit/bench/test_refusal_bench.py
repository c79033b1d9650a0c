"""bench/refusal.py: each mode's server answers as it says (served: OK; limiter, abort,
set_code and the door: RESOURCE_EXHAUSTED, each with its own message), the table gives each
mode's ratio to the limiter's, and a bad flag is one line and exit 2."""

from __future__ import annotations

import pytest

from textserve.bench import refusal
from textserve.service.door import COUNT_MESSAGE


def test_every_mode_answers_as_it_says() -> None:
    runs = refusal.measure(refusal.MODES, calls=64, rounds=1)
    by_mode = {run["mode"]: run for run in runs}
    assert set(by_mode) == set(refusal.MODES)
    assert by_mode["served"]["codes"] == {"OK": 64}
    for mode in ("limiter", "abort", "set_code", "door"):
        assert by_mode[mode]["codes"] == {"RESOURCE_EXHAUSTED": 64}, mode
    assert by_mode["limiter"]["details"] == ["Concurrent RPC limit exceeded!"]
    assert by_mode["abort"]["details"] == by_mode["set_code"]["details"] == [refusal.REFUSED]
    assert by_mode["door"]["details"] == [COUNT_MESSAGE.format(n=0)]  # textserve's own guard
    assert all(run["server_cpu_us"] > 0 for run in runs)


def test_the_table_gives_each_mode_against_the_limiter() -> None:
    runs = [
        {"mode": "limiter", "server_cpu_us": 200.0},
        {"mode": "door", "server_cpu_us": 220.0},
        {"mode": "door", "server_cpu_us": 240.0},
        {"mode": "door", "server_cpu_us": 230.0},
    ]
    rows = {row["mode"]: row for row in refusal.summarize(runs)}
    assert rows["door"]["server_cpu_us"] == 230.0 and rows["door"]["vs_limiter"] == 1.15
    table = refusal.format_table(list(rows.values()), {"cpu_model": "x", "logical_cpus": 2})
    assert "| door | 230 | 1.15× | 220, 240, 230 |" in table


@pytest.mark.parametrize("argv", [["--modes", "nope"], ["--calls", "0"], ["--server-cpus", "x"]])
def test_a_bad_flag_is_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        refusal.main(argv)
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"error: argument {argv[0]}" in last
