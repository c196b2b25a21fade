#!/usr/bin/env python3
"""Generate schema_fields.h from the flat schemas the Python package reads (src/flowstat/schema/):
the sample's (sample.schema.json), the agent self-sample's (agent.schema.json) and the edge's
(edge.schema.json: the agent writes its counter points). For each, the C
agent's field table, its tags in line protocol order, its enumerations and its strings' patterns
(POSIX extended regular expressions in C: a schema's pattern must mean the same in both, which
tests/test_c_agent_endpoints_dir.py checks for the role's); and its Prometheus families (the fields
marked x-prometheus, as flowstat.schema.prometheus names them: name, type, unit, scale, HELP text
escaped) and labels (its tags, in schema order), for the prometheus:// sink (exposition.c); not the
edge's (edge counters are not served on /metrics).

    gen_schema_header.py SAMPLE_SCHEMA AGENT_SCHEMA EDGE_SCHEMA OUT

Run by the Makefile; the header is a build product, never edited by hand.
"""

import json
import sys
from pathlib import Path

TYPES = {"string": "FS_T_STRING", "integer": "FS_T_INTEGER", "number": "FS_T_NUMBER", "boolean": "FS_T_BOOLEAN"}
ROLES = {"tag": "FS_I_TAG", "field": "FS_I_FIELD", "time": "FS_I_TIME"}
# Each schema's names in C: (its field enumeration's prefix, the enumeration, its last member (the
# field count), its table, the prefix of its enumerated values' arrays, its measurement's macro).
SAMPLE = ("FS_F_", "fs_field", "FS_NFIELDS", "FS_FIELDS", "FS_ENUM_", "FS_MEASUREMENT")
AGENT = ("FS_A_", "fs_agent_field", "FS_NAGENT_FIELDS", "FS_AGENT_FIELDS", "FS_AGENT_ENUM_", "FS_AGENT_MEASUREMENT")
EDGE = ("FS_E_", "fs_edge_field", "FS_NEDGE_FIELDS", "FS_EDGE_FIELDS", "FS_EDGE_ENUM_", "FS_EDGE_MEASUREMENT")


def main(sample_src: str, agent_src: str, edge_src: str, dst: str) -> None:
    sources = ((sample_src, SAMPLE), (agent_src, AGENT), (edge_src, EDGE))
    schemas = [(json.loads(Path(src).read_text()), names) for src, names in sources]
    out = [
        "/* Generated from src/flowstat/schema/sample.schema.json, agent.schema.json and edge.schema.json by",
        " * gen_schema_header.py. Do not edit. */",
        "#ifndef FLOWSTAT_SCHEMA_FIELDS_H",
        "#define FLOWSTAT_SCHEMA_FIELDS_H",
        "",
        "#include <stddef.h>",
        "",
        "enum fs_type { FS_T_STRING, FS_T_INTEGER, FS_T_NUMBER, FS_T_BOOLEAN };",
        "enum fs_influx { FS_I_TAG, FS_I_FIELD, FS_I_TIME };",
        "",
        "struct fs_field_def {",
        "    const char *name;",
        "    enum fs_type type;",
        "    enum fs_influx influx;",
        "    const char *control; /* get-metrics reply field, or NULL */",
        "    int required;",
        "    const char *const *values; /* the values a string may take, or NULL: any */",
        "    int nvalues;",
        "    const char *pattern; /* a regular expression a string must match (whole), or NULL */",
        "    /* The name as each encoding writes it before a value, escaped once here rather than at",
        "     * every sample: JSON's \"name\": and line protocol's name= */",
        "    const char *json_key;",
        "    unsigned char json_key_len;",
        "    const char *lp_key;",
        "    unsigned char lp_key_len;",
        "};",
        "",
        "enum fs_prom_type { FS_PROM_COUNTER, FS_PROM_GAUGE, FS_PROM_STATESET };",
        "",
        "/* A Prometheus family: the field it shows, as flowstat.schema.prometheus.Family. */",
        "struct fs_prom_family {",
        "    int field;",
        "    const char *name; /* OpenMetrics family name (a counter's samples add _total) */",
        "    enum fs_prom_type type;",
        '    const char *unit; /* base unit, "" if none */',
        "    double scale; /* the family's value = the field's value x scale */",
        "    int scaled; /* scale != 1 */",
        "    int whole_scale; /* scale is a whole number: an integer field's value stays one */",
        "    const char *help; /* the field's description, escaped for a HELP line */",
        "};",
        "",
    ]
    for schema, names in schemas:
        out += table(schema, *names)
    for (schema, names), family_prefix in zip(schemas[:2], ("flowstat_node", "flowstat_agent"), strict=True):
        out += prometheus(schema, names[0], names[3], family_prefix)
    most = max(len(schema["properties"]) for schema, _ in schemas)
    out += [
        "/* Value slots a sample needs, whichever schema it follows. */",
        f"#define FS_MAX_FIELDS {most}",
        "",
        "#endif",
        "",
    ]
    Path(dst).write_text("\n".join(out))


