#!/usr/bin/env python3
"""Generate config_keys.h from the agents' config schema (src/flowstat/schema/agent-config.schema.json):
the keys of the config files (--config FILE, --config-dir DIR), sorted by name, each with the option
it stands for (x-flag), its type (a list's: its items'), whether it is a list (x-list: a repeatable
option), the schema's default, written as that option takes it, and the values a string may take
(enum), if the schema names them. config.c reads the files with
this table and options.c checks each value as its option does: the keys are never written by hand
in C.

    gen_config_header.py CONFIG_SCHEMA OUT

Run by the Makefile; the header is a build product, never edited by hand.
"""

import json
import re
import sys
from pathlib import Path

TYPES = {"string": "FS_CT_STRING", "integer": "FS_CT_INTEGER", "number": "FS_CT_NUMBER", "boolean": "FS_CT_BOOLEAN"}
KEY = re.compile(r"^[a-z][a-z0-9_]*$")
FLAG = re.compile(r"^--[a-z][a-z0-9-]*$")


def main(src: str, dst: str) -> None:
    schema = json.loads(Path(src).read_text())
    if schema.get("additionalProperties") is not False:
        raise ValueError(f"{src}: additionalProperties must be false (unknown keys are errors)")
    rows = [row(name, prop) for name, prop in sorted(schema["properties"].items())]
    out = [
        "/* Generated from src/flowstat/schema/agent-config.schema.json by gen_config_header.py. Do not edit. */",
        "#ifndef FLOWSTAT_CONFIG_KEYS_H",
        "#define FLOWSTAT_CONFIG_KEYS_H",
        "",
        "enum fs_config_type { FS_CT_STRING, FS_CT_INTEGER, FS_CT_NUMBER, FS_CT_BOOLEAN };",
        "",
        "struct fs_config_key {",
        "    const char *name; /* the key in the files */",
        '    const char *flag; /* the option it stands for: "--interval" */',
        "    enum fs_config_type type; /* a list's: its items' */",
        "    int list; /* an array in the files, a repeatable option */",
        "    const char *default_value; /* the schema's default as the option takes it; NULL: none */",
        "    const char *const *values; /* the values it may take (the schema's enum), NULL-terminated; NULL: any */",
        '    const char *values_text; /* them, as a message lists them: "cpu, rss" */',
        "};",
        "",
        "/* Sorted by name. */",
        f"#define FS_NCONFIG_KEYS {len(rows)}",
        "#define FS_CONFIG_KEYS_INIT \\",
        "    { \\",
        *(f"        {r}, \\" for r in rows),
        "    }",
        "",
        "#endif",
        "",
    ]
    Path(dst).write_text("\n".join(out))


def row(name: str, prop: dict) -> str:
    """One key's initializer: {name, flag, type, list, default}."""
    if not KEY.match(name):
        raise ValueError(f"{name!r}: a key is lower case letters, digits and _ (a TOML bare key)")
    flag = prop.get("x-flag", "")
    if not FLAG.match(flag):
        raise ValueError(f"{name}: x-flag {flag!r} is not a long option (--name)")
    is_list = prop["type"] == "array"
    if is_list != bool(prop.get("x-list")):
        raise ValueError(f"{name}: an array is a list (x-list: true), and a list an array")
    item = prop["items"] if is_list else prop
    if item.get("type") not in TYPES:
        raise ValueError(f"{name}: type {item.get('type')!r} is not one the config takes")
    if is_list and "default" in prop:
        raise ValueError(f"{name}: a list has no default (an empty one)")
    default = option_text(prop["default"]) if "default" in prop else None
    values = item.get("enum")
    if values is not None and (item["type"] != "string" or not all(isinstance(v, str) for v in values)):
        raise ValueError(f"{name}: an enum is of strings, for a string")
    if values is not None and default is not None and default not in values:
        raise ValueError(f"{name}: the default {default!r} is not one of its enum")
    listed = (
        f"(const char *const[]){{{', '.join(c_string(v) for v in values)}, NULL}}, {c_string(', '.join(values))}"
        if values
        else "NULL, NULL"
    )
    return (
        f"{{{c_string(name)}, {c_string(flag)}, {TYPES[item['type']]}, {int(is_list)}, "
        f"{c_string(default) if default is not None else 'NULL'}, {listed}}}"
    )


def option_text(value) -> str:
    """A default as the option takes it on the command line (what --print-config shows back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return value
    raise ValueError(f"default {value!r}: not a string, a number or a boolean")


def c_string(text: str) -> str:
    """A C string literal of an ASCII text (JSON's escapes of quote and backslash are C's)."""
    if not text.isascii() or any(ord(c) < 32 for c in text):
        raise ValueError(f"{text!r}: the C table takes printable ASCII only")
    return json.dumps(text)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: gen_config_header.py CONFIG_SCHEMA OUT")
    main(*sys.argv[1:])
