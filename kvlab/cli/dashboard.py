"""``kvlab dashboard [TRACE]``: the workshop dashboard (:class:`kvlab.ui.dashboard.Dashboard`) as a
web page on Voilà — the panels without code cells, for a class that moves sliders.

The command checks the trace (a file, a bundled name or ``-``; errors: ``kvlab: error: ...``,
exit 2) and that it can listen on ``--ip``:``--port``, then writes a one-cell notebook and a
Voilà template into a temporary folder, prints the URL and runs ``python -m voila`` on it until
Ctrl-C (or SIGTERM), then removes the folder. Each browser tab gets its own kernel.

The page: sources stripped, the light theme with larger fonts (readable on a projector), no
file fetched from the internet (Vega from the kernel, no Font Awesome from a CDN: workshops run
on closed networks). Voilà itself does not refuse to run as root (unlike Jupyter Server,
which needs ``--allow-root``), so containers and workshop VMs need nothing more. There is no
token: the page's kernel runs Python for whoever reaches the address, so the default
``--ip`` is loopback; give ``--ip 0.0.0.0`` only on a network you trust.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from kvlab.paths import BUNDLED_TRACES, TOKEN_COUNT_TRACES

#: Voilà's own default port.
DEFAULT_PORT = 8866
#: The notebook's file name (the page's title is its stem).
NOTEBOOK_NAME = "kvlab-dashboard.ipynb"
#: The Voilà template's name (a folder under ``<JUPYTER_PATH>/voila/templates``).
TEMPLATE_NAME = "kvlab-dashboard"
#: Kernels whose page was closed without saying so are shut down after this many idle seconds.
CULL_IDLE_S = 600

_CELL = """\
from kvlab.ui.dashboard import Dashboard, prepare_page

prepare_page()  # the Vega libraries from the kernel, before the page asks: no internet needed
Dashboard({trace!r})
"""

# The lab template without its two Font Awesome links to a CDN (a closed network logs them as
# errors; the dashboard's buttons have no icons), and with fonts a room can read.
_TEMPLATE = """\
{%- extends 'voila/templates/lab/index.html.j2' -%}
{%- block notebook_css -%}
{%- for line in super().splitlines() if 'cdn.jsdelivr.net' not in line %}
{{ line }}
{%- endfor %}
<style>
  body.jp-Notebook {
    --jp-ui-font-size1: 16px;
    --jp-content-font-size1: 16px;
    --jp-widgets-font-size: 16px;
    --jp-widgets-inline-height: 32px;
    --jp-widgets-inline-label-width: 130px;
    --jp-widgets-inline-width: 400px;
    --jp-widgets-slider-handle-size: 20px;
  }
  body.jp-Notebook .widget-tab > .p-TabBar .p-TabBar-tab,
  body.jp-Notebook .widget-tab > .lm-TabBar .lm-TabBar-tab { font-size: 18px; min-width: 180px; }
  body.jp-Notebook .kvlab-intro { font-size: 17px; margin: 0.4em 0 0.8em; }
</style>
{%- endblock notebook_css -%}
"""


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number in [1, 65535], got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number in [1, 65535], got {value}")
    return value


def add_dashboard_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``kvlab dashboard`` on the ``kvlab`` subcommand set ``sub``."""
    dash = sub.add_parser("dashboard", help="serve the workshop dashboard (replay, tiers, cluster) as a web page "
                                            "on Voila")
    dash.add_argument("trace", nargs="?", default="conversation",
                      help="the trace shown first: a file or folder with block keys (any format of kvlab formats), a "
                           "bundled name (" + ", ".join(n for n in BUNDLED_TRACES if n not in TOKEN_COUNT_TRACES)
                           + "; default conversation) or - for stdin; "
                           "the page can pick another or upload one")
    dash.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    dash.add_argument("--ip", default="127.0.0.1",
                      help="address to listen on (default 127.0.0.1; 0.0.0.0: every interface — no token: anyone "
                           "who reaches it runs the page's kernel)")
    dash.add_argument("--no-browser", action="store_true",
                      help="do not open a web browser (none is opened without a display either)")


def trace_argument(text: str, folder: Path, stdin: object = None) -> str:
    """Check the ``TRACE`` argument by loading it (as every ``kvlab`` command:
    :func:`kvlab.cli.files.load_trace_argument`) and return what the page's kernel loads: the
    bundled name, the file's absolute path, or for ``-`` the trace saved as kvlab Parquet
    in ``folder``.

    Raises:
        ValueError, FileNotFoundError: as ``load_trace_argument`` (file and line of a bad record).
    """
    from kvlab.cli.files import STDIN, load_trace_argument

    trace = load_trace_argument(text, stdin=stdin)
    if text == STDIN:
        path = folder / "stdin.parquet"
        trace.write_parquet(path)
        return str(path)
    if text in BUNDLED_TRACES and not Path(text).exists():
        return text
    return str(Path(text).resolve())


def write_page(folder: Path, trace: str) -> Path:
    """Write the dashboard's notebook (one cell building a :class:`~kvlab.ui.dashboard.Dashboard`
    on ``trace``: a bundled name or a path) and its Voilà template into ``folder``; return the
    notebook's path. The template goes to ``folder/share/jupyter/voila/templates``
    (:func:`voila_env` puts ``folder/share/jupyter`` on ``JUPYTER_PATH``)."""
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells.append(nbformat.v4.new_code_cell(_CELL.format(trace=trace)))
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / NOTEBOOK_NAME
    nbformat.write(notebook, path)
    template = folder / "share" / "jupyter" / "voila" / "templates" / TEMPLATE_NAME
    template.mkdir(parents=True, exist_ok=True)
    (template / "conf.json").write_text(json.dumps({"base_template": "lab"}) + "\n")
    (template / "index.html.j2").write_text(_TEMPLATE)
    return path


