"""Metrics: folding the shim's stats lines exactly once, the counters state, the textfile."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from runc_guard.cli import cli
from runc_guard.node import metrics
from runc_guard.node.metrics import (
    Family,
    apply_delete_line,
    fold,
    fold_stats,
    load_state,
    new_state,
    record_sweep,
    render,
    write_textfile,
)
from tests.hermetic import own_env, own_roots

NOW = 1_000_000.0


def line(outcome: str = "removed", waited_ms: int = 40, removed: int = 12, killed: int = 0) -> str:
    return json.dumps({"time": 1.0, "outcome": outcome, "waited_ms": waited_ms,
                       "removed": removed, "killed": killed}) + "\n"


@pytest.fixture
def stats(tmp_path: Path) -> Path:
    return tmp_path / "run" / "deletes.jsonl"


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "run" / "metrics-state.json"


def append(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(text)


def deletes(state_file: Path) -> dict[str, int]:
    return dict(load_state(str(state_file))["deletes"])


def test_apply_delete_line_buckets_and_sums() -> None:
    """A line lands in the first bucket whose bound is >= its wait; sums and counters add up."""
    state = new_state()
    assert apply_delete_line(state, line(waited_ms=5).encode())
    assert apply_delete_line(state, line(waited_ms=2500, removed=3, killed=2).encode())
    assert apply_delete_line(state, line("deadline", waited_ms=60_000).encode())
    buckets = state["delete_wait_buckets"]
    assert buckets[metrics.WAIT_BUCKETS.index(0.005)] == 1
    assert buckets[metrics.WAIT_BUCKETS.index(3.0)] == 1
    assert buckets[-1] == 1  # +Inf only
    assert state["delete_wait_sum"] == pytest.approx(62.505)
    assert state["deletes"] == {"removed": 2, "deadline": 1}
    assert (state["delete_dirs_removed"], state["delete_killed"]) == (27, 2)


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"[]", b'{"outcome": "removed"}', b'{"outcome": 1, "waited_ms": 1, "removed": 1}',
     b'{"outcome": "x", "waited_ms": -5, "removed": 1}'],
)
def test_invalid_lines_are_counted_not_applied(raw: bytes) -> None:
    """A line the shim did not write changes no counter but invalid_lines."""
    state = new_state()
    assert not apply_delete_line(state, raw)
    assert state["invalid_lines"] == 1 and state["deletes"] == {}


def test_outcome_label_is_sanitised() -> None:
    """An outcome that is not a plain word is counted as 'other' (label values stay tame)."""
    state = new_state()
    apply_delete_line(state, line('x"}\n').encode())
    assert state["deletes"] == {"other": 1}


def test_fold_counts_each_line_exactly_once(stats: Path, state_file: Path) -> None:
    """Folding twice counts nothing twice; new lines are added; a partial line waits for its end."""
    append(stats, line() + line("deadline"))
    assert fold(str(stats), str(state_file), NOW).lines == 2
    assert fold(str(stats), str(state_file), NOW).lines == 0
    append(stats, line() + '{"time": 2, "outc')
    fold(str(stats), str(state_file), NOW)
    assert deletes(state_file) == {"removed": 2, "deadline": 1}
    append(stats, 'ome": "removed", "waited_ms": 1, "removed": 1}\n')
    fold(str(stats), str(state_file), NOW)
    assert deletes(state_file) == {"removed": 3, "deadline": 1}
    assert load_state(str(state_file))["invalid_lines"] == 0


def test_crash_before_save_does_not_lose_or_double(stats: Path, state_file: Path) -> None:
    """Folding into memory without saving (a crash) leaves the next fold to count the lines once."""
    append(stats, line() * 3)
    unsaved = load_state(str(state_file))
    fold_stats(unsaved, str(stats), NOW)  # never saved
    fold(str(stats), str(state_file), NOW)
    assert deletes(state_file) == {"removed": 3}


def test_rotation_keeps_late_writers_and_retires_quietly(
    stats: Path, state_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large stats file is renamed; a shim still writing to it is counted; once quiet it is deleted."""
    monkeypatch.setattr(metrics, "ROTATE_BYTES", 200)
    append(stats, line() * 5)
    with open(stats, "a") as late_writer:  # a shim that opened the file before the rotation
        result = fold(str(stats), str(state_file), NOW)
        assert result.rotated and not stats.exists()
        rotated = Path(str(stats) + ".1")
        late_writer.write(line("deadline"))
    append(stats, line("already_gone"))  # a new shim creates a new file
    fold(str(stats), str(state_file), NOW)
    assert deletes(state_file) == {"removed": 5, "deadline": 1, "already_gone": 1}
    assert rotated.exists()  # written just now: not retired yet
    os.utime(rotated, (NOW - 120, NOW - 120))
    result = fold(str(stats), str(state_file), NOW)
    assert result.unlink_after_save == str(rotated) and not rotated.exists()
    append(stats, line())
    fold(str(stats), str(state_file), NOW)
    assert deletes(state_file) == {"removed": 6, "deadline": 1, "already_gone": 1}


