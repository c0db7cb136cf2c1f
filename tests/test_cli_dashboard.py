"""``kvlab dashboard``: argument errors, the page it writes and the Voilà command it runs (no server started)."""

from __future__ import annotations

import importlib
import io
import json
import signal
import socket
import sys
from pathlib import Path

import nbformat
import pytest

from kvlab.cli import main
from kvlab.cli.dashboard import (
    CULL_IDLE_S,
    TEMPLATE_NAME,
    check_listen,
    dashboard_url,
    trace_argument,
    voila_argv,
    voila_env,
    write_page,
)
from kvlab.traces import load_trace

cli_dashboard = importlib.import_module("kvlab.cli.dashboard")

GOOD = (b'{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]}\n'
        b'{"timestamp": 10, "input_length": 1536, "output_length": 5, "hash_ids": [1, 2, 3]}\n')
BAD = b'{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]}\n{"timestamp": 10}\n'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_voila_argv_serves_the_page_at_that_address_only() -> None:
    argv = voila_argv(Path("/tmp/x/kvlab-dashboard.ipynb"), port=8123, ip="127.0.0.1", open_browser=False,
                      python="/venv/bin/python")
    assert argv == ["/venv/bin/python", "-m", "voila", "/tmp/x/kvlab-dashboard.ipynb", "--port=8123",
                    "--Voila.ip=127.0.0.1", "--Voila.connection_dir_root=/tmp/x", "--Voila.port_retries=0",
                    "--preheat_kernel=True", "--strip_sources=True", "--theme=light", f"--template={TEMPLATE_NAME}",
                    f"--MappingKernelManager.cull_idle_timeout={CULL_IDLE_S}",
                    "--MappingKernelManager.cull_interval=60", "--no-browser"]
    opened = voila_argv(Path("nb.ipynb"), port=1, ip="0.0.0.0", open_browser=True)
    assert opened[0] == sys.executable and "--no-browser" not in opened


def test_write_page_one_cell_and_the_template(tmp_path: Path) -> None:
    notebook = write_page(tmp_path, "/data/my trace.jsonl")
    assert notebook == tmp_path / "kvlab-dashboard.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    (cell,) = nb.cells
    assert cell.cell_type == "code"
    assert cell.source.splitlines() == ["from kvlab.ui.dashboard import Dashboard, prepare_page", "",
                                        "prepare_page()  # the Vega libraries from the kernel, before the page asks: "
                                        "no internet needed", "Dashboard('/data/my trace.jsonl')"]
    template = tmp_path / "share" / "jupyter" / "voila" / "templates" / TEMPLATE_NAME
    assert json.loads((template / "conf.json").read_text()) == {"base_template": "lab"}
    text = (template / "index.html.j2").read_text()
    assert text.startswith("{%- extends 'voila/templates/lab/index.html.j2' -%}")
    assert "'cdn.jsdelivr.net' not in line" in text and "--jp-widgets-font-size: 16px" in text


def test_voila_env_puts_the_template_first_on_jupyter_path(tmp_path: Path) -> None:
    env = voila_env(tmp_path, {"JUPYTER_PATH": "/a:/b", "HOME": "/root"})
    assert env == {"JUPYTER_PATH": f"{tmp_path}/share/jupyter:/a:/b", "HOME": "/root"}
    assert voila_env(tmp_path, {})["JUPYTER_PATH"] == f"{tmp_path}/share/jupyter"


def test_trace_argument_resolves_as_the_other_commands(tmp_path: Path, monkeypatch) -> None:
    assert trace_argument("synthetic", tmp_path) == "synthetic"
    (tmp_path / "t.jsonl").write_bytes(GOOD)
    monkeypatch.chdir(tmp_path)
    assert trace_argument("t.jsonl", tmp_path) == str(tmp_path / "t.jsonl")  # absolute: the kernel runs elsewhere
    saved = trace_argument("-", tmp_path, stdin=io.BytesIO(GOOD))
    assert saved == str(tmp_path / "stdin.parquet")
    assert load_trace(saved).frame["input_tokens"].to_list() == [1024, 1536]


def test_dashboard_url() -> None:
    assert dashboard_url("127.0.0.1", 8866) == "http://127.0.0.1:8866/"
    assert dashboard_url("::1", 80) == "http://[::1]:80/"
    assert dashboard_url("0.0.0.0", 8866) == f"http://{socket.gethostname()}:8866/"


