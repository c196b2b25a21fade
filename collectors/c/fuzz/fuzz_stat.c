/* libFuzzer target: /proc/PID/stat (as sampled, and as --top ranks) and /proc/PID/statm parsers on
 * arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>

#include "procread.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct proc_reading r;
    struct proc_rank rank;
    long long rss;
    parse_stat((const char *)data, size, &r);
    parse_stat_rank((const char *)data, size, &rank);
    parse_statm((const char *)data, size, 4, &rss);
    return 0;
}
