"""The documentation's code blocks (README.md and every page under docs/, generated ones too):
every block carries a marker (`docs/tooling/docs_examples.py`), the blocks marked `run` run
here, and the others are checked as far as they can be without what they need.

Blocks run in a fresh folder (`sandbox`) where `results/` holds copies of real runs from the
fixtures, named as `mlagents-learn --run-id=...` would write them (`RESULTS`). Python blocks run
in this process (so the fast lane's guard catches a block that starts a stand-in unmarked), shell
blocks with `bash -e -o pipefail`, with the venv's `huggy` and `python` first on the PATH.

Lanes: `run` blocks are marked `docs` (out of the fast lane); `run standin` ones are marked
`standin`; `run ray` ones run on the session's Ray cluster (`$RAY_ADDRESS`); `run http-start` blocks start
`huggy serve` on the session's cluster (on a free port: `127.0.0.1:8000` and gRPC port 50051
in the page's blocks are rewritten to the ports given) and the page's `run http` blocks run
against it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.fixtures import REPO_ROOT
from tests.support.processes import free_ports
from tests.support.ray_cluster import RayCluster

sys.path.insert(0, str(REPO_ROOT / "docs" / "tooling"))
import docs_examples
from docs_examples import Block, blocks_of, marker_problem

RESULTS = {
    "Huggy": "huggy/ppo_baseline",
    "Huggy2": "huggy/ppo_num_layers_2",
    "Huggy3": "huggy/ppo_normalize_False",
    "Pyramids": "mlagents/pyramids_trained",
    "Recurrent": "mlagents/lstm",
    "SoccerTwos": "mlagents_extra/soccertwos_standin",
}
"""results/<run> in the sandbox -> the fixture run it copies (tests/fixtures/...)."""

BLOCKS = docs_examples.all_blocks()


def blocks_in(lane: str) -> list[Block]:
    return [block for block in BLOCKS if block.marker and block.marker.lane == lane]


def ids(blocks: list[Block]) -> list[str]:
    return [block.name for block in blocks]


# --- markers ---------------------------------------------------------------------------------


def test_every_block_on_the_site_is_marked() -> None:
    """Guide pages, README.md and the generated reference pages alike."""
    from docs_reference import generated_pages

    pages = {path: text for path, text in generated_pages().items() if path.endswith(".md")}
    blocks = docs_examples.all_blocks(pages)
    problems = [problem for block in blocks if (problem := marker_problem(block))]
    assert problems == []
    assert len(blocks) > len(BLOCKS) > 50


def test_a_block_without_a_marker_or_with_a_wrong_one_is_named() -> None:
    page = "\n".join([
        "```python", "print(1)", "```",                                  # line 1: no marker
        "<!-- example: run sometimes -->", "```bash", "true", "```",      # line 5: unknown lane
        "<!-- example: needs luck -->", "```python", "pass", "```",       # line 9: unknown reason
        "<!-- example: run -->", "```yaml", "a: 1", "```",                # line 13: yaml cannot run
        "<!-- example: output -->", "```", "text", "```",                 # line 17: no language
        "<!-- example: run standin -->", "```python", "pass", "```",      # line 21: fine
        "- a list item", "", "  <!-- example: output -->", "  ```text", "  indented", "  ```",
    ])
    blocks = blocks_of(page, "page.md")
    assert [block.line for block in blocks] == [1, 5, 9, 13, 17, 21, 27]
    assert blocks[-1].code == "indented\n"
    problems = [marker_problem(block) for block in blocks]
    assert problems[0].startswith("page.md:1: the python block has no marker: put")
    assert problems[1] == ("page.md:5: the bash block names the lane 'sometimes'; expected one "
                           f"of {list(docs_examples.RUN_LANES)}")
    assert problems[2] == ("page.md:9: the python block needs 'luck'; expected one of "
                           f"{sorted(docs_examples.NEEDS)}")
    assert problems[3] == ("page.md:13: the yaml block is marked run, but only "
                           "['python', 'bash'] blocks can run")
    assert problems[4].startswith("page.md:17: the unlabelled block has no language")
    assert problems[5:] == [None, None]


# --- blocks that are not run: checked as far as they can be ----------------------------------

NOT_RUN = [block for block in BLOCKS if block.marker and block.marker.kind != "run"]


@pytest.mark.parametrize("block", NOT_RUN, ids=ids(NOT_RUN))
def test_a_block_that_is_not_run_is_well_formed(block: Block) -> None:
    """Python compiles, shell passes `bash -n`, `huggy` lines parse, YAML and JSON load."""
    if block.language == "python":
        compile(block.code, block.name, "exec")
    elif block.language == "bash":
        checked = subprocess.run(["bash", "-n"], input=block.code, text=True, capture_output=True)
        assert checked.returncode == 0, checked.stderr
        check_huggy_commands(block)
    elif block.language == "yaml":
        assert list(yaml.safe_load_all(docs_examples.expand_snippets(block.code)))
    elif block.language == "json":
        json.loads(block.code)


def check_huggy_commands(block: Block) -> None:
    """Every `huggy ...` command line of `block` parses with the real parser (not in blocks that
    need the Hub: the parser resolves `--policy hf://...`, which downloads)."""
    from huggy_agent.cli import build_parser

    if block.marker and block.marker.arg == "hub":
        return
    for argv in docs_examples.command_lines(block.code):
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit as exit_:
            if exit_.code:
                pytest.fail(f"{block.name}: `huggy {' '.join(argv)}` does not parse")


BASH = [block for block in BLOCKS if block.language == "bash"]


@pytest.mark.parametrize("block", BASH, ids=ids(BASH))
def test_every_huggy_command_on_the_site_parses(block: Block) -> None:
    """Also those of the blocks that run in the slow lanes, so a renamed flag shows in the fast
    lane."""
    check_huggy_commands(block)


SEED_SENT = re.compile(r'\\?"seed\\?":\s*\d')
STOCHASTIC_ASKED = re.compile(r'\\?"deterministic\\?":\s*false')


def test_a_request_that_sends_a_seed_asks_for_stochastic_actions() -> None:
    """A seed only draws the noise of stochastic actions; with deterministic actions (the
    default) it changes nothing, so a request on the site that sends one must also send
    `"deterministic": false`, or a reader assumes the seed mattered."""
    commands = [(block, command) for block in BLOCKS if block.language == "bash"
                for command in block.code.replace("\\\n", " ").splitlines()]
    requests = [(block, command) for block, command in commands if "/act" in command]
    assert len(requests) > 3  # the README's and the serving guide's among them
    pointless = [f"{block.name}: {command.strip()}" for block, command in requests
                 if SEED_SENT.search(command) and not STOCHASTIC_ASKED.search(command)]
    assert pointless == []


def test_the_quick_start_is_two_commands_and_names_the_fast_lane() -> None:
    """`make run` and `make test`, what the whole suite costs, and the lane for every day."""
    readme = (REPO_ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    (block,) = blocks_of(quick_start, "README.md")
    assert [line.split("#")[0].strip() for line in block.code.splitlines()] == [
        "make run", "make test"]
    assert "`make test-fast`" in quick_start and re.search(r"\d+-\d+ minutes", quick_start)


def test_every_figure_on_the_site_is_made_by_the_figures_script() -> None:
    """Each image a page shows is a PNG in docs/figures that make_figures.py makes, and each PNG
    there is shown somewhere."""
    figures = REPO_ROOT / "docs" / "figures"
    sys.path.insert(0, str(figures))
    import make_figures

    shown = {match for path in docs_examples.guide_pages()
             for match in re.findall(r"!\[[^\]]*\]\(figures/([^)]+)\)", path.read_text())}
    assert shown == set(make_figures.FIGURES) == {path.name for path in figures.glob("*.png")}
    made = json.loads((figures / "figures.json").read_text())
    assert set(made) == shown and all(entry["machine"] and entry["made"] for entry in made.values())


# --- blocks that run -------------------------------------------------------------------------


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working folder with `results/<run>` copies of fixture runs (`RESULTS`)."""
    fixtures = REPO_ROOT / "tests" / "fixtures"
    for run, source in RESULTS.items():
        if not (fixtures / source).is_dir():
            pytest.skip(f"fixture {source} not found (tests/fixtures ships with the repository)")
        shutil.copytree(fixtures / source, tmp_path / "results" / run)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def shell_env(**extra: str) -> dict[str, str]:
    """This environment with the venv's bin first on the PATH and this tree first on the
    Python path (so `huggy` and `python` run this checkout's code)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(COLUMNS="100", **extra)
    return env


def run_block(block: Block, cwd: Path, env: dict[str, str] | None = None) -> None:
    """Run one block: Python in this process, shell in bash; fail with its output."""
    if block.language == "python":
        exec(compile(block.code, block.name, "exec"), {"__name__": "__docs_example__"})
        return
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=cwd,
                          env=env or shell_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (f"{block.name} exited {done.returncode}:\n{block.code}\n"
                                  f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}")


@pytest.mark.docs
@pytest.mark.parametrize("block", blocks_in("fast"), ids=ids(blocks_in("fast")))
def test_fast_example_runs(block: Block, sandbox: Path) -> None:
    run_block(block, sandbox)


@pytest.mark.standin
@pytest.mark.parametrize("block", blocks_in("standin"), ids=ids(blocks_in("standin")))
def test_standin_example_runs(block: Block, sandbox: Path) -> None:
    run_block(block, sandbox)


def on_cpu(code: str) -> str:
    """The block with `--accelerator cpu` given to every `huggy evaluate` and `huggy tournament`:
    the session's cluster declares a fake NPU (for the placement tests), which `auto` would
    pick."""
    return re.sub(r"\bhuggy (evaluate|tournament)\b", r"huggy \1 --accelerator cpu", code)


def test_ray_examples_are_run_on_the_cpu() -> None:
    assert on_cpu("huggy evaluate a b \\\n  --episodes 3; huggy tournament x; huggy serve") == (
        "huggy evaluate --accelerator cpu a b \\\n  --episodes 3; "
        "huggy tournament --accelerator cpu x; huggy serve")


@pytest.mark.parametrize("block", blocks_in("ray"), ids=ids(blocks_in("ray")))
def test_ray_example_runs(block: Block, sandbox: Path, ray_cluster: RayCluster) -> None:
    run_block(dataclasses.replace(block, code=on_cpu(block.code)), sandbox,
              shell_env(RAY_ADDRESS=ray_cluster.address))


# --- the server examples ---------------------------------------------------------------------

SERVER_STARTS = blocks_in("http-start")


def with_ports(code: str, http_port: int, grpc_port: int) -> str:
    """The block with the documented ports (HTTP 8000, gRPC 50051) replaced by the test's."""
    code = re.sub(r"(?<=127\.0\.0\.1:)8000\b|(?<=localhost:)8000\b", str(http_port), code)
    return re.sub(r"(?<=127\.0\.0\.1:)50051\b|(?<=--grpc-port )50051\b", str(grpc_port), code)


