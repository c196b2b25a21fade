/* Credentials for the store sinks (docs/security.md): from the environment, or from a credentials
 * file (--credentials FILE, or FLOWSTAT_CREDENTIALS) of NAME=VALUE lines that only its owner may
 * read; a variable set in the environment wins over the file. The values stay in this process's
 * memory: never on a command line, in a URL, a log line, the stats or a spool file. */
#ifndef FLOWSTAT_CREDS_H
#define FLOWSTAT_CREDS_H

#include <stddef.h>
#include <stdio.h>

enum fs_cred {
    FS_INFLUX_USER,
    FS_INFLUX_PASSWORD,
    FS_INFLUX_TOKEN,
    FS_ES_USER,
    FS_ES_PASSWORD,
    FS_ES_API_KEY,
    FS_INFLUX_CA_FILE,
    FS_ES_CA_FILE,
    FS_CA_FILE,
    FS_NCREDS
};

/* The environment variable that names where the credentials file is, without --credentials. */
#define FS_CREDENTIALS_VAR "FLOWSTAT_CREDENTIALS"

struct fs_credentials {
    char *value[FS_NCREDS]; /* NULL when unset (an empty value is unset too) */
    /* What a store might echo of a secret besides the secret itself: base64(user:password). */
    char *basic[2];
};

/* The variable's name (FLOWSTAT_ES_USER...). */
const char *creds_name(enum fs_cred k);
/* Read the environment, then the file (NULL: FLOWSTAT_CREDENTIALS's, if set) for what the
 * environment leaves unset. -1 with a message in err when the file cannot be used: it is not a
 * regular file, others than its owner may read it (the chmod to run is said), or a line is not
 * NAME=VALUE with a known NAME. No message holds a value. */
int creds_load(struct fs_credentials *c, const char *file, char *err, size_t errlen);
/* The lines of a credentials file already open (no check of its mode, no environment): what
 * creds_load does with the file's text; for the fuzzer. `name` is what messages call it. */
int creds_parse(struct fs_credentials *c, FILE *f, const char *name, char *err, size_t errlen);
const char *creds_get(const struct fs_credentials *c, enum fs_cred k);
/* Overwrite in place every secret that text holds (and base64 of a user:password) with "***". */
void creds_redact(const struct fs_credentials *c, char *text);
/* Wipe and free the values. */
void creds_free(struct fs_credentials *c);
/* Standard base64 of n bytes (malloc'd, NULL when out of memory). */
char *fs_base64(const char *data, size_t n);

#endif
