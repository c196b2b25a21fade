#include "sample_json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cJSON.h>

long long parse_iso_ms(const char *text)
{
    int y, mo, d, h, mi, sec, ms, used = 0;
    if (sscanf(text, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ%n", &y, &mo, &d, &h, &mi, &sec, &ms, &used) != 7 || used != 24 ||
        text[used] != '\0' || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
        return -1;
    struct tm tm = {.tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h, .tm_min = mi, .tm_sec = sec};
    return (long long)timegm(&tm) * 1000 + ms;
}

static int fail(char *err, size_t n, const char *field, const char *what)
{
    snprintf(err, n, "%s: %s", field, what);
    return -1;
}

/* The fields of `obj` into s, by s's schema; 0, or -1 with a message naming the field. */
static int fill_fields(const cJSON *obj, struct fs_sample *s, char *err, size_t errlen)
{
    const struct fs_schema *schema = s->schema;
    const struct fs_field_def *fields = schema->fields;
    int hint = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, obj) {
        /* Keys usually come in schema order: look from just after the previous match. */
        int f = schema->nfields;
        for (int k = 0; k < schema->nfields; k++) {
            int candidate = (hint + k) % schema->nfields;
            if (strcmp(fields[candidate].name, item->string) == 0) {
                f = candidate;
                hint = candidate + 1;
                break;
            }
        }
        if (f == schema->nfields)
            return fail(err, errlen, item->string, "not in the schema");
        int ok = 0;
        switch (fields[f].type) {
        case FS_T_STRING:
            if ((ok = cJSON_IsString(item)) && !field_value_allowed(&fields[f], item->valuestring))
                return fail(err, errlen, item->string, "not one of the schema's values");
            if (ok)
                sample_set_str(s, f, item->valuestring);
            break;
        case FS_T_INTEGER:
            if ((ok = cJSON_IsNumber(item) && item->valuedouble >= 0 && item->valuedouble == floor(item->valuedouble) &&
                     item->valuedouble <= 9.007199254740992e15))
                sample_set_int(s, f, (long long)item->valuedouble);
            break;
        case FS_T_NUMBER:
            if ((ok = cJSON_IsNumber(item) && isfinite(item->valuedouble)))
                sample_set_num(s, f, item->valuedouble);
            break;
        case FS_T_BOOLEAN:
            if ((ok = cJSON_IsBool(item)))
                sample_set_bool(s, f, cJSON_IsTrue(item));
            break;
        }
        if (!ok)
            return fail(err, errlen, item->string, "wrong type");
    }
    for (int f = 0; f < schema->nfields; f++)
        if (fields[f].required && !sample_has(s, f))
            return fail(err, errlen, fields[f].name, "required field is missing");
    if ((s->time_ms = parse_iso_ms(s->v[schema->time_field].s)) < 0)
        return fail(err, errlen, fields[schema->time_field].name, "not YYYY-MM-DDTHH:MM:SS.mmmZ");
    return 0;
}

/* A run file's self-sample or edge counter: an object whose one member is FS_RUN_FILE_AGENT_KEY or
 * FS_RUN_FILE_EDGE_KEY; its schema in *schema. */
static const cJSON *wrapped(const cJSON *doc, const struct fs_schema **schema)
{
    const cJSON *only = doc->child;
    if (!only || only->next)
        return NULL;
    *schema = strcmp(only->string, FS_RUN_FILE_AGENT_KEY) == 0 ? &FS_AGENT_SCHEMA
        : strcmp(only->string, FS_RUN_FILE_EDGE_KEY) == 0      ? &FS_EDGE_SCHEMA
                                                               : NULL;
    return *schema ? only : NULL;
}

int sample_from_json(const char *text, size_t len, struct fs_sample *s, char *err, size_t errlen)
{
    cJSON *doc = cJSON_ParseWithLength(text, len);
    sample_clear(s);
    if (!cJSON_IsObject(doc)) {
        cJSON_Delete(doc);
        return fail(err, errlen, "sample", "not a JSON object");
    }
    const struct fs_schema *schema = NULL;
    const cJSON *obj = doc, *inner = wrapped(doc, &schema);
    int rc = 0;
    if (inner && !cJSON_IsObject(inner)) {
        rc = fail(err, errlen, inner->string, "not a JSON object");
    } else {
        if (inner) {
            sample_clear_as(s, schema);
            obj = inner;
        }
        rc = fill_fields(obj, s, err, errlen);
    }
    cJSON_Delete(doc);
    return rc;
}