def test_documented_ports_are_rewritten_to_the_test_servers() -> None:
    code = ("curl 127.0.0.1:8000/v1/act; curl localhost:8000/x; grpc.insecure_channel("
            "'127.0.0.1:50051'); huggy serve --grpc-port 50051 --max-rows 8000 # 127.0.0.1:80001")
    assert with_ports(code, 1234, 5678) == (
        "curl 127.0.0.1:1234/v1/act; curl localhost:1234/x; grpc.insecure_channel("
        "'127.0.0.1:5678'); huggy serve --grpc-port 5678 --max-rows 8000 # 127.0.0.1:80001")


@pytest.fixture
def http_ports() -> tuple[int, int]:
    http, grpc = free_ports(2)
    return http, grpc


@pytest.mark.parametrize("start", SERVER_STARTS, ids=ids(SERVER_STARTS))
def test_server_examples_run_against_the_server_their_page_starts(
        start: Block, sandbox: Path, ray_cluster: RayCluster, http_ports: tuple[int, int]) -> None:
    """Start the page's `huggy serve` block (on the session's cluster, free ports, CPU), run the
    page's `http` blocks that follow it, in order, then stop it with SIGTERM: it exits 0. The
    bundled policy's server answers the OpenAPI document the HTTP API page renders."""
    (argv,) = list(docs_examples.command_lines(with_ports(start.code, *http_ports)))
    assert argv[0] == "serve", f"{start.name}: an http-start block is one `huggy serve` command"
    clients = [block for block in blocks_in("http")
               if block.page == start.page and block.line > start.line]
    assert clients, f"{start.name}: no `run http` block follows it on its page"
    command = [str(Path(sys.executable).with_name("huggy")), *argv, "--port", str(http_ports[0]),
               "--address", ray_cluster.address, "--accelerator", "cpu", "--num-cpus", "0.5"]
    log = sandbox / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=sandbox, env=shell_env(), stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until_served(server, log)
        for block in clients:
            ported = Block(block.page, block.line, block.language,
                           with_ports(block.code, *http_ports), block.marker, block.marker_text)
            run_block(ported, sandbox)
        if argv == ["serve"]:
            check_live_openapi(http_ports[0])
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def wait_until_served(server: subprocess.Popen, log: Path, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while "served at" not in log.read_text(errors="replace"):
        assert server.poll() is None and time.monotonic() < deadline, (
            "huggy serve did not come up:\n" + log.read_text(errors="replace")[-3000:])
        time.sleep(0.5)


def check_live_openapi(port: int) -> None:
    """The HTTP API page is rendered from the document a live server answers."""
    import requests
    from docs_reference import bundled_openapi

    live = requests.get(f"http://127.0.0.1:{port}/v1/openapi.json", timeout=30).json()
    assert live == json.loads(json.dumps(bundled_openapi()))


def test_a_page_with_server_examples_starts_its_server() -> None:
    """Every `run http` block follows an `http-start` block on its page."""
    orphans = [block.name for block in blocks_in("http")
               if not any(start.page == block.page and start.line < block.line
                          for start in SERVER_STARTS)]
    assert orphans == []