def test_retired_file_left_by_a_crash_is_not_counted_again(stats: Path, state_file: Path) -> None:
    """If we died between saving 'retired' and unlinking, the next fold deletes it unread."""
    append(stats, line() * 2)
    fold(str(stats), str(state_file), NOW)
    rotated = Path(str(stats) + ".1")
    os.rename(stats, rotated)
    st = os.stat(rotated)
    saved = load_state(str(state_file))
    saved["retired"] = f"{st.st_dev}:{st.st_ino}"
    saved["offsets"] = {}
    state_file.write_text(json.dumps(saved))
    fold(str(stats), str(state_file), NOW)
    assert not rotated.exists()
    assert deletes(state_file) == {"removed": 2}


def test_truncated_stats_file_starts_over(stats: Path, state_file: Path) -> None:
    """A stats file truncated by someone is read from its start again."""
    append(stats, line() * 3)
    fold(str(stats), str(state_file), NOW)
    with open(stats, "w") as f:
        f.write(line("deadline"))
    fold(str(stats), str(state_file), NOW)
    assert deletes(state_file) == {"removed": 3, "deadline": 1}


def test_record_sweep_accumulates(state_file: Path) -> None:
    """Sweep figures add up across runs; the last-run gauges are replaced."""
    report = {"removed": 10, "dirs_removed": 100, "errors": ["x"], "records_cleared": 2,
              "slowed": 1.5, "kept": {"populated": 3}, "duration": 12.5}
    metrics.add_sweep(str(state_file), report, NOW)
    metrics.add_sweep(str(state_file), dict(report, duration=3.0), NOW + 60)
    sweep = load_state(str(state_file))["sweep"]
    assert (sweep["runs"], sweep["containers_removed"], sweep["dirs_removed"]) == (2, 20, 200)
    assert (sweep["errors"], sweep["records_cleared"], sweep["kept"]) == (2, 4, {"populated": 6})
    assert (sweep["last_timestamp"], sweep["last_duration"]) == (NOW + 60, 3.0)


def test_render_is_valid_prometheus_text() -> None:
    """prometheus-client's exposition parses back; histogram is cumulative with +Inf = count."""
    state = new_state()
    for waited in (1, 30, 30, 700, 99_000):
        apply_delete_line(state, line(waited_ms=waited).encode())
    record_sweep(state, {"removed": 1, "dirs_removed": 10, "errors": [], "records_cleared": 0,
                         "slowed": 0.0, "kept": {"bundle": 2}, "duration": 1.0}, NOW)
    text = render(state, [
        Family.one("runc_guard_leaked_containers", "Leaked.", 7),
        Family.one("runc_guard_runtime_info", "Runtime.", 1, path="/usr/sbin/runc", version='a "q"'),
    ])
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    assert families["runc_guard_delete_wait_seconds"].type == "histogram"
    assert samples[("runc_guard_delete_wait_seconds_bucket", (("le", "0.005"),))] == 1
    assert samples[("runc_guard_delete_wait_seconds_bucket", (("le", "0.05"),))] == 3
    assert samples[("runc_guard_delete_wait_seconds_bucket", (("le", "1.0"),))] == 4
    assert samples[("runc_guard_delete_wait_seconds_bucket", (("le", "+Inf"),))] == 5
    assert samples[("runc_guard_delete_wait_seconds_count", ())] == 5
    assert samples[("runc_guard_deletes_total", (("outcome", "removed"),))] == 5
    assert samples[("runc_guard_deletes_total", (("outcome", "deadline"),))] == 0
    assert samples[("runc_guard_sweep_kept_total", (("reason", "bundle"),))] == 2
    assert samples[("runc_guard_leaked_containers", ())] == 7
    assert samples[("runc_guard_runtime_info", (("path", "/usr/sbin/runc"), ("version", 'a "q"')))] == 1
    assert samples[("runc_guard_sweep_states_redriven_total", ())] == 0
    assert families["runc_guard_deletes"].type == "counter"


