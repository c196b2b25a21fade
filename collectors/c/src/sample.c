#include "sample.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sample_clear(struct fs_sample *s)
{
    memset(s, 0, sizeof *s);
}

void sample_set_str(struct fs_sample *s, enum fs_field f, const char *value)
{
    fs_strlcpy(s->v[f].s, value, sizeof s->v[f].s);
    s->v[f].set = 1;
}

void sample_set_int(struct fs_sample *s, enum fs_field f, long long value)
{
    s->v[f].i = value;
    s->v[f].set = 1;
}

void sample_set_num(struct fs_sample *s, enum fs_field f, double value)
{
    s->v[f].d = value;
    s->v[f].set = 1;
}

void sample_set_bool(struct fs_sample *s, enum fs_field f, int value)
{
    s->v[f].i = value ? 1 : 0;
    s->v[f].set = 1;
}

/* Line protocol escaping: measurement, tag keys/values and field keys escape , = and space. */
static void put_lp_key(struct fs_buf *out, const char *s)
{
    for (; *s; s++) {
        if (*s == ',' || *s == '=' || *s == ' ' || *s == '\\')
            fs_buf_append(out, "\\", 1);
        fs_buf_append(out, s, 1);
    }
}

static void put_lp_string(struct fs_buf *out, const char *s)
{
    fs_buf_append(out, "\"", 1);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fs_buf_append(out, "\\", 1);
        fs_buf_append(out, s, 1);
    }
    fs_buf_append(out, "\"", 1);
}

static void put_value(struct fs_buf *out, const struct fs_value *v, enum fs_type type, int json)
{
    char num[40];
    switch (type) {
    case FS_T_INTEGER:
        fs_buf_printf(out, json ? "%lld" : "%lldi", v->i);
        break;
    case FS_T_NUMBER:
        fs_format_double(num, sizeof num, v->d);
        fs_buf_puts(out, num);
        break;
    case FS_T_BOOLEAN:
        fs_buf_puts(out, v->i ? "true" : "false");
        break;
    case FS_T_STRING:
        if (!json) {
            put_lp_string(out, v->s);
            break;
        }
        fs_buf_json_string(out, v->s);
        break;
    }
}

static int cmp_tag(const void *a, const void *b)
{
    return strcmp(FS_FIELDS[*(const int *)a].name, FS_FIELDS[*(const int *)b].name);
}

void sample_line_protocol(const struct fs_sample *s, struct fs_buf *out)
{
    int tags[FS_NFIELDS], ntags = 0;
    for (int f = 0; f < FS_NFIELDS; f++)
        if (FS_FIELDS[f].influx == FS_I_TAG && s->v[f].set && s->v[f].s[0])
            tags[ntags++] = f;
    qsort(tags, (size_t)ntags, sizeof tags[0], cmp_tag); /* Influx prefers tags sorted by key */
    put_lp_key(out, FS_MEASUREMENT);
    for (int t = 0; t < ntags; t++) {
        fs_buf_append(out, ",", 1);
        put_lp_key(out, FS_FIELDS[tags[t]].name);
        fs_buf_append(out, "=", 1);
        put_lp_key(out, s->v[tags[t]].s);
    }
    int first = 1;
    for (int f = 0; f < FS_NFIELDS; f++) {
        if (FS_FIELDS[f].influx != FS_I_FIELD || !s->v[f].set)
            continue;
        fs_buf_append(out, first ? " " : ",", 1);
        first = 0;
        put_lp_key(out, FS_FIELDS[f].name);
        fs_buf_append(out, "=", 1);
        put_value(out, &s->v[f], FS_FIELDS[f].type, 0);
    }
    fs_buf_printf(out, " %lld000000\n", (long long)s->time_ms);
}

void sample_json(const struct fs_sample *s, struct fs_buf *out)
{
    int first = 1;
    fs_buf_append(out, "{", 1);
    for (int f = 0; f < FS_NFIELDS; f++) {
        if (!s->v[f].set)
            continue;
        fs_buf_printf(out, "%s\"%s\":", first ? "" : ",", FS_FIELDS[f].name);
        first = 0;
        put_value(out, &s->v[f], FS_FIELDS[f].type, 1);
    }
    fs_buf_append(out, "}\n", 2);
}

void sample_document_id(const struct fs_sample *s, char *out, size_t n)
{
    snprintf(out, n, "%s/%s/%s/%lld", s->v[FS_F_RUN_ID].s, s->v[FS_F_AGENT].s, s->v[FS_F_NODE_ID].s,
             s->v[FS_F_SEQ].i);
}