def table(
    schema: dict, prefix: str, enum_name: str, count: str, table_name: str, enum_prefix: str, measurement: str
) -> list[str]:
    """One schema: its measurement, field enumeration, enumerated values, field table, and its tags
    sorted by key (the order line protocol writes them in)."""
    required = set(schema["required"])
    names = list(schema["properties"])
    out = [f'#define {measurement} "{schema["x-measurement"]}"', "", f"enum {enum_name} {{"]
    out += [f"    {prefix}{n.upper()}," for n in names]
    out += [f"    {count}", "};", ""]
    for n in names:
        out += enumeration(enum_prefix, n, schema["properties"][n])
    out.append(f"static const struct fs_field_def {table_name}[{count}] = {{")
    for n in names:
        p = schema["properties"][n]
        control = f'"{p["x-control"]}"' if "x-control" in p else "NULL"
        values = f"{enum_prefix}{n.upper()}, {len(p['enum'])}" if "enum" in p else "NULL, 0"
        pattern = c_string(anchored(p["pattern"])) if "pattern" in p else "NULL"
        json_key, lp_key = json.dumps(n) + ":", line_protocol_key(n) + "="
        out.append(
            f'    {{"{n}", {TYPES[p["type"]]}, {ROLES[p["x-influx"]]}, {control}, {int(n in required)}, {values}, '
            f"{pattern}, {c_string(json_key)}, {len(json_key)}, {c_string(lp_key)}, {len(lp_key)}}},"
        )
    tags = sorted(n for n in names if schema["properties"][n]["x-influx"] == "tag")
    out += [
        "};",
        "",
        f"static const int {table_name}_TAGS[{len(tags)}] = {{{', '.join(prefix + t.upper() for t in tags)}}};",
        "",
    ]
    return out


PROM_TYPES = {"counter": "FS_PROM_COUNTER", "gauge": "FS_PROM_GAUGE", "stateset": "FS_PROM_STATESET"}


def prometheus(schema: dict, prefix: str, table_name: str, family_prefix: str) -> list[str]:
    """A schema's Prometheus families TABLE_PROM (TABLE_NPROM of them), in schema order, and its
    labels TABLE_LABELS (its tags, in schema order: TABLE_NLABELS)."""
    rows = []
    for n, p in schema["properties"].items():
        spec = p.get("x-prometheus")
        if spec is None:
            continue
        name, unit = f"{family_prefix}_{spec.get('name', n)}", spec.get("unit", "")
        if unit and not name.endswith("_" + unit):
            raise ValueError(f"{n}: x-prometheus family {name} must end with its unit {unit}")
        scale = float(spec.get("scale", 1))
        rows.append(
            f"    {{{prefix}{n.upper()}, {c_string(name)}, {PROM_TYPES[spec['type']]}, {c_string(unit)}, {scale!r}, "
            f"{int(scale != 1)}, {int(scale.is_integer())}, {c_string(help_text(p['description']))}}},"
        )
    labels = [prefix + n.upper() for n, p in schema["properties"].items() if p["x-influx"] == "tag"]
    return [
        f"#define {table_name}_NPROM {len(rows)}",
        f"static const struct fs_prom_family {table_name}_PROM[{len(rows)}] = {{",
        *rows,
        "};",
        f"#define {table_name}_NLABELS {len(labels)}",
        f"static const int {table_name}_LABELS[{len(labels)}] = {{{', '.join(labels)}}};",
        "",
    ]


def help_text(text: str) -> str:
    """A HELP line's text: backslash and newline escaped (flowstat.schema.prometheus._escape_help)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def enumeration(prefix: str, name: str, prop: dict) -> list[str]:
    """A field's enumeration as a C array PREFIXNAME, and the default value FS_DEFAULT_NAME of a field
    with an enumeration or a pattern."""
    out = []
    if "enum" in prop:
        values = ", ".join(c_string(v) for v in prop["enum"])
        out.append(f"static const char *const {prefix}{name.upper()}[{len(prop['enum'])}] = {{{values}}};")
    if "default" in prop and ("enum" in prop or "pattern" in prop):
        out.append(f"#define FS_DEFAULT_{name.upper()} {c_string(prop['default'])}")
    return out + [""] if out else []


def anchored(pattern: str) -> str:
    """A pattern that must match a whole value (^...$): what JSON Schema, Python's re.fullmatch
    (flowstat.schema) and POSIX regexec all take alike."""
    if not (pattern.startswith("^") and pattern.endswith("$")):
        raise ValueError(f"pattern {pattern!r}: anchor it (^...$), so that every reader matches it whole")
    return pattern


def line_protocol_key(name: str) -> str:
    """A tag or field key in line protocol: comma, equals sign, space and backslash escaped."""
    return "".join("\\" + c if c in ",= \\" else c for c in name)


def c_string(text: str) -> str:
    """A C string literal of an ASCII text (JSON's escapes of quote and backslash are C's)."""
    if not text.isascii() or any(ord(c) < 32 for c in text):
        raise ValueError(f"{text!r}: the C table takes printable ASCII only")
    return json.dumps(text)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: gen_schema_header.py SAMPLE_SCHEMA AGENT_SCHEMA EDGE_SCHEMA OUT")
    main(*sys.argv[1:])
