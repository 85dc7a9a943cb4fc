"""Reading config files: YAML with YAML 1.2 scalars (``on``/``no``/``0755``/``1:30`` stay strings;
only ``true``/``false`` are booleans), a key repeated in one mapping refused, a bound on how far
aliases may expand; ``.json`` files as DeepSpeed configs; ``--set dotted.key=value``."""

from __future__ import annotations

import json
import os
import re

import yaml

from ..error_lines import brief
from ..safe_files import NotAFile, OverCap, excerpt, read_capped, why_not_a_file
from .options import ConfigError, _Float, _Int, _norm

MAX_YAML_VALUES = 100_000  # a config has a few hundred; aliases may not expand past this
MAX_YAML_DEPTH = 100  # levels of nesting (a config has at most 4 or 5)
MAX_INT_DIGITS = 1000  # far beyond any count or size; Python's own bound for int(str) is 4,300
MAX_CONFIG_BYTES = 4 << 20  # a config is a few KiB (10,000 data paths: ~0.5 MiB); the saved config.yml is read
# back with the same cap; PyYAML parses ~1 MiB/s, so this also bounds the parse to seconds


def read_config_bytes(path: str) -> bytes:
    """The bytes of the config file ``path``, at most MAX_CONFIG_BYTES: a larger file (by fstat, and by
    a capped read, so a file that keeps growing or a /dev/zero-like one ends too) is one line. Opened
    non-blocking: a FIFO or device is refused, never waited on (:func:`safe_files.read_capped`)."""
    too_big = f"a config file is at most {MAX_CONFIG_BYTES:,} bytes ({MAX_CONFIG_BYTES >> 20} MiB)"
    try:
        return read_capped(path, MAX_CONFIG_BYTES)
    except NotAFile:
        raise ConfigError(f"config file {path} is not a regular file; refusing to read it") from None
    except OverCap as e:
        if e.size is None:
            raise ConfigError(f"{path} holds more than {MAX_CONFIG_BYTES:,} bytes; {too_big}") from None
        raise ConfigError(f"{path} is {e.size:,} bytes; {too_big}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None


def _decode(path: str, raw: bytes) -> str:
    """UTF-8 (optionally with a BOM) or UTF-16/32 with a BOM, as YAML allows; else one line."""
    for bom, enc in (  # noqa: B007 (enc is read after the loop)
        (b"\x00\x00\xfe\xff", "utf-32-be"),
        (b"\xff\xfe\x00\x00", "utf-32-le"),
        (b"\xef\xbb\xbf", "utf-8-sig"),
        (b"\xfe\xff", "utf-16"),
        (b"\xff\xfe", "utf-16"),
    ):
        if raw.startswith(bom):
            break
    else:
        enc = "utf-8"
    try:
        return raw.decode(enc)
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path}: not valid {enc.upper().replace('-SIG', '')} text (byte 0x{raw[e.start]:02x} at "
            f"offset {e.start}); save the file as UTF-8"
        ) from None


class _Recursive(Exception):
    pass


class YamlBoundError(ConfigError):
    """A config YAML past a bound (recursive, too deep, expanding too far): refused as a whole,
    also for a ``--set`` value (never taken as plain text instead)."""


def _children(obj):
    if isinstance(obj, dict):
        return list(obj.values())
    if isinstance(obj, (list, tuple)):
        return list(obj)
    return ()


def _expanded_size(obj, limit: int, memo: dict, depth_limit: int = 0) -> int:
    """How many values ``obj`` holds once every alias is expanded (memoised: linear time; an
    explicit stack, so neither a deep nor a recursive structure can exhaust Python's).
    Raises _Recursive for a structure that contains itself (``a: &a [*a]``), and, with
    ``depth_limit``, ValueError(depth) for one nested deeper than that."""
    on_path: set = set()
    stack = [(obj, iter(_children(obj)), 1)]
    on_path.add(id(obj))
    counts = [1]
    while stack:
        node, it, depth = stack[-1]
        child = next(it, _DONE)
        if child is _DONE:
            stack.pop()
            on_path.discard(id(node))
            n = counts.pop()
            if _children(node):
                memo[id(node)] = n
            if counts:
                counts[-1] = min(counts[-1] + n, limit + 1)
            else:
                return n
            continue
        if counts[-1] > limit:
            continue  # past the bound already: no need to look further
        if id(child) in on_path:
            raise _Recursive()
        if id(child) in memo:
            counts[-1] = min(counts[-1] + memo[id(child)], limit + 1)
            continue
        if not _children(child):
            counts[-1] += 1
            continue
        if depth_limit and depth + 1 > depth_limit:
            raise ValueError(depth + 1)
        on_path.add(id(child))
        stack.append((child, iter(_children(child)), depth + 1))
        counts.append(1)
    return counts[0] if counts else 1


