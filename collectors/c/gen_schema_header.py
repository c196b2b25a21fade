#!/usr/bin/env python3
"""Generate schema_fields.h from the sample schema (src/flowstat/schema/sample.schema.json, the
file the Python package reads): the C agent's field table and the schema's enumerations.

Run by the Makefile; the header is a build product, never edited by hand.
"""

import json
import sys
from pathlib import Path

TYPES = {"string": "FS_T_STRING", "integer": "FS_T_INTEGER", "number": "FS_T_NUMBER", "boolean": "FS_T_BOOLEAN"}
ROLES = {"tag": "FS_I_TAG", "field": "FS_I_FIELD", "time": "FS_I_TIME"}


def main(src: str, dst: str) -> None:
    schema = json.loads(Path(src).read_text())
    required = set(schema["required"])
    names = list(schema["properties"])
    out = ["/* Generated from src/flowstat/schema/sample.schema.json by gen_schema_header.py. Do not edit. */",
           "#ifndef FLOWSTAT_SCHEMA_FIELDS_H", "#define FLOWSTAT_SCHEMA_FIELDS_H", "", "#include <stddef.h>", "",
           f'#define FS_MEASUREMENT "{schema["x-measurement"]}"', "", "enum fs_field {"]
    out += [f"    FS_F_{n.upper()}," for n in names]
    out += ["    FS_NFIELDS", "};", "",
            "enum fs_type { FS_T_STRING, FS_T_INTEGER, FS_T_NUMBER, FS_T_BOOLEAN };",
            "enum fs_influx { FS_I_TAG, FS_I_FIELD, FS_I_TIME };", "",
            "struct fs_field_def {", "    const char *name;", "    enum fs_type type;", "    enum fs_influx influx;",
            "    const char *control; /* get-metrics reply field, or NULL */", "    int required;",
            "    const char *const *values; /* the values a string may take, or NULL: any */", "    int nvalues;",
            "};", ""]
    for n in names:
        out += enumeration(n, schema["properties"][n])
    out.append("static const struct fs_field_def FS_FIELDS[FS_NFIELDS] = {")
    for n in names:
        p = schema["properties"][n]
        control = f'"{p["x-control"]}"' if "x-control" in p else "NULL"
        values = f"FS_ENUM_{n.upper()}, {len(p['enum'])}" if "enum" in p else "NULL, 0"
        out.append(f'    {{"{n}", {TYPES[p["type"]]}, {ROLES[p["x-influx"]]}, {control}, {int(n in required)}, {values}}},')
    out += ["};", "", "#endif", ""]
    Path(dst).write_text("\n".join(out))


def enumeration(name: str, prop: dict) -> list[str]:
    """A field's enumeration as a C array FS_ENUM_NAME, and its default value FS_DEFAULT_NAME."""
    if "enum" not in prop:
        return []
    values = ", ".join(f'"{v}"' for v in prop["enum"])
    out = [f"static const char *const FS_ENUM_{name.upper()}[{len(prop['enum'])}] = {{{values}}};"]
    if "default" in prop:
        out.append(f'#define FS_DEFAULT_{name.upper()} "{prop["default"]}"')
    return out + [""]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
