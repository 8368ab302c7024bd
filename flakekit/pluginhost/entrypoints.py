"""The ``flakekit`` entry points of the installed distributions, read once per process.

Why not simply :func:`importlib.metadata.entry_points`: importing importlib.metadata
pulls in ``email``, ``zipfile``, ``tempfile`` and ``socket`` (about 30 ms here, more than
``import click`` itself), and every ``flakekit`` command, ``--help`` and ``decode``
included, must read the entry points (plugins add commands and layouts). So the common
case -- distributions installed as ``*.dist-info`` / ``*.egg-info`` directories in the
directories of :data:`sys.path` -- is read here with ``os.scandir`` and a few lines of
text parsing, in importlib.metadata's order and with its rules (first distribution of a
normalised name wins). Anything else -- a zip file on the path, or an import hook that
finds distributions of its own -- falls back to importlib.metadata, so nothing is missed.
Only the distributions that have a ``flakekit`` entry point get their METADATA read.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any

__all__ = ["EntryPoint", "flakekit_entry_points", "read_entry_points"]

_NORMALISE = re.compile(r"[-_.]+")
#: importlib.metadata.EntryPoint.pattern: ``module``, ``module:attr.sub``, ``[extras]``
_VALUE = re.compile(r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$")


class EntryPoint:
    """One entry point (``name = value`` of a group), loadable like importlib's."""

    __slots__ = ("dist", "group", "name", "value", "version")

    def __init__(self, name: str, value: str, group: str, dist: str | None,
                 version: str | None) -> None:
        self.name, self.value, self.group = name, value, group
        self.dist, self.version = dist, version

    def load(self) -> Any:
        """Import the module (and walk to the attribute) the value names."""
        match = _VALUE.match(self.value)
        if match is None:
            raise ValueError(f"entry point {self.name!r}: {self.value!r} is not "
                             "'module' or 'module:attribute'")
        obj: Any = importlib.import_module(match.group("module"))
        for part in filter(None, (match.group("attr") or "").split(".")):
            obj = getattr(obj, part)
        return obj

    def __repr__(self) -> str:
        return f"EntryPoint(name={self.name!r}, value={self.value!r}, group={self.group!r})"


def _sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """``entry_points.txt`` (an INI file): group -> [(name, value)]."""
    out: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = out.setdefault(line[1:-1].strip(), [])
            continue
        name, sep, value = line.partition("=")
        if sep and current is not None:
            current.append((name.strip(), value.strip()))
    return out


def _headers(path: str) -> tuple[str | None, str | None]:
    """``Name`` and ``Version`` from a METADATA / PKG-INFO file's header block."""
    name = version = None
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break
                key, sep, value = line.partition(":")
                if sep and key.lower() == "name" and name is None:
                    name = value.strip()
                elif sep and key.lower() == "version" and version is None:
                    version = value.strip()
    except OSError:
        pass
    return name, version


def _scan(group: str, path: list[str]) -> list[EntryPoint] | None:
    """The group's entry points found in the directories of ``path``; None when part of
    ``path`` needs importlib.metadata (a zip file or an import hook's distributions)."""
    from importlib.machinery import PathFinder

    if any(hasattr(finder, "find_distributions") for finder in sys.meta_path
           if finder is not PathFinder):
        return None
    found: list[EntryPoint] = []
    seen: set[str] = set()
    for entry in path:
        where = entry or "."
        if os.path.isfile(where):
            return None  # a zip archive may hold distributions
        try:
            names = [e.name for e in os.scandir(where)]
        except OSError:
            continue
        infos = [n for n in names if n.endswith(".dist-info")]
        eggs = [n for n in names if n.endswith(".egg-info")]
        for info in infos + eggs:  # importlib.metadata's order: dist-info, then egg-info
            stem = info.rpartition(".")[0]
            key = _NORMALISE.sub("_", stem.split("-")[0]).lower()
            if key in seen:
                continue
            base = os.path.join(where, info)
            if not os.path.isdir(base):
                continue
            seen.add(key)
            try:
                with open(os.path.join(base, "entry_points.txt"), encoding="utf-8") as fh:
                    text = fh.read()
            except OSError:
                continue
            if f"[{group}]" not in text.replace(" ", ""):
                continue
            items = _sections(text).get(group)
            if not items:
                continue
            meta = os.path.join(base, "METADATA" if info in infos else "PKG-INFO")
            dist, version = _headers(meta)
            found += [EntryPoint(n, v, group, dist, version) for n, v in items]
    return found


def read_entry_points(group: str, path: list[str] | None = None) -> list[EntryPoint]:
    """Every entry point of ``group``, each with its distribution's name and version."""
    path = sys.path if path is None else path
    scanned = _scan(group, path)
    if scanned is not None:
        return scanned
    from importlib import metadata

    out = []
    seen: set[str] = set()
    for dist in metadata.distributions(path=path):  # entry_points()'s rules, on ``path``
        key = _NORMALISE.sub("_", dist.name or "").lower()
        if key in seen:
            continue
        seen.add(key)
        out += [EntryPoint(ep.name, ep.value, group, dist.name, dist.version)
                for ep in dist.entry_points if ep.group == group]
    return out


_CACHE: dict[str, list[EntryPoint]] = {}


def flakekit_entry_points(group: str = "flakekit") -> list[EntryPoint]:
    """:func:`read_entry_points` of ``group`` once per process (the plugin host may be
    built again, by tests or a reload; the installed distributions do not change)."""
    if group not in _CACHE:
        _CACHE[group] = read_entry_points(group)
    return _CACHE[group]
