"""The memory check's host figure reads the process's own memory cgroup (as /proc/self/cgroup names it), the least
room left of it and every group above it, in cgroup v2 and v1: a fake /proc/self/cgroup and fake limit files stand
in for the kernel's, so each layout is tried on any machine."""

from __future__ import annotations

from pathlib import Path

from training.devices import memory

GIB = 1 << 30
MEMINFO = f"MemTotal: {64 * GIB // 1024} kB\nMemAvailable: {48 * GIB // 1024} kB\n"
V1_UNLIMITED = str(2**63 - 4096)  # what v1 writes for "no limit"


def layout(tmp_path: Path, proc: str, groups: dict[str, tuple[str, int]], version: str = "v2") -> tuple:
    """(meminfo, /proc/self/cgroup, cgroup root) in tmp_path: `groups` maps a group's path under the version's mount
    to (its limit file's text, its usage)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "cgroup").write_text(proc)
    root = tmp_path / "sys"
    folder, limit_name, usage_name = memory.CGROUP_FILES[version]
    for group, (limit, usage) in groups.items():
        level = root / folder / group.strip("/")
        level.mkdir(parents=True, exist_ok=True)
        (level / limit_name).write_text(limit + "\n")
        (level / usage_name).write_text(f"{usage}\n")
    return tmp_path / "meminfo", tmp_path / "cgroup", root


def test_v2_reads_the_process_group_not_the_root(tmp_path):
    """A systemd-run -p MemoryMax=2G scope: the root says "max", the process's own group holds it to 2 GiB."""
    files = layout(
        tmp_path,
        "0::/system.slice/run-u7.scope\n",
        {"/": ("max", 30 * GIB), "/system.slice": ("max", 20 * GIB), "/system.slice/run-u7.scope": (str(2 * GIB), GIB)},
    )
    available, where = memory.host_available(*files)
    assert available == GIB
    assert "system.slice/run-u7.scope" in where


def test_nested_groups_the_least_room_up_the_tree(tmp_path):
    """A SLURM job step below its job: the job's 8 GiB, mostly used by other steps, leaves less than the step's own
    limit of 16 GiB."""
    files = layout(
        tmp_path,
        "0::/slurm/uid_1000/job_42/step_0\n",
        {
            "/slurm": ("max", 0),
            "/slurm/uid_1000": ("max", 0),
            "/slurm/uid_1000/job_42": (str(8 * GIB), 7 * GIB),
            "/slurm/uid_1000/job_42/step_0": (str(16 * GIB), GIB // 2),
        },
    )
    available, where = memory.host_available(*files)
    assert available == GIB
    assert where.endswith("(slurm/uid_1000/job_42)")


def test_v1_memory_controller_line(tmp_path):
    """cgroup v1 (as on a hybrid host): the memory controller's line, among the other controllers' lines, names the
    group; its limit_in_bytes counts, "no limit" (2**63 rounded to a page) leaves the machine's figure."""
    proc = "9:name=systemd:/\n5:devices:/\n4:cpuacct,memory:/batch/job7\n1:cpu:/\n0::/\n"
    files = layout(
        tmp_path,
        proc,
        {"/": (V1_UNLIMITED, 30 * GIB), "/batch": (V1_UNLIMITED, 10 * GIB), "/batch/job7": (str(3 * GIB), GIB)},
        "v1",
    )
    assert memory.host_available(*files)[0] == 2 * GIB
    unlimited = layout(tmp_path / "free", proc, {"/": (V1_UNLIMITED, GIB), "/batch/job7": (V1_UNLIMITED, GIB)}, "v1")
    assert memory.host_available(*unlimited) == (48 * GIB, "the machine's available memory")


def test_no_limit_missing_files_and_a_container_root(tmp_path):
    """ "max" everywhere, a group whose folder is not there (a container that mounts its own group as the root: the
    root's files are its group's), no /proc/self/cgroup at all, and unreadable usage: never an error."""
    assert memory.host_available(*layout(tmp_path / "a", "0::/user.slice\n", {"/": ("max", GIB)}))[0] == 48 * GIB
    container = layout(tmp_path / "b", "0::/docker/abc123\n", {"/": (str(4 * GIB), GIB)})
    assert memory.host_available(*container)[0] == 3 * GIB
    meminfo, _, root = layout(tmp_path / "c", "", {"/": (str(4 * GIB), GIB)})
    assert memory.host_available(meminfo, tmp_path / "c" / "none", root)[0] == 3 * GIB
    broken = layout(tmp_path / "d", "0::/g\n", {"/g": (str(4 * GIB), 0)})
    (broken[2] / "g" / "memory.current").write_text("not a number\n")
    assert memory.host_available(*broken)[0] == 48 * GIB
    assert memory.host_available(*layout(tmp_path / "e", "garbage\n4:memory\n", {}))[0] == 48 * GIB


def test_this_machine():
    """The real files: a figure, and never more than the machine's available memory."""
    available, where = memory.host_available()
    assert 0 < available and where
