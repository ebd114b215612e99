"""YAML without surprises: a duplicate key is an error, and so is a document whose aliases
expand beyond any study file's size (a "billion laughs" bomb), before anything expands."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_NODES = 20_000  # a large study file has a few hundred
MAX_FILE = 1 << 20  # a study file (or an accelerate config file) is a few kB


class FileTextError(ValueError):
    """A file that is not a regular UTF-8 file of at most MAX_FILE bytes: the one-line text
    names it (as `read_text` was told to) and says what is wrong."""


def read_text(path: Path, name: str) -> str:
    """The text of `path`, a regular UTF-8 file of at most MAX_FILE bytes, read without ever
    blocking (a FIFO) or reading without end (a link to /dev/zero). FileTextError, naming the
    file as `name`, if it is not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise FileTextError(f"cannot read {name} ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a folder
        os.close(fd)
        raise FileTextError(f"{name} is not a regular file (a folder? a FIFO?)")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_FILE + 1)
    if len(data) > MAX_FILE:
        raise FileTextError(f"{name} is larger than {MAX_FILE} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileTextError(f"{name} is not UTF-8 text (byte {e.start})") from None


class YamlError(ValueError):
    """`line` (1-based, 0 if unknown) and a one-line `problem`."""

    def __init__(self, line: int, problem: str) -> None:
        self.line, self.problem = line, problem
        super().__init__(f"line {line}: {problem}" if line else problem)


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class says so
                continue
            if first is not None:
                raise YamlError(key_node.start_mark.line + 1,
                                f"duplicate key {key!r} (first on line {first + 1})")
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def expanded_size(root: yaml.Node) -> int:
    """How many nodes the document has once every alias is expanded (stops past MAX_NODES).
    YamlError if an alias refers to a value that contains it (`&a [*a]`): that expands without
    end."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # the nodes being expanded: the path from the root to this one
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if children_done or not children:
            sizes[id(node)] = min(MAX_NODES + 1, 1 + sum(sizes[id(c)] for c in children))
            open_.discard(id(node))
        elif id(node) in open_:  # reached again below itself: a cycle
            raise YamlError(node.start_mark.line + 1,
                            "an alias refers to the value that contains it")
        else:
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def load(text: str) -> Any:
    """Parse one YAML document safely; YamlError says where and what is wrong."""
    try:
        loader = _StrictLoader(text)
    except yaml.YAMLError as e:  # e.g. a NUL byte: the reader refuses it at once
        raise YamlError(0, f"YAML error: {str(e).splitlines()[0]}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if expanded_size(node) > MAX_NODES:
            raise YamlError(0, f"the document expands to more than {MAX_NODES} values "
                               "(aliases used as a bomb?)")
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise YamlError(mark.line + 1 if mark else 0,
                        f"YAML syntax error: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise YamlError(0, f"YAML error: {str(e).splitlines()[0]}") from None
    except RecursionError:
        raise YamlError(0, "the document is nested too deeply") from None
    finally:
        loader.dispose()
