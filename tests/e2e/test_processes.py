"""The harness's timeout: a hung launch has every process print its Python stack, then its whole
process tree (forked children and their own children included) is killed, none left orphaned."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from .processes import run_tree

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
