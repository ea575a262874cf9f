/*
 * Files the library reads and writes (npy, safetensors, configs): opening
 * only regular files, and atomic saves through a uniquely named temporary
 * file.
 *
 * Reading: open(O_NONBLOCK) so that a FIFO or a device never blocks the
 * open itself, fstat, refuse anything but a regular file, then clear
 * O_NONBLOCK for the reads.
 *
 * Writing: the temporary file is created with mkstemp in the directory of
 * the target (rename is atomic only within one file system), so two
 * writers of one path -- two engines of one process, two threads, two
 * processes -- never share it: each save has its own file, and the last
 * rename wins with a whole file. Its name is "<base>.tmp.XXXXXX" with the
 * base cut so that the name fits NAME_MAX (a 250-byte target name saves).
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include "muon_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef NAME_MAX
#define NAME_MAX 255
#endif

int mu__open_regular(const char *path, int *fd_out, int64_t *size_out)
{
    *fd_out = -1;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return mu__fail(MU_EIO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mu__fail(MU_EIO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mu__fail(MU_EIO, "'%s' is not a regular file (a directory, FIFO, socket or device)",
                        path);
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
        int e = errno;
        close(fd);
        return mu__fail(MU_EIO, "cannot read '%s': %s", path, strerror(e));
    }
    *fd_out = fd;
    *size_out = (int64_t)st.st_size;
    return MU_OK;
}

/* Checking a path before reading it (configs, scripts, `muon check`'s
 * params file): stat first, so a FIFO or a device is never opened, then a
 * non-blocking open (readable? still a regular file?); the absolute path
 * for messages. */
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

int mu__read_full(int fd, void *buf, size_t len, int64_t off, size_t *got)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, (char *)buf + done, len - done, (off_t)(off + (int64_t)done));
        if (r < 0) {
            if (errno == EINTR) continue;
            *got = done;
            return -1;
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    *got = done;
    return 0;
}

int mu__write_full(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len;
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* The process umask without changing it (umask(2) would, for every
 * thread, for a moment): /proc/self/status on Linux, else 022. */
static mode_t current_umask(void)
{
    mode_t um = 022;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return um;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        unsigned v;
        if (sscanf(line, "Umask: %o", &v) == 1) {
            um = (mode_t)(v & 0777);
            break;
        }
    }
    fclose(f);
    return um;
}

/* The file a save replaces: path itself, or the file a symbolic link at
 * path leads to (rename would replace the link, not the file it names: a
 * save writes through the link, as a plain open would). A directory, a
 * FIFO, a socket or a device -- directly or through links -- is refused
 * (rename would put the file in the place of a link to a directory, or of
 * a device node), as is a link that leads nowhere. *target: the resolved
 * path (malloc'd), or NULL for path itself. */
static int save_target(const char *path, char **target)
{
    *target = NULL;
    struct stat ls, st;
    if (lstat(path, &ls) != 0) return MU_OK; /* a new file (a missing directory fails later) */
    int link = S_ISLNK(ls.st_mode);
    if (stat(path, &st) != 0) {
        if (!link) return MU_OK;
        return mu__fail(MU_EIO, "cannot save '%s': it is a symbolic link that leads to no file (%s)", path,
                        strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        const char *kind = mu__kind(st.st_mode);
        return mu__fail(MU_EIO, "cannot save '%s': it is %s%s, not a file", path,
                        link ? "a symbolic link to " : "", kind ? kind : "a directory");
    }
    if (!link) return MU_OK;
    char buf[PATH_MAX];
    if (!realpath(path, buf))
        return mu__fail(MU_EIO, "cannot save '%s': cannot resolve the symbolic link: %s", path, strerror(errno));
    if (!(*target = strdup(buf))) return mu__fail(MU_ENOMEM, "cannot save '%s': out of memory", path);
    return MU_OK;
}

/* tmp is one allocation: the temporary's name, its NUL, then the path of
 * the file the commit replaces (the target of save_target). */
int mu__tmp_create(const char *path, char **tmp_out, int *fd_out)
{
    static const char suffix[] = ".tmp.XXXXXX";
    *tmp_out = NULL;
    *fd_out = -1;
    char *target;
    int rc = save_target(path, &target);
    if (rc) return rc;
    const char *file = target ? target : path;
    const char *slash = strrchr(file, '/');
    const char *base = slash ? slash + 1 : file;
    size_t dirlen = (size_t)(base - file), blen = strlen(base), flen = strlen(file);
    if (blen == 0) {
        free(target);
        return mu__fail(MU_EIO, "cannot save '%s': the path names a directory", path);
    }
    /* keep the temporary name within NAME_MAX: cut the base if needed */
    size_t keep = NAME_MAX - (sizeof suffix - 1);
    if (blen > keep) blen = keep;
    char *tmp = malloc(dirlen + blen + sizeof suffix + flen + 1);
    if (!tmp) {
        free(target);
        return mu__fail(MU_ENOMEM, "cannot save '%s': out of memory", path);
    }
    memcpy(tmp, file, dirlen + blen);
    memcpy(tmp + dirlen + blen, suffix, sizeof suffix);
    memcpy(tmp + dirlen + blen + sizeof suffix, file, flen + 1);
    free(target);
    int fd = mkstemp(tmp); /* O_EXCL, mode 0600: a name nobody else holds */
    if (fd < 0) {
        rc = mu__fail(MU_EIO, "cannot save '%s': cannot create a temporary file in its "
                      "directory: %s", path, strerror(errno));
        free(tmp);
        return rc;
    }
    /* mkstemp makes the file 0600; saves get the usual 0666 & ~umask */
    (void)fchmod(fd, 0666 & ~current_umask());
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    *tmp_out = tmp;
    *fd_out = fd;
    return MU_OK;
}

/* fsync the directory holding path so the rename is durable. Filesystems
 * that cannot sync directories (EINVAL) are tolerated. */
static void sync_parent_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) dir = strdup(".");
    else if (slash == path) dir = strdup("/");
    else dir = strndup(path, (size_t)(slash - path));
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    if (fd < 0) return;
    (void)fsync(fd);
    close(fd);
}

