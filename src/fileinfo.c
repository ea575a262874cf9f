/* Checking a file before reading it (config files, scripts): a regular
 * file that can be opened, decided without blocking, and its absolute path
 * for messages. */
#include "muon_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *mu__kind(mode_t m)
{
    if (S_ISDIR(m)) return NULL; /* strerror(EISDIR) */
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    return "not a file";
}

static int mu__not_regular(mode_t m)
{
    if (S_ISDIR(m)) return mu__fail(MU_EIO, "%s", strerror(EISDIR));
    return mu__fail(MU_EIO, "not a regular file (%s)", mu__kind(m));
}

static void mu__resolve(const char *path, char *resolved, size_t cap)
{
    char buf[PATH_MAX];
    if (!resolved || cap == 0) return;
    if (realpath(path, buf)) {
        snprintf(resolved, cap, "%s", buf);
    } else if (path[0] == '/' || !getcwd(buf, sizeof buf)) {
        snprintf(resolved, cap, "%s", path);
    } else {
        snprintf(resolved, cap, "%s/%s", buf, path);
    }
}

int mu_file_check(const char *path, char *resolved, size_t cap)
{
    if (resolved && cap) resolved[0] = '\0';
    if (!path || !*path) return mu__fail(MU_EINVAL, "the path is empty");
    mu__resolve(path, resolved, cap);
    struct stat st;
    /* stat first: a FIFO or a device is never opened */
    if (stat(path, &st) != 0) return mu__fail(MU_EIO, "%s", strerror(errno));
    if (!S_ISREG(st.st_mode)) return mu__not_regular(st.st_mode);
    /* then a non-blocking open (readable? and still a regular file?) */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return mu__fail(MU_EIO, "%s", strerror(errno));
    int rc = fstat(fd, &st) != 0 ? mu__fail(MU_EIO, "%s", strerror(errno))
             : !S_ISREG(st.st_mode) ? mu__not_regular(st.st_mode)
             : MU_OK;
    close(fd);
    return rc;
}
