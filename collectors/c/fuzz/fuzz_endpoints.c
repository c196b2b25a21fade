/* libFuzzer target: the endpoints.json parser. */
#include <stddef.h>
#include <stdint.h>

#include "targets.h"

static void ignore(void *ctx, const struct target *t)
{
    (void)ctx;
    (void)t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int left_out = 0;
    targets_parse_endpoints((const char *)data, size, "", "keys/client.key_secret", &left_out, ignore, NULL);
    return 0;
}
