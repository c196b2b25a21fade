/* libFuzzer target: a CURVE key file (libflowstat-node/node_curve.c), as the node library reads its run's keys
 * and the agent its client key. What it takes must be a key ZeroMQ takes too. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "node_curve.h"

static void check_key(const char *key)
{
    uint8_t raw[32];
    if (strlen(key) != FSN_CURVE_KEY_LEN || !zmq_z85_decode(raw, key))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fsn_curve_keys keys;
    char why[512];
    if (fsn_curve_parse((const char *)data, size, "fuzz.key", &keys, why, sizeof why) == 0) {
        check_key(keys.public_key);
        if (keys.secret_key[0])
            check_key(keys.secret_key);
    } else if (strncmp(why, "fuzz.key", 8) != 0) { /* every refusal names the file */
        abort();
    }
    fsn_curve_wipe(&keys);
    return 0;
}
