/*
 * Directories for sharded checkpoints (lua/muon/checkpoint_sharded.lua):
 * list one, make one, write a small file into one atomically. Plain POSIX;
 * the Lua layer has no directory calls of its own.
 */
#define _XOPEN_SOURCE 700
#include "muon_internal.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

int mu_dir_list(const char *path, char *buf, size_t cap, size_t *len)
{
    *len = 0;
    if (!path || !*path) return mu__fail(MU_EINVAL, "the directory path is empty");
    DIR *d = opendir(path);
    if (!d) return mu__fail(MU_EIO, "cannot list '%s': %s", path, strerror(errno));
    size_t need = 0;
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        size_t n = strlen(e->d_name) + 1; /* with its NUL */
        if (buf && need + n <= cap) memcpy(buf + need, e->d_name, n);
        need += n;
    }
    int err = errno;
    closedir(d);
    if (err) return mu__fail(MU_EIO, "cannot list '%s': %s", path, strerror(err));
    *len = need;
    return MU_OK;
}

int mu_dir_make(const char *path)
{
    if (!path || !*path) return mu__fail(MU_EINVAL, "the directory path is empty");
    if (mkdir(path, 0777) == 0) return MU_OK;
    int err = errno;
    struct stat st;
    if (err == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return MU_OK;
    if (err == EEXIST) return mu__fail(MU_EIO, "cannot make directory '%s': it exists and is not a directory", path);
    return mu__fail(MU_EIO, "cannot make directory '%s': %s", path, strerror(err));
}

int mu_file_write_atomic(const char *path, const void *data, size_t len)
{
    if (!path || !*path) return mu__fail(MU_EINVAL, "the path is empty");
    if (!data && len) return mu__fail(MU_EINVAL, "data is NULL");
    char *tmp;
    int fd;
    int rc = mu__tmp_create(path, &tmp, &fd);
    if (rc) return rc;
    if (mu__write_full(fd, data, len)) {
        rc = mu__fail(MU_EIO, "cannot save '%s': writing temporary file '%s' failed: %s", path, tmp,
                      strerror(errno));
        mu__tmp_abort(tmp, fd);
        return rc;
    }
    return mu__tmp_commit(path, tmp, fd);
}
