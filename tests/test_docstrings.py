"""Docstrings state contracts. Every module of `huggy_agent/`, `envs/`, `deploy/` and the client
package is read with `ast` and `tokenize` (nothing is imported), and each test fails naming
`file:line` for:

- a docstring or comment that names a machine (EPYC, Xeon, "2-core", H100, ...), carries a
  measured figure (a time such as "35 us" or "1.2 ms", a speed-up such as "1.5x" or "3 times
  faster", a rate such as "900 req/s") or a date ("December 2026"): measurements live in
  docs/benchmarks.md, linked by section. Text in backticks is code, not prose: `"1500ms"` is a
  literal that a contract may quote;
- a module docstring over 20 lines: the module's purpose and use; design notes belong in the
  code's comments, user documentation in docs/;
- a public function or method that takes parameters but has no `Args:` section naming each of
  them, returns a value without `Returns:`, yields without `Yields:`, or raises explicitly
  without `Raises:` naming each exception class it raises (Google style, as Gymnasium and
  PettingZoo write them; mkdocstrings renders these sections into docs/reference/python/), or
  whose sections mkdocstrings would misread (`malformed`).

A docstring is any bare string statement: a module's, a class's, a function's, or the one under
an attribute. Public means: a function at module level or a method of a public class (a class at
module level, or nested in a public class), whose name has no leading underscore.

Exemptions from the sections (not from the figures, machines and dates, which no docstring or
comment may hold): private names (a leading underscore) and whatever they hold; functions and
classes defined inside a function; dunder methods, except that `__init__`'s parameters are named
in `Args:` of the class's docstring or its own (mkdocstrings merges the two); `@property`,
`@cached_property`, setters, deleters and `@overload` stubs; the argparse registration functions
`add_*_parser` and `add_parsers` (their contract is the `--help` text, which the CLI reference
shows); `self` and `cls`; a bare `raise`, or `raise exc` of the exception an enclosing
`except ... as exc` caught (a re-raise); an exception raised inside a `try` of the same function
that catches it; and `NotImplementedError` (an abstract method's). A stub with no body (`...`,
`pass` or `raise NotImplementedError`) that is annotated to return something other than None
needs `Returns:` as if it returned.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.fixtures import REPO_ROOT

PACKAGES = ("huggy_agent", "envs", "deploy", "client/huggy_agent_client")
MODULE_DOCSTRING_MAX_LINES = 20

MACHINE = re.compile(
    r"\b(EPYC|Xeon|Ryzen|Threadripper|Graviton|Sapphire Rapids|Ice Lake|Cascade Lake|Zen ?\d"
    r"|[AHV]100|H200|MI\d{3}|vCPUs?|cloud VMs?|\d+-(core|CPU|vCPU|thread)s?\b)")
COMPARED = r"(faster|slower|quicker|cheaper|more|less|fewer|larger|smaller|higher|lower|bigger)"
FIGURE = re.compile(
    r"\d[\d,.]*\s*(us|µs|μs|ns|ms|microseconds?|milliseconds?|nanoseconds?)\b"
    r"|\b\d+(\.\d+)?[x×](?![\w\d])"
    rf"|\b\d+(\.\d+)?\s*(times|%)\s+{COMPARED}\b"
    r"|[+-]\d+(\.\d+)?(-\d+(\.\d+)?)?\s*%"
    r"|(\d[\d,.]*|%)\s*k?\s*[A-Za-z][\w-]*\s*/\s*s\b|\d[\d,.]*\s*k?\s*[A-Za-z][\w-]*\s+per second"
    rf"|\d[\d,.]*\s*(KB|kB|MB|GB|KiB|MiB|GiB)\s+({COMPARED}|per)\b")
MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December"
          "|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec")
DATE = re.compile(rf"\b({MONTHS})\.?,?\s+(19|20)\d\d\b|\b(19|20)\d\d-(0[1-9]|1[0-2])-\d\d\b")

SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Returns|Yields|Raises|Examples?|Notes?|"
                     r"Attributes|See Also|Warnings?|Todo):\s*$")
ENTRY = re.compile(r"^\s*(\*{0,2}[\w.]+(?:\s*,\s*\*{0,2}[\w.]+)*)\s*(\([^)]*\))?\s*:")
EXEMPT_DECORATORS = {"property", "cached_property", "overload", "setter", "deleter"}
TRY_STATEMENTS = (ast.Try, *((ast.TryStar,) if hasattr(ast, "TryStar") else ()))


@dataclass(frozen=True)
class Violation:
    kind: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.where}: {self.kind}: {self.detail}"


def modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (REPO_ROOT / package).rglob("*.py"))


def relative(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else str(path)


def sections(docstring: str) -> dict[str, list[str]]:
    """Google-style section name -> its lines (indented under the header), in a docstring."""
    found: dict[str, list[str]] = {}
    lines = docstring.expandtabs().splitlines()
    current: list[str] | None = None
    header_indent = 0
    for line in lines:
        header = SECTION.match(line)
        if header:
            current = found.setdefault(header.group(2), [])
            header_indent = len(header.group(1))
            continue
        if current is None:
            continue
        if line.strip() and len(line) - len(line.lstrip()) <= header_indent:
            current = None
            continue
        current.append(line)
    return found


def documented_names(section: list[str]) -> set[str]:
    """The names an `Args:` (or `Raises:`) section lists, its entries being its least indented
    lines: `name (type): ...`, `name: ...` or `a, b: ...`; stars stripped."""
    entries = [line for line in section if line.strip()]
    if not entries:
        return set()
    indent = min(len(line) - len(line.lstrip()) for line in entries)
    names: set[str] = set()
    for line in entries:
        if len(line) - len(line.lstrip()) != indent:
            continue
        entry = ENTRY.match(line)
        if entry:
            names.update(name.strip().lstrip("*").rpartition(".")[2]
                         for name in entry.group(1).split(","))
    return names


def malformed(found: dict[str, list[str]]) -> Iterator[str]:
    """The lines that mkdocstrings would misread: in `Args:` and `Raises:` every least-indented line
    starts an entry (`name: ...`, continued by lines indented further); in `Returns:` and `Yields:`
    either one line starts the description (continued by lines indented further) or every
    least-indented line starts a named entry."""
    for title, lines in found.items():
        if title not in ("Args", "Raises", "Returns", "Yields"):
            continue
        entries = [line for line in lines if line.strip()]
        if not entries:
            yield f"{title}: is empty"
            continue
        indent = min(len(line) - len(line.lstrip()) for line in entries)
        starts = [line.strip() for line in entries if len(line) - len(line.lstrip()) == indent]
        if title in ("Returns", "Yields") and len(starts) == 1:
            continue
        for start in starts:
            if not ENTRY.match(start):
                yield f"{title}: {start[:40]!r} is neither an entry nor indented under one"


def decorator_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names = set()
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute):
            names.add(target.attr)
        elif isinstance(target, ast.Name):
            names.add(target.id)
    return names


def own_nodes(function: ast.AST) -> Iterator[tuple[ast.AST, tuple[ast.Try, ...]]]:
    """Every node of a function's own body (not of functions, lambdas or classes inside it), with
    the `try` statements whose body encloses it."""
    def walk(node: ast.AST, tries: tuple[ast.Try, ...]) -> Iterator[tuple[ast.AST, tuple[ast.Try, ...]]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
                continue
            yield child, tries
            if isinstance(child, TRY_STATEMENTS):
                for statement in child.body:
                    yield statement, (*tries, child)
                    yield from walk(statement, (*tries, child))
                for part in (*child.handlers, *child.orelse, *child.finalbody):
                    yield part, tries
                    yield from walk(part, tries)
            else:
                yield from walk(child, tries)
    return walk(function, ())


def exception_name(node: ast.expr) -> str | None:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, ast.Name):
        return target.id
    return None


def caught(try_node: ast.Try, name: str) -> bool:
    for handler in try_node.handlers:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(exception_name(t) in (name, "Exception", "BaseException") for t in types):
            return True
    return False


def handler_names(function: ast.AST) -> set[str]:
    return {node.name for node, _ in own_nodes(function)
            if isinstance(node, ast.ExceptHandler) and node.name}


def raised_classes(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[int, str | None]]:
    """(line, class name or None when not a plain name) of each exception the function raises
    itself, re-raises and exemptions left out."""
    rethrown = handler_names(function)
    raised = []
    for node, tries in own_nodes(function):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        name = exception_name(node.exc)
        if isinstance(node.exc, ast.Name) and name in rethrown:
            continue
        if name == "NotImplementedError":
            continue
        if name and any(caught(t, name) for t in tries):
            continue
        is_class = name is not None and name[:1].isupper()
        raised.append((node.lineno, name if is_class else None))
    return raised


def is_stub(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = list(function.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if not body:
        return True
    if len(body) != 1:
        return False
    only = body[0]
    if isinstance(only, ast.Pass):
        return True
    if isinstance(only, ast.Expr) and isinstance(only.value, ast.Constant) and only.value.value is Ellipsis:
        return True
    return isinstance(only, ast.Raise) and only.exc is not None \
        and exception_name(only.exc) == "NotImplementedError"


def returns_value(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for node, _ in own_nodes(function):
        if isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            return True
    if is_stub(function) and function.returns is not None:
        annotation = ast.unparse(function.returns)
        return annotation not in ("None", "NoReturn", "Never", "typing.NoReturn")
    return False


def yields(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(node, ast.Yield | ast.YieldFrom) for node, _ in own_nodes(function))


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> list[str]:
    arguments = function.args
    names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
    if arguments.vararg:
        names.append(arguments.vararg.arg)
    if arguments.kwarg:
        names.append(arguments.kwarg.arg)
    if method and "staticmethod" not in decorator_names(function) and names \
            and names[0] in ("self", "cls", "mcs"):
        names = names[1:]
    return names


def function_violations(function: ast.FunctionDef | ast.AsyncFunctionDef, where: str,
                        method: bool, class_docstring: str | None) -> Iterator[Violation]:
    docstring = ast.get_docstring(function) or ""
    found = sections(docstring)
    name = function.name
    if name == "__init__":
        # mkdocstrings merges `__init__` into the class: its parameters may be named in either
        named = documented_names(found.get("Args", [])) | documented_names(
            sections(class_docstring or "").get("Args", []))
        for problem in malformed(found):
            yield Violation("format", where, f"{name}: {problem}")
        missing = [p for p in parameters(function, method) if p not in named]
        if missing:
            yield Violation("Args", where, f"{name}: no Args entry (class or __init__) for "
                            f"{', '.join(missing)}")
        return
    for problem in malformed(found):
        yield Violation("format", where, f"{name}: {problem}")
    params = parameters(function, method)
    if params:
        if "Args" not in found:
            yield Violation("Args", where, f"{name}: takes {', '.join(params)} but has no Args:")
        else:
            missing = [p for p in params if p not in documented_names(found["Args"])]
            if missing:
                yield Violation("Args", where, f"{name}: Args: does not name {', '.join(missing)}")
    if returns_value(function) and "Returns" not in found:
        yield Violation("Returns", where, f"{name}: returns a value but has no Returns:")
    if yields(function) and "Yields" not in found:
        yield Violation("Yields", where, f"{name}: yields but has no Yields:")
    raised = raised_classes(function)
    if raised:
        if "Raises" not in found:
            names = sorted({n or "?" for _, n in raised})
            yield Violation("Raises", where, f"{name}: raises {', '.join(names)} but has no Raises:")
        else:
            listed = documented_names(found["Raises"])
            missing = sorted({n for _, n in raised if n and n not in listed})
            if missing:
                yield Violation("Raises", where, f"{name}: Raises: does not name {', '.join(missing)}")


def public_functions(tree: ast.Module) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef,
                                                          bool, str | None]]:
    """(function, is a method, its class's docstring) for every public function and method."""
    def members(body: list[ast.stmt], cls: ast.ClassDef | None) -> Iterator[
            tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool, str | None]]:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                yield from members(node.body, node)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = node.name
                dunder = name.startswith("__") and name.endswith("__")
                if (name.startswith("_") and name != "__init__") or (dunder and name != "__init__"):
                    continue
                if decorator_names(node) & EXEMPT_DECORATORS:
                    continue
                if cls is None and re.fullmatch(r"add_(\w+_)?parsers?", name):
                    continue
                yield node, cls is not None, ast.get_docstring(cls) if cls else None
    return members(tree.body, None)


