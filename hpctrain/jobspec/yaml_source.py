"""Reading untrusted YAML: safe constructors only, duplicate keys rejected,
and a map from every dotted key to its line and column for error messages.

YAML 1.1 reads ``24:00:00`` as the base-60 integer 86400 — a trap for Slurm
time limits — so our loader resolves integers and floats the YAML 1.2 way.

Control characters are refused before parsing, each named with its line and
column (:func:`_check_characters`): C0 controls other than tab and line ends,
DEL, every C1 control (U+0080-U+009F, NEL among them) and the Unicode line
and paragraph separators. PyYAML reads NEL, U+2028 and U+2029 as line breaks
(a key hidden on what looks like a comment's line) and raised a traceback at
the others; no spec needs any of them.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

import yaml

from hpctrain.errors import SpecError, SpecProblem

MAX_SPEC_BYTES = 1_000_000
# Nodes that aliases may add to the document when expanded. A real spec has a few
# hundred nodes; nine nested aliases of nine items each ("billion laughs") add 10^9.
MAX_EXPANDED_NODES = 100_000
# Nesting depth of flow/block collections. A spec is at most ~5 deep; PyYAML's
# composer recurses per level, so 50,000 '[' would otherwise be a RecursionError.
MAX_NESTING = 100


_INT = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0o?[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
    r"|\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)


def _construct_mapping(loader: Any, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # '<<: *base' merges; keys written here override the merged ones
        if not isinstance(key_node, yaml.ScalarNode):
            raise yaml.constructor.ConstructorError(
                None, None, "a key must be a plain word such as 'nodes', not a list or mapping", key_node.start_mark
            )
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            first = seen[key].start_mark.line + 1
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first defined on line {first})", key_node.start_mark
            )
        seen[key] = key_node
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


def _refusing_bad_scalars(kind: str, construct: Any) -> Any:
    """A scalar constructor whose ValueError (a date like 2026-13-45, an integer of more than
    4300 digits) becomes a YAML error at the value's line, not a traceback."""

    def checked(loader: Any, node: yaml.ScalarNode) -> Any:
        try:
            return construct(loader, node)
        except (ValueError, OverflowError) as exc:
            shown = node.value if len(node.value) <= 40 else f"{node.value[:37]}... ({len(node.value)} characters)"
            reason = "too many digits" if "digits" in str(exc) else str(exc)
            raise yaml.constructor.ConstructorError(
                None, None, f"{shown!r} is not a valid {kind} ({reason}); quote it to keep it as text", node.start_mark
            ) from None

    return checked


def spec_loader(base: type[yaml.SafeLoader]) -> type[yaml.SafeLoader]:
    """The spec loader on ``base``'s parser: SafeLoader's constructors without sexagesimal numbers,
    with duplicate keys and bad scalars refused."""

    class SpecLoader(base):  # type: ignore[valid-type,misc]
        pass

    SpecLoader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    SpecLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
    SpecLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
    SpecLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    for tag, kind in (("int", "whole number"), ("float", "number"), ("timestamp", "date")):
        tag = f"tag:yaml.org,2002:{tag}"
        SpecLoader.add_constructor(tag, _refusing_bad_scalars(kind, yaml.SafeLoader.yaml_constructors[tag]))
    return SpecLoader


# libyaml's parser where PyYAML has it (its wheels do): 4x faster on a 100,000-value study axis (0.9 vs 3.9
# CPU s), 8x on a spec; the pure-Python parser otherwise. Resolving and constructing are Python in both.
_SpecLoader = spec_loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader))


_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029]")
MAX_CHARACTER_PROBLEMS = 10


def _check_characters(text: str, source: str) -> None:
    """A SpecError naming each control character (the module docstring), its line and column."""
    problems = []
    for match in _CONTROL.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        column = match.start() - (text.rfind("\n", 0, match.start()) + 1) + 1
        code = f"U+{ord(match.group()):04X}"
        problems.append(SpecProblem("", f"a control character ({code}) in the text; remove it", line, column))
        if len(problems) == MAX_CHARACTER_PROBLEMS:
            break
    if problems:
        raise SpecError(
            source,
            problems,
            hint="retype the line: a spec is plain text (an editor or a copy from a web page put it there)",
        )