def test_check_listen_refuses_a_port_in_use_and_a_foreign_address() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match=f"--ip 127.0.0.1 --port {port}: cannot listen there "
                                             r"\(Address already in use\); pick another --port"):
            check_listen("127.0.0.1", port)
    with pytest.raises(ValueError, match="--ip 203.0.113.7 --port 8866: cannot listen there"):
        check_listen("203.0.113.7", 8866)  # TEST-NET-3: not an address of this machine
    with pytest.raises(ValueError, match="--ip no.such.host.invalid: not an address of this machine"):
        check_listen("no.such.host.invalid", 8866)


@pytest.mark.parametrize(("argv", "message"), [
    (["nope.jsonl"], "kvlab: error: no trace file at nope.jsonl "
     "(bundled traces: azure-conv, claude-code, conversation, ragpulse, splitwise-conv, synthetic)"),
    (["bad.jsonl"], "kvlab: error: bad.jsonl:2: missing field"),
    (["synthetic", "--ip", "no.such.host.invalid"], "kvlab: error: --ip no.such.host.invalid: not an address"),
])
def test_bad_input_exits_2_before_serving(argv: list[str], message: str, tmp_path: Path, monkeypatch,
                                          capsys) -> None:
    (tmp_path / "bad.jsonl").write_bytes(BAD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_dashboard, "_serve", lambda *a: pytest.fail("served despite bad input"))
    assert main(["dashboard", *argv, "--port", str(free_port())]) == 2
    assert capsys.readouterr().err.startswith(message)


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_bad_port_is_an_argument_error(port: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["dashboard", "--port", port])
    assert exit_.value.code == 2
    assert "argument --port: expected a port number in [1, 65535], got" in capsys.readouterr().err


def test_runs_voila_on_the_page_and_cleans_up(monkeypatch, capsys) -> None:
    ran = {}

    def serve(argv: list[str], env: dict[str, str], folder: Path) -> int:
        assert folder == Path(argv[3]).parent
        notebook = Path(argv[3])
        ran.update(argv=argv, env=env, folder=notebook.parent, cell=nbformat.read(notebook, as_version=4).cells[0])
        return 0

    monkeypatch.setattr(cli_dashboard, "_serve", serve)
    port = free_port()
    assert main(["dashboard", "--port", str(port), "--no-browser"]) == 0
    assert ran["argv"] == voila_argv(ran["folder"] / "kvlab-dashboard.ipynb", port=port, ip="127.0.0.1",
                                     open_browser=False)
    assert ran["cell"].source.splitlines()[-1] == "Dashboard('conversation')"  # the default trace
    assert ran["env"]["JUPYTER_PATH"].split(":")[0] == str(ran["folder"] / "share" / "jupyter")
    assert not ran["folder"].exists()  # the temporary folder is removed
    assert capsys.readouterr().out == f"kvlab dashboard: conversation at http://127.0.0.1:{port}/  (Ctrl-C stops it)\n"


def test_no_browser_opened_without_a_display(monkeypatch, capsys) -> None:
    ran = []
    monkeypatch.setattr(cli_dashboard, "_serve", lambda argv, env, folder: ran.append(argv) or 0)
    monkeypatch.setattr(cli_dashboard, "can_open_browser", lambda: False)
    port = free_port()
    assert main(["dashboard", "synthetic", "--port", str(port)]) == 0
    assert "--no-browser" in ran[0]
    assert capsys.readouterr().out.endswith("(Ctrl-C stops it; no display here: open it in a browser)\n")
    monkeypatch.setattr(cli_dashboard, "can_open_browser", lambda: True)
    assert main(["dashboard", "synthetic", "--port", str(port)]) == 0
    assert "--no-browser" not in ran[1]


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs Linux /proc")
def test_kernels_are_found_by_folder_and_stopped(tmp_path: Path) -> None:
    """Voilà's kernels run in sessions of their own: the command finds them by its folder."""
    import subprocess

    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "ipykernel_launcher", "-f",
                             str(tmp_path / "voila_x" / "kernel-1.json")])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(tmp_path)])  # no kernel
    try:
        assert cli_dashboard.kernel_pids(tmp_path) == [fake.pid]
        cli_dashboard._signal_kernels(tmp_path, signal.SIGTERM)
        assert fake.wait(timeout=30) == -signal.SIGTERM
        assert cli_dashboard.kernel_pids(tmp_path) == [] and other.poll() is None
    finally:
        for proc in (fake, other):
            proc.kill()
            proc.wait()
