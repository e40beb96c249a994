"""Local agents' state: the agents a local actuator launched, on disk, so that the next control plane adopts them.

    <state dir>/local-agents.json   {"format": 1, "next_id": N,
                                     "agents": [{"replica", "pool", "pid", "agent_port", "engine_port"}, ...]}

The actuator rewrites it (atomically, `control_plane.statefile`) whenever it launches or forgets an agent. Agents
run in sessions of their own, so they outlive a control plane that is killed; the next one reads the file and
adopts an entry (`check`) only when

1. the pid is alive (a zombie is not), and
2. that process is an llmfleet agent started with this entry's ``--replica`` and ``--port`` (its command line:
   ``/proc/<pid>/cmdline``, or ``ps`` where there is no ``/proc``), so a pid the system gave to another process
   is never taken for the agent.

Entries failing either are dropped and their pids left alone. `answers` then asks the agent's ``GET /status``
for the same replica id. One that matches by command line but does not answer is adopted all the same: it is
unmistakably ours and, unmanaged, would never be stopped; until it reports, the loop counts it as a replica
whose load is unknown.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from control_plane.statefile import StateFileError, read_json, write_json

__all__ = ["AgentRecord", "AgentStateFile", "answers", "check", "pid_alive", "process_argv"]

FILE = "local-agents.json"


@dataclass(frozen=True)
class AgentRecord:
    """One launched agent as the state file keeps it."""

    replica: str
    pool: str
    pid: int
    agent_port: int
    engine_port: int

    @property
    def agent_url(self) -> str:
        return f"http://127.0.0.1:{self.agent_port}"

    @property
    def engine_url(self) -> str:
        return f"http://127.0.0.1:{self.engine_port}"


class AgentStateFile:
    """Reads and writes ``<state dir>/local-agents.json``."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE

    def load(self) -> tuple[list[AgentRecord], int]:
        """The recorded agents and the next replica number; ([], 1) without a file. StateFileError when the file
        is not a readable agents file."""
        doc: Any = read_json(self.path)
        if doc is None:
            return [], 1
        try:
            if doc["format"] != 1:
                raise ValueError(f"format {doc['format']!r}")
            records = [AgentRecord(**entry) for entry in doc["agents"]]
            return records, int(doc["next_id"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StateFileError(f"{self.path}: not a local agents file ({exc}); move it away to start") from exc

    def save(self, records: list[AgentRecord], next_id: int) -> None:
        agents = [asdict(r) for r in sorted(records, key=lambda r: r.replica)]
        write_json(self.path, {"format": 1, "next_id": next_id, "agents": agents})


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rfind(")") + 2] != "Z"
    return True


def process_argv(pid: int) -> list[str] | None:
    """The command line of ``pid``; None when it cannot be read (gone, or not ours to see)."""
    proc = Path("/proc")
    if proc.is_dir():
        try:
            raw = (proc / str(pid) / "cmdline").read_bytes()
        except OSError:
            return None
        return [part.decode(errors="replace") for part in raw.split(b"\0") if part] or None
    listing = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True, check=False)
    return listing.stdout.split() or None


def _has(argv: list[str], flag: str, value: str) -> bool:
    return any(a == flag and b == value for a, b in zip(argv, argv[1:], strict=False)) or f"{flag}={value}" in argv


def check(record: AgentRecord) -> bool:
    """Conditions 1 and 2 of the module docstring: ``record``'s pid is alive and is that agent."""
    if not pid_alive(record.pid):
        return False
    argv = process_argv(record.pid)
    if argv is None or "agent" not in argv:
        return False
    return _has(argv, "--replica", record.replica) and _has(argv, "--port", str(record.agent_port))


async def answers(record: AgentRecord, http: httpx.AsyncClient) -> bool:
    """Whether the agent answers ``GET /status`` on its port with its own replica id."""
    try:
        response = await http.get(f"{record.agent_url}/status")
        return response.status_code == 200 and response.json().get("replica") == record.replica
    except (httpx.HTTPError, ValueError, AttributeError):
        return False
