/* libFuzzer target: the credentials file parser (NAME=VALUE lines), and the redaction of its
 * secrets in a store's answer (the input again). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "creds.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fmemopen((void *)data, size, "r");
    if (!f)
        return 0;
    struct fs_credentials c;
    char err[600];
    int rc = creds_parse(&c, f, "fuzz", err, sizeof err);
    fclose(f);
    if (rc != 0)
        return 0;
    char *text = malloc(size + 1);
    if (text) {
        memcpy(text, data, size);
        text[size] = '\0';
        creds_redact(&c, text);
        free(text);
    }
    creds_free(&c);
    return 0;
}
