"""The runtime image: built by images/build.sh, it serves the gateway as uid 10001 and carries no Pulumi.

These tests build the image (a Debian base from debootstrap, so no registry is needed) and run its command with
``buildah run --isolation chroot`` on the host network: a simulator on the host, the gateway in the image, and
the real ``openai`` client in front. They need root, buildah, podman and debootstrap, and skip without them.
``make test`` deselects them (``-m "not image"``); ``make test-images`` runs them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from fleet.protocol import contract
from fleet.protocol.promtext import counter_value, parse
from llmfleet.local.procs import descendants
from tests.gateway.conftest import sim_args
from tests.support.procs import Procs
from tests.support.stacks import KEYS, MODEL, write_stack
from tests.support.wait import wait_for

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = ROOT / ".build" / "images"  # images/build.sh's default: a later build reuses the cached base
UID = 10001  # the image's USER
BUILD_TIMEOUT_S = 900.0  # a cold build (debootstrap, then pip) takes about 1.5 min here
TOOLS = ("buildah", "podman", "debootstrap")
_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")
_ADMIN = re.compile(r"admin \(readiness, metrics\) on (http://127\.0\.0\.1:\d+)")


def _why_not() -> str | None:
    """Why this machine cannot build and run the image, or None when it can."""
    if os.geteuid() != 0:
        return "building and running the image needs root (buildah's chroot isolation)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found (apt-get install -y buildah podman debootstrap)"
    return None


@pytest.fixture(scope="session")
def runtime_image() -> str:
    """The runtime image built from this checkout, once per test run: its image id."""
    reason = _why_not()
    if reason is not None:
        pytest.skip(reason)
    build = subprocess.run(
        [str(ROOT / "images" / "build.sh"), "runtime"],
        cwd=ROOT,
        env={**os.environ, "BUILD_DIR": str(BUILD_DIR)},
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    if build.returncode != 0:
        pytest.fail(f"images/build.sh runtime exited with {build.returncode}:\n{build.stdout}\n{build.stderr}")
    assert re.search(r"digest sha256:[0-9a-f]{64}", build.stdout), build.stdout
    return (BUILD_DIR / "runtime.iid").read_text().strip()


@pytest.fixture(scope="module")
def container(runtime_image: str) -> Iterator[str]:
    """A working container of the runtime image (buildah's, for `buildah run`); removed afterwards."""
    name = subprocess.run(
        ["buildah", "from", "--pull-never", runtime_image], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        yield name
    finally:
        subprocess.run(["buildah", "rm", name], capture_output=True, check=False)


def _buildah_run(container: str, argv: list[str], volumes: dict[Path, str] | None = None) -> list[str]:
    """The command line that runs ``argv`` in ``container`` as the image's user, on the host network."""
    mounts = [f"--volume={host}:{inside}:ro" for host, inside in (volumes or {}).items()]
    return ["buildah", "run", "--isolation", "chroot", "--network", "host", *mounts, container, "--", *argv]


@contextlib.contextmanager
def _running(command: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``command`` in a session of its own, output to ``log``; its whole group is killed on exit (buildah runs
    the image's process in buildah's own process group)."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield process
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def _uids_of(pid: int) -> set[int]:
    """The real, effective, saved and filesystem uids of ``pid`` (the ``Uid:`` line of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return {int(uid) for uid in line.split()[1:]}
    raise AssertionError(f"no Uid line for pid {pid}")


def _gateway_pids(buildah_pid: int) -> list[int]:
    """The image's Python processes running ``llmfleet gateway`` below ``buildah run``."""
    found = []
    for pid in descendants(buildah_pid):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if argv[0].endswith(b"/python3") and b"gateway" in argv:
                found.append(pid)
    return found


def test_the_gateway_in_the_image_serves_a_chat_completion_from_a_host_simulator_as_uid_10001(
    container: str, procs: Procs, tmp_path: Path
) -> None:
    sim = procs.start(sim_args(), name="sim")
    sim.wait_url("API server")
    # The stack file where a pod finds its ConfigMap, readable by the image's user.
    stacks = tmp_path / "stacks"
    stacks.mkdir(mode=0o755)
    write_stack(stacks / "Pulumi.test.yaml", "gateway").chmod(0o644)
    argv = ["llmfleet", "gateway", "--stack", contract.stack_file_path("test"), "--port", "0", "--replica", sim.url]
    log = tmp_path / "gateway-in-image.log"
    with _running(_buildah_run(container, argv, {stacks: contract.STACKS_DIR}), log) as gateway:

        def listening() -> str | None:
            if gateway.poll() is not None:
                raise AssertionError(f"the gateway in the image exited with {gateway.returncode}:\n{log.read_text()}")
            match = _LISTENING.search(log.read_text())
            return match.group(1) if match else None

        url = wait_for(listening, timeout_s=60, what="the gateway in the image to listen", diagnostics=log.read_text)
        found = _ADMIN.search(log.read_text())
        assert found, log.read_text()  # printed before the public listener's line
        admin = found.group(1)
        wait_for(
            lambda: httpx.get(f"{admin}/readyz", timeout=1.0, trust_env=False).status_code == 200,
            timeout_s=30,
            what=f"{admin}/readyz -> 200",
            diagnostics=log.read_text,
        )

        pids = _gateway_pids(gateway.pid)
        assert pids, f"no gateway process below buildah run (pid {gateway.pid})"
        assert {pid: _uids_of(pid) for pid in pids} == {pid: {UID} for pid in pids}

        with openai.OpenAI(base_url=f"{url}/v1", api_key=KEYS["gold"], max_retries=0, timeout=30) as client:
            chat = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hello from the image"}], max_tokens=5
            )
        assert chat.model == MODEL
        assert chat.choices[0].message.content
        assert chat.usage is not None and chat.usage.completion_tokens == 5
        # The simulator on the host served it: the gateway in the image reached the host's loopback.
        wait_for(
            lambda: counter_value(parse(sim.get("/metrics").text), "vllm:request_success") >= 1,
            timeout_s=10,
            what="the simulator to count the request",
            diagnostics=sim.tail,
        )


def test_commands_in_the_image_run_as_uid_and_gid_10001(container: str) -> None:
    result = subprocess.run(
        _buildah_run(container, ["python3", "-c", "import os; print(os.getuid(), os.getgid())"]),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.split() == [str(UID), str(UID)]


ABSENT = [
    pytest.param(["python3", "-c", "import pulumi"], "No module named 'pulumi'", id="pulumi"),
    pytest.param(["python3", "-m", "pip", "--version"], "No module named pip", id="pip"),
    pytest.param(["python3", "-m", "ensurepip", "--root", "/tmp/ensurepip"], "FileNotFoundError", id="ensurepip"),
]


@pytest.mark.parametrize(("argv", "error"), ABSENT)
def test_the_image_has_neither_pulumi_nor_an_installer(container: str, argv: list[str], error: str) -> None:
    result = subprocess.run(_buildah_run(container, argv), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
    assert error in result.stderr
