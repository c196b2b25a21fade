#include "sample_json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cJSON.h>

long long parse_iso_ms(const char *text)
{
    int y, mo, d, h, mi, sec, ms, used = 0;
    if (sscanf(text, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ%n", &y, &mo, &d, &h, &mi, &sec, &ms, &used) != 7 ||
        used != 24 || text[used] != '\0' || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
        return -1;
    struct tm tm = {.tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h, .tm_min = mi, .tm_sec = sec};
    return (long long)timegm(&tm) * 1000 + ms;
}

static int fail(char *err, size_t n, const char *field, const char *what)
{
    snprintf(err, n, "%s: %s", field, what);
    return -1;
}

int sample_from_json(const char *text, size_t len, struct fs_sample *s, char *err, size_t errlen)
{
    cJSON *doc = cJSON_ParseWithLength(text, len);
    sample_clear(s);
    if (!cJSON_IsObject(doc)) {
        cJSON_Delete(doc);
        return fail(err, errlen, "sample", "not a JSON object");
    }
    int rc = 0, hint = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, doc) {
        /* Keys usually come in schema order: look from just after the previous match. */
        int f = FS_NFIELDS;
        for (int k = 0; k < FS_NFIELDS; k++) {
            int candidate = (hint + k) % FS_NFIELDS;
            if (strcmp(FS_FIELDS[candidate].name, item->string) == 0) {
                f = candidate;
                hint = candidate + 1;
                break;
            }
        }
        if (f == FS_NFIELDS) {
            rc = fail(err, errlen, item->string, "not in the schema");
            break;
        }
        int ok = 0;
        switch (FS_FIELDS[f].type) {
        case FS_T_STRING:
            if ((ok = cJSON_IsString(item)) && !sample_value_allowed((enum fs_field)f, item->valuestring)) {
                rc = fail(err, errlen, item->string, "not one of the schema's values");
                break;
            }
            if (ok)
                sample_set_str(s, (enum fs_field)f, item->valuestring);
            break;
        case FS_T_INTEGER:
            if ((ok = cJSON_IsNumber(item) && item->valuedouble >= 0 && item->valuedouble == floor(item->valuedouble) &&
                      item->valuedouble <= 9.007199254740992e15))
                sample_set_int(s, (enum fs_field)f, (long long)item->valuedouble);
            break;
        case FS_T_NUMBER:
            if ((ok = cJSON_IsNumber(item) && isfinite(item->valuedouble)))
                sample_set_num(s, (enum fs_field)f, item->valuedouble);
            break;
        case FS_T_BOOLEAN:
            if ((ok = cJSON_IsBool(item)))
                sample_set_bool(s, (enum fs_field)f, cJSON_IsTrue(item));
            break;
        }
        if (rc != 0)
            break;
        if (!ok) {
            rc = fail(err, errlen, item->string, "wrong type");
            break;
        }
    }
    for (int f = 0; rc == 0 && f < FS_NFIELDS; f++)
        if (FS_FIELDS[f].required && !s->v[f].set)
            rc = fail(err, errlen, FS_FIELDS[f].name, "required field is missing");
    if (rc == 0 && (s->time_ms = parse_iso_ms(s->v[FS_F_TIME].s)) < 0)
        rc = fail(err, errlen, "time", "not YYYY-MM-DDTHH:MM:SS.mmmZ");
    cJSON_Delete(doc);
    return rc;
}
