/* libFuzzer target: the config files' TOML reader, the check of what it read against the schema's
 * keys, and the settings written back as JSON (--print-config). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "tomlread.h"

/* Some variables set, others not: both ways through ${NAME}. */
static const char *lookup(const char *name)
{
    return name[0] == 'A' ? "value ${B} $${C}" : name[0] == 'E' ? "" : NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct toml_doc doc;
    struct config_files files;
    struct config_settings settings;
    memset(&files, 0, sizeof files);
    memset(&settings, 0, sizeof settings);
    int line;
    char err[700];
    if (toml_parse((const char *)data, size, lookup, &doc, &line, err, sizeof err) == 0 &&
        config_take_doc(&doc, "fuzz.toml", &files, &line, err, sizeof err) == 0) {
        for (size_t i = 0; i < files.n; i++)
            config_settings_put(&settings, files.items[i].key, files.items[i].value);
        struct fs_buf json = {0};
        config_settings_json(&settings, &json);
        fs_buf_free(&json);
    }
    config_settings_free(&settings);
    config_files_free(&files);
    toml_free(&doc);
    return 0;
}