_DONE = object()


def parse_yaml(text: str, name: str):
    """Parse config YAML (safe, YAML 1.2 scalars, bounded alias expansion); ConfigError on failure."""
    try:
        loader = _UniqueKeyLoader(text)
        loader.name = name
        loader.paths = {}  # id(node) -> the dotted key it is the value of
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{name}:{at} invalid YAML: {problem}") from None
    except RecursionError:
        raise YamlBoundError(f"{name}: invalid YAML: nested too deeply") from None
    except ConfigError:
        raise
    except Exception as e:  # a construction step outside construct_object (PyYAML's deferred generators)
        raise YamlValueError(f"{name}: invalid YAML: {type(e).__name__}: {e}") from None
    check_bounds(data, name)
    return data


def check_bounds(data, name: str) -> None:
    """YamlBoundError when ``data`` contains itself, is nested too deeply or expands too far."""
    try:
        size = _expanded_size(data, MAX_YAML_VALUES, {}, MAX_YAML_DEPTH)
    except _Recursive:
        raise YamlBoundError(
            f"{name}: a recursive alias (an &anchor used inside itself, as in 'a: &a [*a]'); "
            f"a config value cannot contain itself"
        ) from None
    except ValueError:
        raise YamlBoundError(f"{name}: nested more than {MAX_YAML_DEPTH} levels deep; a config needs a few") from None
    if size > MAX_YAML_VALUES:
        raise YamlBoundError(
            f"{name}: the YAML expands to more than {MAX_YAML_VALUES:,} values through its aliases "
            f"(&anchor/*alias); a config needs a few hundred"
        )


def load_yaml(path: str) -> dict:
    if os.path.isdir(path):
        raise ConfigError(f"config file {path} is a directory; give a YAML file")
    if not os.path.isfile(path):
        why = why_not_a_file(path)
        raise ConfigError(f"config file not found: {path}" if why == "file not found" else f"config file {path} {why}")
    text = _decode(path, read_config_bytes(path))
    if path.lower().endswith(".json"):  # a DeepSpeed (or GPT-NeoX JSON) config

        def pairs(items):
            seen = set()
            for k, _ in items:
                if _norm(k) in seen:
                    raise ConfigError(f"{path}: key '{k}' is repeated in one object")
                seen.add(_norm(k))
            return dict(items)

        def no_nan(c):
            raise ValueError(f"{c} is not a JSON number")

        try:  # numbers keep their text, as YAML's do: `1e-400` is not an integer (coerce.names_an_integer)
            data = json.loads(
                text, object_pairs_hook=pairs, parse_constant=no_nan, parse_int=_json_int(path), parse_float=_json_float
            )
        except RecursionError:
            raise ConfigError(f"{path}: invalid JSON: nested too deeply") from None
        except ValueError as e:
            if isinstance(e, ConfigError):
                raise
            where = f" line {e.lineno}:" if hasattr(e, "lineno") else ""
            raise ConfigError(f"{path}:{where} invalid JSON: {getattr(e, 'msg', e)}") from None
        check_bounds(data, path)
        if data is not None and not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
        return data or {}
    return parse_yaml(text, path) or {}


