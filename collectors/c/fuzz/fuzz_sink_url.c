/* libFuzzer target: the sink URL parser. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sinks.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *url = malloc(size + 1);
    if (!url)
        return 0;
    memcpy(url, data, size);
    url[size] = '\0';
    struct sink s;
    char err[640];
    sink_parse_url(url, &s, err, sizeof err);
    free(url);
    return 0;
}
