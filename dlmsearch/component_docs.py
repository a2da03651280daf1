"""The component reference, ``docs/components.md``, generated from the code so that it cannot drift.

Every option of every component group (``dlmsearch/conf/decoder/<group>/<option>.yaml``, and
``dlmsearch/conf/cache/<option>.yaml``) builds the class its ``_target_`` names. For each option the
page gives that class, the first sentence of its docstring, the comment at the top of the option's
file, and one row per parameter a YAML can set (the class's attrs fields that ``__init__`` takes):
its name, its type, the value the option sets (else the class's default) and a note, the comment
beside the key in the option's file, else the one beside the field in the class.

    python -m dlmsearch.component_docs            # print the generated part
    python -m dlmsearch.component_docs --check    # exit 1 where docs/components.md is not current
    python -m dlmsearch.component_docs --write    # rewrite docs/components.md between its markers

The page lives in the repository (``docs/``), not in the wheel: ``--check`` and ``--write`` need a checkout.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import yaml

CONF = Path(__file__).resolve().parent / "conf"
PAGE = Path(__file__).resolve().parents[1] / "docs" / "components.md"
BEGIN = "<!-- BEGIN GENERATED: python -m dlmsearch.component_docs --write -->"
END = "<!-- END GENERATED -->"
REFRESH = "python -m dlmsearch.component_docs --write"

# The decoder's slots in the order a decoder YAML lists them; groups not named here follow, sorted.
ORDER = ["commit", "trigger", "candidates", "scorer", "expansion", "selector", "tree", "population", "generation"]
DECODER = "dlmsearch.search.driver.SearchDecoder"
HYDRA_KEYS = {"_target_", "_convert_", "_recursive_", "_partial_", "defaults"}


@attrs.frozen
class Option:
    """One YAML file of a group: ``decoder/expansion`` + ``variance_gate``, its merged content and comments."""

    group: str  # the group as a command line names it: decoder/expansion, cache
    name: str
    config: dict[str, Any]  # the file's keys, after its own defaults (a sibling option, subgroups) are applied
    subgroups: dict[str, str]  # key -> the option a defaults entry chose for it (population: diversity -> ...)
    header: str  # the comment at the top of the file
    notes: dict[str, str]  # dotted key -> the comment beside it


def groups() -> list[str]:
    """The component groups: every folder under ``conf/decoder/`` (nested ones too), then ``cache``."""
    found = [str(p.relative_to(CONF)) for p in (CONF / "decoder").rglob("*") if p.is_dir()]

    def rank(group: str) -> tuple[int, str]:
        slot = group.split("/")[1]
        return (ORDER.index(slot) if slot in ORDER else len(ORDER), group)

    return [*sorted(found, key=rank), "cache"]


def options(group: str) -> list[Option]:
    """The options of one group, in name order."""
    return [load_option(group, path.stem) for path in sorted((CONF / group).glob("*.yaml"))]


def load_option(group: str, name: str) -> Option:
    """Read ``conf/<group>/<name>.yaml``: a defaults entry naming a sibling option is merged under
    the file's own keys; one naming a subgroup (``- diversity: order_temperature``) is recorded."""
    path = CONF / group / f"{name}.yaml"
    text = path.read_text()
    raw = yaml.safe_load(text) or {}
    config: dict[str, Any] = {}
    subgroups: dict[str, str] = {}
    notes: dict[str, str] = {}
    for entry in raw.get("defaults", []):
        if isinstance(entry, str) and entry != "_self_":
            base = load_option(group, entry)
            config, notes = merged(config, base.config), {**notes, **base.notes}
        elif isinstance(entry, dict):
            subgroups.update({str(k): str(v) for k, v in entry.items()})
    own = {k: v for k, v in raw.items() if k != "defaults"}
    return Option(group, name, merged(config, own), subgroups, header(text), {**notes, **key_comments(text)})


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``, mappings merged key by key (as Hydra composes)."""
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if both else value
    return out


def header(text: str) -> str:
    """The comment lines before a YAML file's first key, joined (``# @package`` lines left out)."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            lines.append(line.lstrip("#").strip())
    return " ".join(line for line in lines if line)


def key_comments(text: str) -> dict[str, str]:
    """Dotted key -> the ``# comment`` on that key's line, for the mapping keys of a YAML file."""
    notes: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        match = re.match(r"^(\s*)(\w+):(.*)$", line)
        if not match:
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        comment = trailing_comment(rest)
        if comment:
            notes[".".join(k for _, k in stack)] = comment
    return notes