def voila_argv(notebook: Path, *, port: int, ip: str, open_browser: bool, python: str | None = None) -> list[str]:
    """The command that serves ``notebook`` on Voilà: at ``ip``:``port`` exactly (no other port
    tried), a kernel started and run before the first visitor (preheated), sources stripped, the light
    theme and kvlab's template, idle orphan kernels culled; the kernels' connection files beside
    the notebook (their command lines name its folder)."""
    argv = [python or sys.executable, "-m", "voila", str(notebook), f"--port={port}", f"--Voila.ip={ip}",
            f"--Voila.connection_dir_root={notebook.parent}",
            "--Voila.port_retries=0", "--preheat_kernel=True", "--strip_sources=True", "--theme=light",
            f"--template={TEMPLATE_NAME}", f"--MappingKernelManager.cull_idle_timeout={CULL_IDLE_S}",
            "--MappingKernelManager.cull_interval=60"]
    if not open_browser:
        argv.append("--no-browser")
    return argv


def voila_env(folder: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default ``os.environ``) with ``folder/share/jupyter`` first on ``JUPYTER_PATH``
    (where Voilà finds the template)."""
    env = dict(os.environ if environ is None else environ)
    share = str(folder / "share" / "jupyter")
    env["JUPYTER_PATH"] = os.pathsep.join([share, *filter(None, env.get("JUPYTER_PATH", "").split(os.pathsep))])
    return env


def dashboard_url(ip: str, port: int) -> str:
    """The URL to open: ``http://IP:PORT/`` (every interface: this host's name)."""
    host = socket.gethostname() if ip in ("", "0.0.0.0", "::") else ip
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def check_listen(ip: str, port: int) -> None:
    """Refuse an address Voilà could not listen on before starting it.

    Raises:
        ValueError: naming ``--ip``/``--port`` and the system's reason (in use, not an address here).
    """
    try:
        infos = socket.getaddrinfo(ip, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise ValueError(f"--ip {ip}: not an address of this machine ({err.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            fix = ("pick another --port" if err.errno == errno.EADDRINUSE else
                   "give an address of this machine as --ip (127.0.0.1, 0.0.0.0 or one of its interfaces)")
            raise ValueError(f"--ip {ip} --port {port}: cannot listen there ({err.strerror}); {fix}") from None


def can_open_browser(environ: dict[str, str] | None = None, platform: str | None = None) -> bool:
    """Whether a graphical browser can be opened here: macOS, Windows, or a display
    (``DISPLAY`` / ``WAYLAND_DISPLAY``). On a headless machine Python's ``webbrowser`` would
    pick a text browser (``www-browser``, ``lynx``) and take over the terminal.

    Example:
        >>> can_open_browser({}, "linux"), can_open_browser({"DISPLAY": ":0"}, "linux"), can_open_browser({}, "darwin")
        (False, True, True)
    """
    environ = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    return platform in ("darwin", "win32") or bool(environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"))


def run_dashboard(args: argparse.Namespace) -> int:
    """``kvlab dashboard``: check the arguments, serve the page until Ctrl-C / SIGTERM; Voilà's exit status.

    Raises:
        ValueError, FileNotFoundError: a bad trace or an address that cannot be listened on.
    """
    folder = Path(tempfile.mkdtemp(prefix="kvlab-dashboard-"))
    try:
        trace = trace_argument(args.trace, folder)
        check_listen(args.ip, args.port)
        notebook = write_page(folder, trace)
        open_browser = not args.no_browser and can_open_browser()
        argv = voila_argv(notebook, port=args.port, ip=args.ip, open_browser=open_browser)
        how = "" if open_browser or args.no_browser else "; no display here: open it in a browser"
        print(f"kvlab dashboard: {args.trace} at {dashboard_url(args.ip, args.port)}  (Ctrl-C stops it{how})",
              flush=True)
        return _serve(argv, voila_env(folder), folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _serve(argv: list[str], env: dict[str, str], folder: Path) -> int:
    """Run Voilà in the foreground; on Ctrl-C or SIGTERM stop it and its kernels and return (the
    folder is then removed). The kernels run in sessions of their own (jupyter_client), so a
    signal to this process group does not reach them: they are found by ``folder`` (their
    connection files are in it) and sent SIGTERM at once, beside Voilà's own shutdown, which
    otherwise takes seconds per kernel on a busy machine; any left when Voilà exits are killed."""
    process = subprocess.Popen(argv, env=env)
    stopped = []

    def stop(*_: object) -> None:
        stopped.append(True)
        process.terminate()
        _signal_kernels(folder, signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            try:
                status = process.wait()
                return 0 if stopped else status
            except KeyboardInterrupt:  # Voilà got the SIGINT too: it stops by itself
                stop()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if process.poll() is None:
            process.kill()
            process.wait()
        _signal_kernels(folder, signal.SIGKILL)


def kernel_pids(folder: Path) -> list[int]:
    """Process ids of the running kernels whose command line names ``folder`` (Linux ``/proc``;
    elsewhere none are found and Voilà's own shutdown is relied on)."""
    needle = str(folder).encode()
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and b"ipykernel" in cmdline:
            pids.append(int(proc.name))
    return pids


def _signal_kernels(folder: Path, sig: int) -> None:
    for pid in kernel_pids(folder):
        try:
            os.kill(pid, sig)
        except OSError:  # gone meanwhile
            pass


__all__ = ["add_dashboard_parser", "can_open_browser", "check_listen", "dashboard_url", "kernel_pids",
           "run_dashboard", "trace_argument", "voila_argv", "voila_env", "write_page"]