def parse_yaml_text(text: str, source: str) -> tuple[Any, dict[str, tuple[int, int]]]:
    """Parse text; return the data and {dotted key: (line, column)}, 1-based."""
    _check_characters(text, source)
    _check_nesting(text, source)
    loader = None
    try:
        loader = _SpecLoader(text)  # its reader checks every character (ReaderError): inside the try
        node = loader.get_single_node()
        if node is not None:
            _check_expanded_size(node, source)
            data = loader.construct_document(node)
        else:
            data = None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        if "maximum nesting depth" in message:  # libyaml's own bound (its parser is not recursive)
            message = "nested too deeply"
        if "could not determine a constructor" in message:
            message = message.replace("could not determine a constructor for the tag", "YAML tag not allowed:")
            message += " (specs are plain data; remove the tag)"
        problem = SpecProblem(
            "", f"invalid YAML: {message}", mark.line + 1 if mark else None, mark.column + 1 if mark else None
        )
        raise SpecError(source, [problem], hint="fix the YAML syntax at that line") from None
    except yaml.YAMLError as exc:  # scanner errors without marks, etc.
        raise SpecError(source, [SpecProblem("", f"invalid YAML: {exc}")]) from None
    except RecursionError:  # a nesting _check_nesting could not see (e.g. inside block scalars' neighbours)
        raise SpecError(source, [SpecProblem("", "invalid YAML: nested too deeply")]) from None
    finally:
        if loader is not None:
            loader.dispose()
    positions: dict[str, tuple[int, int]] = {}
    if node is not None:
        _collect_positions(node, "", positions)
    return data, positions


def _check_nesting(text: str, source: str) -> None:
    """Refuse absurd nesting before the recursive composer sees it (cheap upper bound:
    brackets outside quotes are not tracked, so quoted brackets only make it stricter)."""
    depth = 0
    for line_no, line in enumerate(text.splitlines(), 1):
        for column, char in enumerate(line, 1):
            if char in "[{":
                depth += 1
                if depth > MAX_NESTING:
                    problem = SpecProblem("", f"invalid YAML: nested more than {MAX_NESTING} deep", line_no, column)
                    raise SpecError(source, [problem], hint="a job spec is a few levels of plain keys and lists")
            elif char in "]}":
                depth = max(0, depth - 1)


def _check_expanded_size(root: yaml.Node, source: str) -> None:
    """Refuse documents whose aliases add more than MAX_EXPANDED_NODES nodes to what is written.

    Only what aliases add counts: a long list written out (bounded by MAX_SPEC_BYTES) is
    left to the check that owns its key, which says what the limit there is and why.
    """
    sizes: dict[int, int] = {}

    def size(node: yaml.Node, depth: int) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        if depth > MAX_NESTING:
            raise SpecError(source, [SpecProblem("", f"invalid YAML: nested more than {MAX_NESTING} deep")])
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(item, depth + 1) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k, depth + 1) + size(v, depth + 1) for k, v in node.value)
        sizes[id(node)] = total
        # Without aliases a node's expanded size is at most the distinct nodes seen so far.
        if total > MAX_EXPANDED_NODES + len(sizes):
            mark = node.start_mark
            problem = SpecProblem(
                "",
                f"YAML aliases (*name) expand to more than {MAX_EXPANDED_NODES:,} values",
                mark.line + 1,
                mark.column + 1,
            )
            raise SpecError(source, [problem], hint="write the values out, or use fewer nested aliases")
        return total

    size(root, 0)


def _collect_positions(node: yaml.Node, prefix: str, out: dict[str, tuple[int, int]]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            out[key] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _collect_positions(value_node, key, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            key = f"{prefix}.{index}"
            out[key] = (item.start_mark.line + 1, item.start_mark.column + 1)
            _collect_positions(item, key, out)


def read_spec_file(path: Path) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    """Read a spec file as a mapping, with friendly errors for every bad-input case."""
    source = str(path)
    if not path.exists():
        raise SpecError(source, [SpecProblem("", "file not found")], hint="check the path; list specs with 'ls jobs/'")
    if path.is_dir():
        raise SpecError(
            source,
            [SpecProblem("", "is a directory, not a YAML file")],
            hint=f"pass a file inside it, e.g. {path}/quickstart.yaml",
        )
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block, /dev/zero never ends
            raise SpecError(
                source, [SpecProblem("", "is not a regular file (a device, pipe or socket)")], hint="pass a .yaml file"
            )
        with path.open("rb") as handle:
            raw = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(source, [SpecProblem("", f"cannot read: {exc.strerror}")]) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(source, [SpecProblem("", f"is over {MAX_SPEC_BYTES} bytes; a job spec is a small YAML file")])
    if b"\x00" in raw:
        raise SpecError(source, [SpecProblem("", "is a binary file, not YAML")], hint="pass a .yaml job spec")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            source, [SpecProblem("", f"is not UTF-8 text (byte {exc.start})")], hint="save the spec as UTF-8"
        ) from None
    data, positions = parse_yaml_text(text, source)
    if data is None:
        raise SpecError(
            source,
            [SpecProblem("", "is empty")],
            hint="start from an example: 'hpctrain init NAME' or copy jobs/quickstart.yaml",
        )
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise SpecError(
            source,
            [SpecProblem("", f"top level is a {kind}; a job spec is a mapping of keys")],
            hint="the file should start with 'name: ...', not '- ...'",
        )
    # Top-level 'x-...' keys hold anchors for '<<: *name' merges (the docker-compose convention).
    for key in [key for key in data if isinstance(key, str) and key.startswith("x-")]:
        del data[key]
    return data, positions


def dump_yaml(data: Any) -> str:
    """Stable, human-readable YAML for resolved specs written to run dirs."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