def trailing_comment(line: str) -> str:
    """The text after the first ``#`` that follows whitespace outside quotes, else nothing."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and i > 0 and line[i - 1].isspace():
            return line[i + 1 :].strip()
    return ""


def resolve(target: str) -> tuple[Any, type]:
    """The callable a ``_target_`` names, and the class it builds (a classmethod's class)."""
    module, _, name = target.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError:
        outer, _, owner = module.rpartition(".")
        obj = getattr(getattr(importlib.import_module(outer), owner), name)
    return obj, obj if inspect.isclass(obj) else obj.__self__


def settable(cls: type) -> list[attrs.Attribute]:
    """The fields a YAML can set: the ones ``__init__`` takes, less state hidden from ``repr``."""
    return [a for a in attrs.fields(cls) if a.init and a.repr] if attrs.has(cls) else []


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> the comment beside it in the class body (or on the lines just above it)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    notes: dict[str, str] = {}
    above: list[str] = []
    for line in source.splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^\s+(\w+)\s*:[^#]*?(?:#\s*(.*))?$", line)
        if match and (match.group(2) or above):
            notes.setdefault(match.group(1), match.group(2) or " ".join(above))
        above = []
    return notes


def summary(cls: type) -> str:
    """The first sentence of the class's own docstring, roles (``:class:`~a.B```) reduced to names."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    paragraph = " ".join(doc.split("\n\n")[0].split())
    depth, quoted = 0, False
    for i, ch in enumerate(paragraph):
        quoted = not quoted if ch == "`" else quoted
        depth += (ch == "(") - (ch == ")") if not quoted else 0
        if ch in ".!?" and depth == 0 and not quoted and (i + 1 == len(paragraph) or paragraph[i + 1] == " "):
            paragraph = paragraph[: i + 1]
            break
    return markdown(re.sub(r":$", ".", paragraph))


def markdown(text: str) -> str:
    """reStructuredText spans as Markdown: ``:role:`~a.b.C``` -> ``C``, double backticks -> single."""
    text = re.sub(r":\w+:`~?([\w.]+)`", lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text)
    return text.replace("``", "`")


def literal(value: Any) -> str:
    """A value as YAML writes it, compact: mappings with a ``_target_`` as ``Class(key=value, ...)``."""
    if isinstance(value, dict):
        items = {k: v for k, v in value.items() if k not in HYDRA_KEYS}
        inner = ", ".join(f"{k}={literal(v)}" for k, v in items.items())
        target = value.get("_target_")
        return f"{target.rsplit('.', 1)[-1]}({inner})" if target else "{" + inner + "}"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def default(field: attrs.Attribute) -> str:
    """The class's default for a field: ``required``, a value, or the class a factory builds."""
    if field.default is attrs.NOTHING:
        return "required"
    if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
        factory = field.default.factory
        return f"{factory.__name__}()" if inspect.isclass(factory) else "computed"
    return literal(field.default)


def type_name(annotation: Any) -> str:
    """A field's annotation as the source writes it."""
    if annotation is None or annotation is inspect.Parameter.empty:
        return ""
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def cell(text: str) -> str:
    """Text for a Markdown table cell: pipes escaped, empty as nothing."""
    return text.replace("|", "\\|")


def code(text: str) -> str:
    """A code span, or nothing for empty text."""
    return f"`{text}`" if text else ""


def anchor(group: str) -> str:
    """The heading anchor of a group's section (GitHub's: lower case, punctuation dropped)."""
    return re.sub(r"[^\w\- ]", "", f"`{group}`".lower()).replace(" ", "-")


def rows(
    target: str,
    values: dict[str, Any],
    notes: dict[str, str],
    prefix: str = "",
    subgroups: dict[str, tuple[str, str]] | None = None,
) -> Iterator[str]:
    """One table row per parameter of ``target`` (the option's value, else the class's default); a
    value that is itself a component (a mapping with a ``_target_``) gets its own rows below it.
    ``subgroups``: key -> (option, group) where a defaults entry chose the value from a group."""
    subgroups = subgroups or {}
    obj, cls = resolve(target)
    source_notes = field_comments(cls)
    fields = {a.name: a for a in settable(cls)}
    signature = {} if obj is cls else inspect.signature(obj).parameters
    extra = [k for k in values if k not in fields and k not in HYDRA_KEYS]  # a factory's own parameters
    for key in [*extra, *fields]:
        field = fields.get(key)
        kind = type_name(field.type if field is not None else getattr(signature.get(key), "annotation", None))
        name = f"{prefix}{key}"
        note = notes.get(name, source_notes.get(key, ""))
        if key in subgroups:
            chosen, group = subgroups[key]
            yield f"| `{name}` | {cell(code(kind))} | `{chosen}` ([options](#{anchor(group)})) | {cell(note)} |"
            continue
        value = values.get(key)
        shown = literal(value) if key in values else default(field) if field is not None else ""
        if isinstance(value, dict) and "_target_" in value:
            shown = value["_target_"].rsplit(".", 1)[-1]
        yield f"| `{name}` | {cell(code(kind))} | {cell(code(shown))} | {cell(note)} |"
        if isinstance(value, dict) and "_target_" in value:
            yield from rows(value["_target_"], value, notes, f"{name}.")


def table(body: list[str]) -> list[str]:
    """A parameter table, or a line saying there is nothing to set."""
    if not body:
        return ["No parameters.", ""]
    return ["| parameter | type | value | note |", "|---|---|---|---|", *body, ""]


def option_section(option: Option) -> list[str]:
    """One option: its class, the class's summary, the file's own comment, its parameters."""
    target = option.config.get("_target_")
    if target is None:  # decoder/generation: keys of the decoder itself, merged in with generation@_here_
        target, lead = DECODER, "Keys of the decoder itself (`generation@_here_` in a decoder's defaults)"
    else:
        _, cls = resolve(target)
        lead = f"`{target}`" + (f": {summary(cls)}" if summary(cls) else "")
    lines = [f"**`{option.name}`**: {lead}", ""]
    if option.header:
        lines += [f"*The option's file:* {markdown(option.header)}", ""]
    keys = {k: v for k, v in option.config.items() if k not in HYDRA_KEYS}
    subgroups = {key: (chosen, f"{option.group}/{key}") for key, chosen in option.subgroups.items()}
    body = list(rows(target, keys, option.notes, subgroups=subgroups))
    if option.config.get("_target_") is None:  # only the keys the option sets, not every slot of the decoder
        body = [row for row in body if any(row.startswith((f"| `{k}`", f"| `{k}.")) for k in keys)]
    return lines + table(body)


def group_section(group: str) -> list[str]:
    """A group: how to choose an option and set a parameter, then every option."""
    slot = group.split("/", 1)[-1]
    if group == "decoder/generation":  # merged into the decoder itself (generation@_here_)
        choose = "`decoder/generation@decoder=NAME` on the command line, or `- generation@_here_: NAME` in a decoder YAML's `defaults`"
        setting = "`decoder.KEY=VALUE` (its keys are the decoder's own: `decoder.sampling.top_k=50`)"
    elif group.startswith("decoder/population/"):
        choose = f"`{group}=NAME` on the command line, or `- override {slot}: NAME` after the other entries of a decoder YAML's `defaults`"
        setting = f"`{group.replace('/', '.')}.PARAMETER=VALUE`"
    elif group.startswith("decoder/"):
        choose = f"`{group}=NAME` on the command line, or `- {slot}: NAME` in a decoder YAML's `defaults`"
        setting = f"`{group.replace('/', '.')}.PARAMETER=VALUE`"
    else:
        choose, setting = f"`{group}=NAME` on the command line", f"`{group}.PARAMETER=VALUE`"
    lines = [f"## `{group}`", "", f"Choose with {choose}; set a parameter with {setting}.", ""]
    for option in options(group):
        lines += option_section(option)
    return lines


def decoder_section() -> list[str]:
    """The decoder's own fields: the slots the groups fill and the settings beside them."""
    _, cls = resolve(DECODER)
    return [
        "## The decoder",
        "",
        f"`{DECODER}`: {summary(cls)} A decoder YAML sets `_target_` to it, names its slots' options in "
        + "`defaults` and may set any of these keys; the value column is the class's default.",
        "",
        *table(list(rows(DECODER, {}, {}))),
    ]


def inline_sections() -> list[str]:
    """Components that no group offers and a preset sets in its own file (``revision:`` with a
    ``_target_``), one section per key, one entry per preset."""
    found: dict[str, list[str]] = {}
    for path in sorted((CONF / "decoder").glob("*.yaml")):
        text = path.read_text()
        for key, value in (yaml.safe_load(text) or {}).items():
            if isinstance(value, dict) and "_target_" in value:
                _, cls = resolve(value["_target_"])
                entry = [f"**`{cls.__name__}`**, as `{path.stem}` sets it: `{value['_target_']}`: {summary(cls)}", ""]
                found.setdefault(key, []).extend(
                    entry + table(list(rows(value["_target_"], value, key_comments(text), f"{key}.")))
                )
    lines = []
    for key, entries in found.items():
        lines += [
            f"## `decoder.{key}`",
            "",
            f"No group offers these: a decoder's own file sets `{key}:` to a mapping with a `_target_` and its parameters,"
            + f" as the presets below do; set a parameter with `decoder.{key}.PARAMETER=VALUE`.",
            "",
            *entries,
        ]
    return lines


def generate() -> str:
    """The generated part of ``docs/components.md``, markers excluded."""
    names = groups()
    inline = inline_sections()
    sections = [*names, *(h[3:].strip("`") for h in inline if h.startswith("## "))]
    lines = ["Sections: " + " · ".join(f"[`{g}`](#{anchor(g)})" for g in sections), "", *decoder_section()]
    for group in names:
        lines += group_section(group)
    return "\n".join(lines + inline).rstrip() + "\n"


def current(page: str) -> str:
    """``page`` with its generated part replaced by what the code gives now."""
    start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
    return page[:start] + "\n" + generate() + page[end:]


def main(argv: list[str] | None = None) -> int:
    """Print the generated part, or check or rewrite the page; the exit status says how it went."""
    parser = argparse.ArgumentParser(prog="python -m dlmsearch.component_docs", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"rewrite {PAGE.name} between its markers")
    mode.add_argument("--check", action="store_true", help=f"exit 1 where {PAGE.name} is not current")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        sys.stdout.write(generate())
        return 0
    if not PAGE.is_file():
        print(f"error: {PAGE} not found (the page is in the repository's docs/, not in the wheel)", file=sys.stderr)
        return 2
    page = PAGE.read_text()
    if args.check:
        if current(page) != page:
            print(f"error: {PAGE} is not current; refresh it with: {REFRESH}", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(current(page))
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