int mu__tmp_commit(const char *path, char *tmp, int fd)
{
    const char *step = "syncing";
    int ok = fsync(fd) == 0;
    if (ok) step = "closing";
    int c = close(fd);
    ok = ok && c == 0;
    if (ok) {
        step = "renaming";
        ok = rename(tmp, tmp + strlen(tmp) + 1) == 0; /* onto the target (mu__tmp_create) */
    }
    if (!ok) {
        int rc = mu__fail(MU_EIO, "cannot save '%s': %s temporary file '%s' failed: %s", path,
                          step, tmp, strerror(errno));
        unlink(tmp);
        free(tmp);
        return rc;
    }
    sync_parent_dir(tmp);
    free(tmp);
    return MU_OK;
}

void mu__tmp_abort(char *tmp, int fd)
{
    if (fd >= 0) close(fd);
    if (tmp) unlink(tmp);
    free(tmp);
}

/* ------------------------------------------------------ element types */

static const struct file_type {
    const char *name, *npy;
    size_t bytes;
} FILE_TYPES[MU__FT_COUNT] = {
#define MU__FILE_TYPE_ROW(name, npy, bytes) [MU__FT_##name] = { #name, npy, bytes },
    MU__FILE_TYPES(MU__FILE_TYPE_ROW)
#undef MU__FILE_TYPE_ROW
};

int mu__file_type(const char *name)
{
    for (int ft = 0; name && ft < MU__FT_COUNT; ft++)
        if (strcmp(FILE_TYPES[ft].name, name) == 0) return ft;
    return -1;
}

int mu__file_type_npy(const char *descr)
{
    for (int ft = 0; descr && ft < MU__FT_COUNT; ft++)
        if (FILE_TYPES[ft].npy && strcmp(FILE_TYPES[ft].npy, descr) == 0) return ft;
    return -1;
}

size_t mu__file_type_size(int ft) { return ft >= 0 && ft < MU__FT_COUNT ? FILE_TYPES[ft].bytes : 0; }

const char *mu__file_type_name(int ft) { return ft >= 0 && ft < MU__FT_COUNT ? FILE_TYPES[ft].name : "?"; }

int mu__file_type_of(int dtype)
{
    return dtype == MU_F32 ? MU__FT_F32 : dtype == MU_F64 ? MU__FT_F64 : dtype == MU_BF16 ? MU__FT_BF16 : -1;
}

/* IEEE half to float, exactly (NaN payloads kept). */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {
        float f = (float)m * 0x1p-24f; /* zero or subnormal: m * 2^-24 */
        return sign ? -f : f;
    }
    u = sign | (e == 0x1f ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* One element of type T at p (unaligned) as a float and as a double. */
#define MU__LD(T, p) (*(T *)memcpy(&(T){ 0 }, (p), sizeof(T)))
#define MU__CONVERT_CASES(X)                                                                       \
    X(F32, float, v, v)                                                                            \
    X(F64, double, (float)v, v)                                                                    \
    X(BF16, uint16_t, mu__f32_from_bf16(v), mu__f32_from_bf16(v))                                  \
    X(F16, uint16_t, f16_to_f32(v), f16_to_f32(v))                                                 \
    X(I8, int8_t, (float)v, (double)v)                                                             \
    X(I16, int16_t, (float)v, (double)v)                                                           \
    X(I32, int32_t, (float)v, (double)v)                                                           \
    X(I64, int64_t, (float)v, (double)v)                                                           \
    X(U8, uint8_t, (float)v, (double)v)                                                            \
    X(U16, uint16_t, (float)v, (double)v)                                                          \
    X(U32, uint32_t, (float)v, (double)v)                                                          \
    X(U64, uint64_t, (float)v, (double)v)                                                          \
    X(BOOL, uint8_t, (float)(v != 0), (double)(v != 0))

void mu__file_convert(int ft, const void *src, int64_t n, void *dst, int dtype)
{
    const char *s = src;
    float *f = dst;
    double *d = dst;
    uint16_t *b = dst;
    switch (ft) {
#define MU__CONVERT_CASE(name, T, TO_F32, TO_F64)                                                  \
    case MU__FT_##name:                                                                            \
        for (int64_t i = 0; i < n; i++) {                                                          \
            T v = MU__LD(T, s + i * (int64_t)sizeof(T));                                           \
            if (dtype == MU_F32) f[i] = TO_F32;                                                    \
            else if (dtype == MU_F64) d[i] = TO_F64;                                               \
            else if (ft == MU__FT_F64) b[i] = mu__bf16_from_f64((double)v);                        \
            else b[i] = mu__bf16_from_f32(TO_F32);                                                 \
        }                                                                                          \
        break;
        MU__CONVERT_CASES(MU__CONVERT_CASE)
#undef MU__CONVERT_CASE
    }
}
#undef MU__LD
#undef MU__CONVERT_CASES