def docstrings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, text) of every bare string statement: module, class, function and attribute
    docstrings."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            yield node.lineno, node.value.value


CODE_SPAN = re.compile(r"`[^`]*`")


def comments(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def figures(where: str, text: str) -> Iterator[Violation]:
    """The machines, figures and dates in `text`, outside code spans (a literal such as
    `"1500ms"` is a contract, not a measurement)."""
    prose = CODE_SPAN.sub("``", text)
    for kind, pattern in (("machine", MACHINE), ("figure", FIGURE), ("date", DATE)):
        for match in pattern.finditer(prose):
            yield Violation(kind, where, repr(match.group(0)))


def violations_of(path: Path) -> list[Violation]:
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    name = relative(path)
    found: list[Violation] = []
    for line, text in docstrings(tree):
        for offset, text_line in enumerate(text.splitlines()):
            found.extend(figures(f"{name}:{line + offset}", text_line))
    for line, text in comments(source):
        found.extend(figures(f"{name}:{line}", text))
    module_docstring = ast.get_docstring(tree, clean=False)
    if module_docstring is not None:
        lines = len(module_docstring.strip("\n").splitlines())
        if lines > MODULE_DOCSTRING_MAX_LINES:
            found.append(Violation("module length", f"{name}:1",
                                   f"{lines} lines (at most {MODULE_DOCSTRING_MAX_LINES})"))
    for function, method, class_docstring in public_functions(tree):
        found.extend(function_violations(function, f"{name}:{function.lineno}", method,
                                         class_docstring))
    return found


def all_violations() -> list[Violation]:
    return [violation for path in modules() for violation in violations_of(path)]


@pytest.fixture(scope="module")
def violations() -> list[Violation]:
    return all_violations()


def report(violations: list[Violation], kinds: tuple[str, ...]) -> str:
    chosen = [str(v) for v in violations if v.kind in kinds]
    return f"{len(chosen)} docstring problem(s):\n" + "\n".join(chosen)


def test_docstrings_hold_no_machine_figure_or_date(violations: list[Violation]) -> None:
    """Measurements, their machines and dates are in docs/benchmarks.md, not in docstrings."""
    kinds = ("machine", "figure", "date")
    assert not [v for v in violations if v.kind in kinds], report(violations, kinds)


def test_module_docstrings_are_at_most_20_lines(violations: list[Violation]) -> None:
    kinds = ("module length",)
    assert not [v for v in violations if v.kind in kinds], report(violations, kinds)


def test_public_functions_document_args_returns_yields_and_raises(
        violations: list[Violation]) -> None:
    kinds = ("Args", "Returns", "Yields", "Raises", "format")
    assert not [v for v in violations if v.kind in kinds], report(violations, kinds)


# --- the checker itself, on sources written here -------------------------------------------------

def check_source(source: str) -> list[str]:
    tree = ast.parse(source)
    found = [f"{v.kind}:{v.detail}" for line, text in docstrings(tree)
             for v in figures(str(line), text)]
    for function, method, class_docstring in public_functions(tree):
        found.extend(f"{v.kind}:{v.detail}" for v in
                     function_violations(function, "m", method, class_docstring))
    return found


@pytest.mark.parametrize("text, expected", [
    ("Measured on a 2-core EPYC.", ["2-core", "EPYC"]),
    ("One pass takes 35 us here.", ["35 us"]),
    ("A round trip of 1.2 ms.", ["1.2 ms"]),
    ("1.5x faster than the echo.", ["1.5x"]),
    ("About 30% faster.", ["30% faster"]),
    ("Serves 900 req/s.", ["900 req/s"]),
    ("Measured in December 2026.", ["December 2026"]),
    ("On an H100.", ["H100"]),
    ("A (N, 3x84x84) image; a 2-tuple; the 16 rows of a batch; 3 times.", []),
    ("Whole milliseconds (`1500ms`) where the seconds are not whole.", []),
])
def test_the_figure_patterns_catch_figures_and_let_contracts_be(text: str, expected: list[str]
                                                                ) -> None:
    found = [violation.detail.strip("'") for violation in figures("here", text)]
    assert found == expected


def test_comments_are_read_as_docstrings_are(tmp_path: Path) -> None:
    path = tmp_path / "module.py"
    path.write_text('"""A module."""\n\nX = 1  # not frozen: 1.6 us more per request\n')
    assert [str(v) for v in violations_of(path)] == [f"{path}:3: figure: '1.6 us'"]


def test_the_section_checks_name_what_is_missing() -> None:
    source = '''
def documented(a: int, *rest: int, flag: bool = False) -> int:
    """Sum.

    Args:
        a: first.
        *rest, flag: the others.

    Returns:
        The sum.

    Raises:
        ValueError: when a is negative.
    """
    if a < 0:
        raise ValueError("negative")
    return a


def undocumented(a, b):
    """Nothing said."""
    if a:
        raise KeyError(a)
    return b


def partial(a, b):
    """Partly.

    Args:
        a: one.

    Raises:
        KeyError: never.
    """
    try:
        raise ValueError(a)
    except ValueError as error:
        raise error
    raise TypeError(b)


def reraises() -> None:
    try:
        pass
    except OSError:
        raise


def generates(n):
    """Counts.

    Args:
        n: how far.
    """
    yield from range(n)


def wrapped(a):
    """Wrapped as mkdocstrings would misread it.

    Args:
        a: the first line
        goes on unindented.

    Returns:
        One line
        and another.
    """
    return a


def dotted(text):
    """A dotted exception name.

    Args:
        text: the text.

    Raises:
        argparse.ArgumentTypeError: always.
    """
    raise argparse.ArgumentTypeError(text)


def add_thing_parser(subparsers):
    pass


def _private(a):
    return a


class Thing:
    """A thing.

    Args:
        size: its size.
    """

    def __init__(self, size: int, colour: str) -> None:
        self.size = size

    @property
    def area(self) -> int:
        return self.size

    def __len__(self) -> int:
        return self.size

    def stub(self) -> int:
        ...
'''
    assert check_source(source) == [
        "Args:undocumented: takes a, b but has no Args:",
        "Returns:undocumented: returns a value but has no Returns:",
        "Raises:undocumented: raises KeyError but has no Raises:",
        "Args:partial: Args: does not name b",
        "Raises:partial: Raises: does not name TypeError",
        "Yields:generates: yields but has no Yields:",
        "format:wrapped: Args: 'goes on unindented.' is neither an entry nor indented under one",
        "format:wrapped: Returns: 'One line' is neither an entry nor indented under one",
        "format:wrapped: Returns: 'and another.' is neither an entry nor indented under one",
        "Args:__init__: no Args entry (class or __init__) for colour",
        "Returns:stub: returns a value but has no Returns:",
    ]
