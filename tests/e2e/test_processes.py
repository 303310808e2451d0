"""The harness's timeout: a hung launch has every process print its Python stack, then its whole
process tree (forked children and their own children included) is killed, none left orphaned."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from .harness import Scenario, _config
from .processes import ForkServer, living_members, run_tree, wait_tree

HANGING_TREE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    from processes import dump_stacks_on_signal

    def wait_in_the_child_forever():
        time.sleep(3600)

    dump_stacks_on_signal(__import__("pathlib").Path(sys.argv[2]))
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    child = os.fork()
    if child == 0:
        wait_in_the_child_forever()
    with open(sys.argv[3], "w") as pids:
        pids.write(f"{os.getpid()} {child} {grandchild.pid}")
    os.waitpid(child, 0)  # the launch hangs here, as a rank waits on a hung worker
    """
)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit status may not have been collected yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    try:
        return "State:\tZ" not in status.read_text()
    except FileNotFoundError:
        return False


def test_a_hung_launch_prints_each_process_stack_and_its_whole_tree_is_killed(tmp_path: Path) -> None:
    script, pids = tmp_path / "hang.py", tmp_path / "pids.txt"
    script.write_text(HANGING_TREE)
    command = [sys.executable, str(script), str(Path(__file__).parent), str(tmp_path), str(pids)]

    with pytest.raises(AssertionError) as hung:
        run_tree(command, tmp_path / "hang.log", tmp_path, timeout=5, what="the hanging tree")

    message = str(hung.value)
    assert "the hanging tree hung for 5 s" in message
    assert "in <module>" in message, "the launched process's stack (waiting for its child)"
    assert "wait_in_the_child_forever" in message, "the forked child's stack"
    launched, child, grandchild = (int(pid) for pid in pids.read_text().split())
    assert not [pid for pid in (launched, child, grandchild) if _running(pid)], "no process of the tree is left"


def test_a_hung_run_from_the_fork_server_prints_each_ranks_stack_is_killed_whole_and_the_server_goes_on(
    tmp_path: Path,
) -> None:
    """Rank 1 hangs in its training step (rank 0 then waits in the gradients' all-reduce): the whole run
    is killed with both ranks' stacks, and the same server then runs a run to its end."""
    server = ForkServer(tmp_path / "server.log")
    try:
        config = _config(Scenario(world_size=2, num_workers=2), "full", tmp_path, tmp_path / "x.ckpt", 2)
        (tmp_path / "hang.json").write_text(json.dumps({**config, "hang_rank": 1}))
        leader = server.launch(tmp_path / "hang.json", 2, tmp_path / "hang.log", tmp_path)
        with pytest.raises(AssertionError) as hung:
            wait_tree(leader, 15, "the hanging run", tmp_path, tmp_path / "hang.log")  # type: ignore[arg-type]
        message = str(hung.value)
        assert "the hanging run hung for 15 s" in message
        assert "in hang_forever" in message, "rank 1's stack"
        assert message.count("--- process") >= 2, "a stack from each rank"
        native = message.split("--- native stacks ---")[1]
        assert "(py-spy) ---" in native and "hang_forever" in native, "each process's native stack, Python frames too"
        assert "hang_forever" in (tmp_path / "native-stacks.txt").read_text(), "kept in a file too"
        assert living_members(leader.pid) == [], "no process of the run is left"

        done = tmp_path / "done"
        done.mkdir()
        config = _config(Scenario(world_size=2), "full", done, done / "x.ckpt", 2)
        (done / "full.json").write_text(json.dumps(config))
        assert server.run(done / "full.json", 2, done / "full.log", done, 120, "the next run") == 0
        assert (done / "full.rank1.jsonl").read_text().count("\n") == Scenario(world_size=2).batches_per_epoch * 3
    finally:
        server.close()
