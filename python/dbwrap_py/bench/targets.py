"""What the benchmarks run on: which adapters, with which options and servers.

* landed_adapters(): the built-in adapters that import (an adapter still in
  progress that fails to import is left out), optionally only the ones
  several smbd processes can share;
* split_options(): ``-o K=V`` for every adapter, ``-o ADAPTER:K=V`` for one;
* servers(): starts the throwaway server of every networked adapter whose
  options name no endpoint, stopped when the ExitStack closes;
* ready_adapters(): all three, for the `bench` commands;
* over_transports(): each ready adapter in process and through the node
  daemon (``--transports inproc,proxy``), in one run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack

from dbwrap_py.errors import DbwrapError
from dbwrap_py.nodecache.adapter import node_cache_mode
from dbwrap_py.nodecache.cache import WRITE_BACK
from dbwrap_py.options import Options
from dbwrap_py.registry import adapter_names, find_adapter
from dbwrap_py.servers import backend_options
from dbwrap_py.testing.hooks import hooks_for

NATIVE = "native"


def landed_adapters(multi_process_only: bool = False) -> list[str]:
    """Built-in adapters that import, tdb first."""
    names = []
    for name in adapter_names():
        try:
            caps = find_adapter(name).capabilities
        except DbwrapError:
            continue
        if caps.multi_process or not multi_process_only:
            names.append(name)
    return sorted(names, key=lambda n: (n != "tdb", n))


def display_name(adapter: str, options: Mapping[str, str]) -> str:
    """How results of ``adapter`` run with ``options`` are labelled: its
    test hooks' ``target_label`` (``fdb (model)`` on the model of
    FoundationDB; the name itself for what is not an adapter, ``native``);
    `` via proxy`` when the node daemon runs it (``transport=proxy``), ``
    via proxy, fast path`` when smbd reaches the node cache's records itself
    (``proxy_fastpath``)."""
    try:
        label = hooks_for(adapter).target_label(adapter, options)
    except DbwrapError:
        return adapter
    if options.get("transport") != "proxy":
        return label
    # the fast path (on unless turned off) reaches only a write-back node cache
    fast = options.get("proxy_fastpath", "yes").lower() not in ("no", "false", "off", "0", "")
    try:
        fast = fast and node_cache_mode(Options(dict(options))) == WRITE_BACK
    except DbwrapError:
        fast = False
    return f"{label} via proxy, fast path" if fast else f"{label} via proxy"


def parse_adapters(text: str, multi_process_only: bool = False) -> list[str]:
    """``auto`` (every landed adapter) or a comma list; ``native`` is dropped
    (native tdb is always measured as the reference)."""
    if text.strip() in ("", "auto", "all"):
        return landed_adapters(multi_process_only)
    return [a.strip() for a in text.split(",") if a.strip() and a.strip() != NATIVE]


def split_options(pairs: Sequence[str], adapters: Sequence[str]) -> dict[str, dict[str, str]]:
    """``K=V`` applies to every adapter, ``ADAPTER:K=V`` to that one only
    (``locking.tdb:K=V``, a per-database option, applies to every adapter)."""
    options: dict[str, dict[str, str]] = {a: {} for a in adapters}
    for pair in pairs:
        key, _, value = pair.partition("=")
        target, _, rest = key.partition(":")
        if rest and target in options:
            options[target][rest] = value
            continue
        for adapter in adapters:
            options[adapter].setdefault(key, value)
    return options


def servers(stack: ExitStack, adapters: Sequence[str], options: Mapping[str, Mapping[str, str]],
            on_error: Callable[[str, str], None] = lambda *_: None) -> dict[str, dict[str, str]]:
    """Options to reach each adapter's backend, throwaway servers started as
    needed. Adapters whose server would not start are reported and left out."""
    ready: dict[str, dict[str, str]] = {}
    for adapter in adapters:
        given = dict(options.get(adapter, {}))
        try:
            ready[adapter] = stack.enter_context(backend_options(adapter, given))
        except Exception as exc:  # a server that fails to start skips one adapter
            on_error(adapter, f"{type(exc).__name__}: {exc}")
    return ready


def ready_adapters(text: str, pairs: Sequence[str], multi_process_only: bool, stack: ExitStack,
                   say: Callable[[str], None]) -> dict[str, dict[str, str]]:
    """The adapters named by ``text`` (see parse_adapters), each with the
    options that reach it, throwaway servers started on ``stack``."""
    adapters = parse_adapters(text, multi_process_only)
    return servers(stack, adapters, split_options(pairs, adapters),
                   on_error=lambda adapter, why: say(f"skipping {adapter}: {why}"))


#: proxy: every call to the node daemon (proxy_fastpath = no); proxy-fastpath:
#: smbd reaches a write-back node cache itself (the default in smb.conf)
TRANSPORTS = ("inproc", "proxy", "proxy-fastpath")


def parse_transports(text: str) -> list[str]:
    """``--transports``: empty keeps what the options say; else a comma list
    of ``inproc``, ``proxy`` and ``proxy-fastpath``."""
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    unknown = sorted(set(chosen) - set(TRANSPORTS))
    if unknown:
        raise DbwrapError(f"--transports: {', '.join(unknown)} is not one of {', '.join(TRANSPORTS)}")
    return chosen


def over_transports(stack: ExitStack, ready: Mapping[str, Mapping[str, str]], transports: Sequence[str],
                    say: Callable[[str], None]) -> list[tuple[str, dict[str, str]]]:
    """(adapter, options) once per transport, in that order; a proxy run
    gets a throwaway node daemon of its own (unless ``proxy_socket`` names
    one), so two adapters never share a daemon's adapter thread. No
    ``transports``: each adapter once, as its options say."""
    runs: list[tuple[str, dict[str, str]]] = []
    for adapter, options in ready.items():
        for transport in transports or [options.get("transport", "inproc")]:
            wanted = {**options, "transport": transport.partition("-")[0]}
            if wanted["transport"] == "proxy":
                wanted["proxy_fastpath"] = "yes" if transport == "proxy-fastpath" else "no"
            if wanted["transport"] != "proxy":
                runs.append((adapter, wanted))
                continue
            try:
                runs.append((adapter, stack.enter_context(backend_options(adapter, wanted))))
            except Exception as exc:  # a daemon that fails to start skips one run
                say(f"skipping {adapter} via proxy: {type(exc).__name__}: {exc}")
    return runs