def test_reclaimed_memory_and_memcgs_left_charged_are_counted() -> None:
    """A delete's stats line and a sweep's report name the KiB reclaimed and the memcgs left charged."""
    state = new_state()
    reclaimed = json.loads(line())
    reclaimed.update(reclaimed_kb=1024, memcg_left=0)
    left = json.loads(line())
    left.update(reclaimed_kb=0, memcg_left=2)
    for doc in (reclaimed, left, json.loads(line())):  # a line of a version that had neither
        assert apply_delete_line(state, json.dumps(doc).encode())
    record_sweep(state, {"removed": 1, "dirs_removed": 10, "errors": [], "records_cleared": 0, "slowed": 0.0,
                         "kept": {}, "duration": 1.0, "memcg_reclaimed_kb": 1024, "memcg_left": 1}, NOW)
    families = {f.name: f for f in text_string_to_metric_families(render(state, []))}
    values = {s.name: s.value for f in families.values() for s in f.samples}
    assert values["runc_guard_memcg_reclaimed_bytes_total"] == 2 * 1024 * 1024
    assert values["runc_guard_memcg_left_charged_total"] == 3


def test_textfile_written_atomically(tmp_path: Path) -> None:
    """The textfile is replaced by rename (a reader keeps the old one), world-readable, no temp left."""
    path = tmp_path / "textfile" / "runc_guard.prom"
    write_textfile(str(path), new_state(), [Family.one("a", "A.", 1)])
    first = path.read_text()
    with open(path) as reader:
        write_textfile(str(path), new_state(), [Family.one("a", "A.", 2)])
        assert reader.read() == first
    assert "\na 1.0\n" in first and "\na 2.0\n" in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(path.parent) == ["runc_guard.prom"]


def test_cli_metrics_folds_and_prints(tmp_path: Path) -> None:
    """`runc-guardctl metrics` folds the stats file and prints the exposition with audit gauges."""
    stats_file = tmp_path / "run" / "deletes.jsonl"
    append(stats_file, line() + line("deadline", waited_ms=3100))
    env = own_env(tmp_path, RUNC_GUARD_STATS_FILE=str(stats_file))
    args = ["metrics", "--kubepods", "rgsweep-absent-tree", *own_roots(tmp_path)]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    samples = {s.name + str(sorted(s.labels.items())): s.value
               for f in text_string_to_metric_families(result.output) for s in f.samples}
    assert samples["runc_guard_deletes_total[('outcome', 'deadline')]"] == 1
    assert samples["runc_guard_leaked_containers[]"] == 0
    assert samples["runc_guard_audit_ok[]"] == 1
    out = tmp_path / "prom" / "runc_guard.prom"
    result = CliRunner().invoke(cli, [*args, "--output", str(out)], env=env)
    assert result.exit_code == 0
    assert "runc_guard_deletes_total{outcome=\"deadline\"} 1" in out.read_text()


def test_invalid_settings_still_write_metrics(tmp_path: Path) -> None:
    """A broken settings file: metrics still come out with runc_guard_config_valid 0 (what alerts on it)
    and the audit's gauges; audit reports it as an NPD problem and writes its metrics file too.
    Its roots and pending records are its own (issue 31: the host's flipped leaked_containers to 1)."""
    config = tmp_path / "config.toml"
    config.write_text("delete_timeout = 'soon'\n")
    env = own_env(tmp_path, RUNC_GUARD_CONFIG=str(config))
    where = ["--kubepods", "rgsweep-absent-tree", *own_roots(tmp_path)]
    result = CliRunner().invoke(cli, ["metrics", *where], env=env)
    assert result.exit_code == 0, result.output
    samples = {s.name: s.value for f in text_string_to_metric_families(result.output) for s in f.samples}
    assert samples["runc_guard_config_valid"] == 0
    assert samples["runc_guard_leaked_containers"] == 0  # the audit ran with the valid keys
    assert samples["runc_guard_deletes_total"] == 0
    out = tmp_path / "prom" / "runc_guard.prom"
    args = ["audit", *where, "--metrics-file", str(out)]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 1 and "invalid settings" in result.output
    assert "runc_guard_config_valid 0.0" in out.read_text()
    assert (tmp_path / "run" / "metrics-state.json").exists()  # the fallback honours RUNC_GUARD_STATS_FILE


def test_metrics_module_imports_no_exposition_library() -> None:
    """Importing node.metrics (as audit and sweep do) loads prometheus-client only when rendering."""
    import subprocess
    import sys

    code = (
        "import sys, runc_guard.node.metrics, runc_guard.node.audit;"
        " print('prometheus_client' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