# the numbers' grammar (YAML 1.2 core, and Python's rule for '_': only between digits, as int()/float() say)
_DIGITS = r"[0-9]+(?:_[0-9]+)*"
_INT_TEXT = re.compile(rf"[-+]?(?:{_DIGITS}|0o[0-7]+(?:_[0-7]+)*|0x[0-9a-fA-F]+(?:_[0-9a-fA-F]+)*)")
_FLOAT_TEXT = re.compile(
    rf"[-+]?(?:{_DIGITS}(?:\.(?:{_DIGITS})?)?|\.{_DIGITS})(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
)
_VALID = {
    "int": "an integer; valid: digits with an optional sign, 0x hex or 0o octal, '_' only between digits (5, -3, 0x10)",
    "float": "a number; valid: e.g. 6e-4, 1.5, 10, .inf ('_' only between digits)",
    "bool": "a boolean; valid: true or false",
}


class YamlValueError(ConfigError):
    """A scalar that its explicit tag (``!!int``, ``!!float``, ``!!bool``, ``!!timestamp`` ...) cannot
    read: refused with the file, line and key, also for a ``--set`` value (never taken as text)."""


class _BadScalar(ValueError):
    """Raised by a constructor: the scalar's text is not ``kind`` (a key of _VALID)."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


def _too_many_digits(where: str, body: str) -> None:
    if len(body) > MAX_INT_DIGITS:  # Python refuses to convert more than 4,300 digits: say so, one line
        raise ConfigError(f"{where}an integer of {len(body):,} digits; a config value has at most {MAX_INT_DIGITS}")


def _json_int(path: str):
    def parse(text: str) -> _Int:
        _too_many_digits(f"{path}: ", text.lstrip("-"))
        out = _Int(int(text))
        out.text = text
        return out

    return parse


def _json_float(text: str) -> _Float:
    out = _Float(float(text))
    out.text = text
    return out


def _yaml_int(loader, node):
    text = loader.construct_scalar(node)
    if not _INT_TEXT.fullmatch(text):
        raise _BadScalar("int")
    t = text.replace("_", "")
    sign, body = (-1, t[1:]) if t[:1] == "-" else (1, t.lstrip("+"))
    _too_many_digits(f"{loader.name}: line {node.start_mark.line + 1}: ", body)
    v = int(body[2:], 8) if body.startswith("0o") else int(body[2:], 16) if body.startswith("0x") else int(body, 10)
    out = _Int(sign * v)
    out.text = text
    return out


def _yaml_float(loader, node):
    text = loader.construct_scalar(node)
    if not _FLOAT_TEXT.fullmatch(text):
        raise _BadScalar("float")
    out = _Float(float(text.replace("_", "").lower().replace(".inf", "inf").replace(".nan", "nan")))
    out.text = text
    return out


def _yaml_bool(loader, node):
    text = loader.construct_scalar(node)
    if text not in ("true", "True", "TRUE", "false", "False", "FALSE"):  # YAML 1.2: not yes/on/1
        raise _BadScalar("bool")
    return text.lower() == "true"


class _UniqueKeyLoader(yaml.SafeLoader):
    """Safe loader with YAML 1.2 core-schema scalars (``yes``/``on``/``0755``/``1:30`` are not
    booleans, octals or sexagesimals) that rejects a key repeated inside one mapping (including
    `a_b` vs `a-b`); merge keys (``<<: *base``) work, explicit keys overriding merged ones."""

    def compose_node(self, parent, index):
        # count while composing: a 4 MiB list of 2 million items is refused after 100,000 of them, in
        # seconds, not parsed whole first (PyYAML composes ~20,000 nodes a second on a loaded CPU)
        self.nodes = getattr(self, "nodes", 0) + 1
        if self.nodes > MAX_YAML_VALUES:
            raise YamlBoundError(
                f"{self.name}: more than {MAX_YAML_VALUES:,} values (line {self.peek_event().start_mark.line + 1}); "
                f"a config needs a few hundred"
            )
        return super().compose_node(parent, index)

    def construct_object(self, node, deep=False):
        """Any constructor's failure (an explicit tag whose text it cannot read: ``!!int 1e-400``,
        ``!!bool 1``, ``!!timestamp 2024-13-45``) is one YamlValueError naming where it is."""
        try:
            return super().construct_object(node, deep=deep)
        except (ConfigError, yaml.YAMLError, RecursionError):
            raise
        except Exception as e:
            raise self._bad_value(node, e) from None

    def _bad_value(self, node, e: Exception) -> YamlValueError:
        tag = str(node.tag)
        short = "!!" + tag[len("tag:yaml.org,2002:") :] if tag.startswith("tag:yaml.org,2002:") else tag
        value = (node.value or "''") if isinstance(node.value, str) else ""  # an empty value shown as written
        at = "" if self.name.startswith("--set ") else f" line {node.start_mark.line + 1}:"
        key = self.paths.get(id(node))
        what = f"is not {_VALID[e.kind]}" if isinstance(e, _BadScalar) else f"cannot be read as {short}: {e}"
        return YamlValueError(f"{self.name}:{at}{f' {key}:' if key else ''} {excerpt(f'{short} {value}', 60)} {what}")

    def _child_path(self, node, name: str) -> str:
        parent = self.paths.get(id(node), "")
        return f"{parent}.{name}" if parent and not name.startswith("[") else f"{parent}{name}"

    def construct_sequence(self, node, deep=False):
        if isinstance(node, yaml.SequenceNode):
            for i, child in enumerate(node.value):
                self.paths.setdefault(id(child), self._child_path(node, f"[{i}]"))
        return super().construct_sequence(node, deep=deep)

    def construct_mapping(self, node, deep=False):
        if not isinstance(node, yaml.MappingNode):  # `!!map [1]`: PyYAML's one-line ConstructorError
            return super().construct_mapping(node, deep=deep)
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            k = _norm(key)
            if k in seen:
                raise ConfigError(
                    f"{self.name}: line {key_node.start_mark.line + 1}: key '{key}' is repeated "
                    f"(first set on line {seen[k] + 1})"
                )
            seen[k] = key_node.start_mark.line
        self.flatten_mapping(node)  # the keys merged in (<<: *base) too, for naming a bad value
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                self.paths.setdefault(id(value_node), self._child_path(node, str(key_node.value)))
        return super().construct_mapping(node, deep=deep)


_CORE = {
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:timestamp",
    "tag:yaml.org,2002:value",
}  # YAML 1.1 only: dates and '=' stay strings
_UniqueKeyLoader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in rs if tag not in _CORE] for ch, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+(?:_[0-9]+)*|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(rf"^(?:{_FLOAT_TEXT.pattern})$"), list("-+0123456789.")
)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _yaml_int)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float", _yaml_float)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:bool", _yaml_bool)


def parse_set(expr: str, is_text=None) -> dict:
    """``a.b.c=value`` -> {'a': {'b': {'c': value}}} with the value parsed as YAML, except where
    ``is_text(parts)`` says the key's declared type is a string: then the value is the text as
    written (``save=run #2/ck`` keeps its ``#``), unless it is quoted YAML or ``null``; a bare ``~``
    there is refused (null to YAML, the home folder to a shell: which one was meant?)."""
    if "=" not in expr:
        raise ConfigError(f"--set {excerpt(expr, 60)}: expected dotted.key=value")
    key, raw = expr.split("=", 1)
    parts = key.strip().split(".")
    if not all(p.strip() for p in parts):
        raise ConfigError(
            f"--set {excerpt(expr, 60)}: empty key name in {excerpt(key.strip(), 60)}; expected dotted.key=value"
        )
    text = raw.strip()
    quoted = len(text) >= 2 and text[0] == text[-1] and text[0] in "'\""
    if is_text is not None and is_text(parts) and text == "~":  # YAML's null, or a path to the home folder?
        raise ConfigError(
            f"--set {excerpt(expr, 60)}: '~' is ambiguous for a path or text key (YAML reads it as null, a "
            f"shell as the home folder); write {key.strip()}=null to leave it unset, or the path itself"
        )
    if is_text is not None and is_text(parts) and not quoted and text not in ("null", "Null", "NULL"):
        value = text
    else:
        try:
            value = parse_yaml(raw, f"--set {brief(expr)}") if raw != "" else ""
        except (YamlBoundError, YamlValueError):
            raise
        except ConfigError:
            value = raw  # not YAML: the text itself
    out: dict = {}
    cur = out
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out
