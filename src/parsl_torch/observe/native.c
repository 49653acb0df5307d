/* parsl-torch: what a stage's processes read below Python, for reruns (observe/native.py builds it).
 *
 * Preloaded (LD_PRELOAD) into every process of an observed rank, Python or not, it appends a line per new
 * thing read to <PARSL_TORCH_READS_DIR>/<pid>.txt, the file and format the Python observer uses
 * (observe/recorder.py): "f PATH" a file opened to read or looked for and not found, "t STATE PATH" its
 * state at that first read, "m PATH" a path whose metadata was looked at (stat, access: its kind, size and
 * time), "w PATH" opened to write, "d PATH" a folder listed (opendir, and the C library's own listings:
 * scandir, glob, nftw/ftw, fts, getdents64), "e *" the whole environment read (a program other than Python
 * started), "x WHY" a program started that this library cannot see into (static, set-user-ID, or given an
 * environment without it). Paths are made absolute as the kernel resolves them: a link, then "..".
 * In a Python, opens are recorded by both (the same lines); Python's listings and the paths it looks up
 * and does not find are left to the Python observer, which tells the import system's (no input) from the
 * user's code's.
 * Nothing here allocates with malloc or takes a lock in an exec's child (a vfork child shares its
 * parent's memory); a library that cannot write its file just stays silent.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fts.h>
#include <ftw.h>
#include <glob.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#define PT_MAX 4096          /* a path's bytes */
#define PT_PREFIXES 64       /* skipped and temporary places */
#define EXPORT __attribute__((visibility("default")))

extern char **environ;

static char folder[PT_MAX];  /* where the lines go ("": not observing) */
static size_t folder_len;
static char *skipped[PT_PREFIXES], *temps[PT_PREFIXES];
static int n_skipped, n_temps;
static char places[16 * PT_MAX];  /* the prefixes' bytes */
static long long since_ns;   /* when the call began: scratch in the temporary places is newer */
static int in_python;        /* a Python: its lookups are the Python observer's to judge */
static int python_ready;     /* the Python observer runs: listings it did not announce are compiled code's */
static __thread int busy;    /* this thread is inside this library */
static __thread int quiet;   /* this thread reads for parsl-torch itself (a traceback's sources): no input */
static __thread char python_lists[PT_MAX];  /* the folder Python is about to list ("": none) */
static __thread int python_lists_fd;        /* Python is about to list a folder by its descriptor */

static int out_fd = -1;
static dev_t out_dev;
static ino_t out_ino;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *seen;       /* hashes of lines written: an open-addressed set */
static size_t seen_size, seen_used;

/* ---- the real functions ---- */

static void *real(const char *name) {
    void *f = dlsym(RTLD_NEXT, name);
    if (f == NULL)  /* only a compatibility version left in this glibc (__xstat): the first one */
        f = dlvsym(RTLD_NEXT, name, "GLIBC_2.2.5");
    if (f == NULL)
        f = dlvsym(RTLD_NEXT, name, "GLIBC_2.17");
    return f;
}

#define REAL(type, name, args) \
    static type(*real_##name) args;  \
    if (real_##name == NULL) real_##name = (type(*) args)real(#name)

/* ---- configuration ---- */

static int split(const char *list, char **into, char **cursor, char *end) {
    int n = 0;
    for (const char *line = list; line != NULL && *line && n < PT_PREFIXES;) {
        char *next = strchr(line, '\n');
        size_t len = next ? (size_t)(next - line) : strlen(line);
        if (len > 0 && *cursor + len + 1 < end) {
            memcpy(*cursor, line, len);
            (*cursor)[len] = 0;
            into[n++] = *cursor;
            *cursor += len + 1;
        }
        line = next ? next + 1 : NULL;
    }
    return n;
}

/* the places whose reads are no input, one per line, and when the call began (seconds) */
static void places_are(const char *skip, const char *temp, double since) {
    char *cursor = places, *end = places + sizeof places;
    n_skipped = split(skip, skipped, &cursor, end);
    n_temps = split(temp, temps, &cursor, end);
    since_ns = (long long)(since * 1e9);
}

static void configure(void) {
    const char *dir = getenv("PARSL_TORCH_READS_DIR"), *since = getenv("PARSL_TORCH_OBSERVE_SINCE");
    folder[0] = 0;
    if (dir == NULL || dir[0] != '/' || strlen(dir) + 2 >= PT_MAX)
        return;
    folder_len = strlen(dir);
    memcpy(folder, dir, folder_len + 1);
    if (folder[folder_len - 1] != '/')
        folder[folder_len++] = '/', folder[folder_len] = 0;
    places_are(getenv("PARSL_TORCH_OBSERVE_SKIP"), getenv("PARSL_TORCH_OBSERVE_TEMP"), since ? strtod(since, NULL) : 0);
}

/* ---- writing lines ---- */

static uint64_t hash(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h ? h : 1;
}

/* whether the line is new (and now seen); under the lock */
static int first_time(uint64_t h) {
    if (seen_used * 2 >= seen_size) {
        size_t size = seen_size ? seen_size * 2 : 4096;
        uint64_t *grown = mmap(NULL, size * sizeof *grown, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (grown == MAP_FAILED)
            return 1;
        for (size_t i = 0; i < seen_size; i++)
            if (seen[i])
                for (size_t j = seen[i] & (size - 1);; j = (j + 1) & (size - 1))
                    if (!grown[j]) { grown[j] = seen[i]; break; }
        if (seen)
            munmap(seen, seen_size * sizeof *seen);
        seen_size = size;
        seen = grown;
    }
    for (size_t j = h & (seen_size - 1);; j = (j + 1) & (seen_size - 1)) {
        if (seen[j] == h)
            return 0;
        if (!seen[j]) {
            seen[j] = h;
            seen_used++;
            return 1;
        }
    }
}

/* whether a line was written already (a file read again: nothing to state, no fstat) */
static int known(const char *kind, const char *text) {
    char line[PT_MAX + 64];
    snprintf(line, sizeof line, "%s %s", kind, text);
    uint64_t h = hash(line);
    int found = 0;
    pthread_mutex_lock(&lock);
    for (size_t j = seen_size ? (h & (seen_size - 1)) : 0; seen_size && seen[j]; j = (j + 1) & (seen_size - 1))
        if (seen[j] == h) { found = 1; break; }
    pthread_mutex_unlock(&lock);
    return found;
}

/* the file's number, checked to still be this library's (a program may close every descriptor) */
static int output(void) {
    struct stat st;
    if (out_fd >= 0 && fstat(out_fd, &st) == 0 && st.st_dev == out_dev && st.st_ino == out_ino)
        return out_fd;
    char name[PT_MAX + 32];
    snprintf(name, sizeof name, "%s%d.txt", folder, (int)getpid());
    out_fd = (int)syscall(SYS_openat, AT_FDCWD, name, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (out_fd >= 0 && fstat(out_fd, &st) == 0)
        out_dev = st.st_dev, out_ino = st.st_ino;
    return out_fd;
}

/* one line into ``out`` (at ``at``) if it was not said before; the bytes added */
static int said_once(char *out, int at, int room, const char *kind, const char *text) {
    int n = text ? snprintf(out + at, (size_t)(room - at), "%s %s\n", kind, text)
                 : snprintf(out + at, (size_t)(room - at), "%s\n", kind);
    if (n <= 0 || n >= room - at)
        return 0;
    out[at + n - 1] = 0;
    uint64_t h = hash(out + at);
    out[at + n - 1] = '\n';
    return first_time(h) ? n : 0;
}

/* a line, or two (a file's state and the file: one write, the cost of a new file read), each said once */
static void emit_two(const char *kind, const char *text, const char *kind2, const char *text2) {
    char lines[2 * PT_MAX + 128];
    pthread_mutex_lock(&lock);
    int n = said_once(lines, 0, PT_MAX + 64, kind, text);
    if (kind2 != NULL)
        n += said_once(lines, n, n + PT_MAX + 64, kind2, text2);
    if (n > 0) {
        int fd = output();
        if (fd >= 0)
            (void)!write(fd, lines, n);  /* (a failure: the folder is gone, the rank ended: nothing is left to tell) */
    }
    pthread_mutex_unlock(&lock);
}
static void emit(const char *kind, const char *text) { emit_two(kind, text, NULL, NULL); }

/* in an exec's child: no lock, no state kept (a vfork child's writes would be its parent's) */
static void emit_now(const char *kind, const char *text) {
    char name[PT_MAX + 32], line[PT_MAX + 300];
    snprintf(name, sizeof name, "%s%d.txt", folder, (int)getpid());
    int n = snprintf(line, sizeof line, "%s %s\n", kind, text);
    int fd = (int)syscall(SYS_openat, AT_FDCWD, name, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    if (n > 0 && n < (int)sizeof line)
        (void)!write(fd, line, n);
    close(fd);
}

/* ---- paths ---- */

/* an absolute, normalised path (as Python's os.path.abspath): 0 if it cannot be made */
static int absolute(int dirfd, const char *path, char *out) {
    char joined[2 * PT_MAX];
    if (path == NULL || !path[0])
        return 0;
    if (path[0] == '/') {
        if (strlen(path) >= PT_MAX) return 0;
        strcpy(joined, path);
    } else {
        char base[PT_MAX];
        long n;
        if (dirfd == AT_FDCWD) {
            n = syscall(SYS_getcwd, base, sizeof base);
            if (n <= 0) return 0;
            n = (long)strlen(base);
        } else {
            char link[64];
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            n = (long)syscall(SYS_readlinkat, AT_FDCWD, link, base, sizeof base - 1);  /* (not the wrapper below) */
            if (n <= 0) return 0;
            base[n] = 0;
        }
        if ((size_t)n + strlen(path) + 2 >= sizeof joined) return 0;
        snprintf(joined, sizeof joined, "%s/%s", base, path);
    }
    /* lexical normalisation: "//", "/./", "/../" */
    size_t o = 0;
    for (const char *p = joined; *p;) {
        while (*p == '/') p++;
        const char *e = p;
        while (*e && *e != '/') e++;
        size_t len = (size_t)(e - p);
        if (len == 0 || (len == 1 && p[0] == '.')) {
        } else if (len == 2 && p[0] == '.' && p[1] == '.') {
            /* as the kernel: the path so far resolved (a link in it followed) before ".." leaves it */
            char resolved[PT_MAX];
            out[o] = 0;
            if (o > 0 && realpath(out, resolved) != NULL && strlen(resolved) < PT_MAX) {
                strcpy(out, resolved);
                o = strlen(out);
                if (o == 1) o = 0;  /* ("/": its parent is itself) */
            }
            while (o > 0 && out[o - 1] != '/') o--;
            if (o > 0) o--;
        } else {
            if (o + len + 2 >= PT_MAX) return 0;
            out[o++] = '/';
            memcpy(out + o, p, len);
            o += len;
        }
        p = e;
    }
    if (o == 0) out[o++] = '/';
    out[o] = 0;
    return 1;
}

static int starts(const char *path, const char *prefix) {
    size_t n = strlen(prefix);  /* (each prefix ends with "/": the path is tried with one too) */
    return strncmp(path, prefix, n) == 0 || (strlen(path) + 1 == n && strncmp(path, prefix, n - 1) == 0);
}

/* whether a path is no input: the skipped places, this library's folder, scratch made since the call began
 * (a path there that is not there is looked for: an input, as elsewhere) */
static int ignored(const char *path) {
    if (starts(path, folder))
        return 1;
    for (int i = 0; i < n_skipped; i++)
        if (starts(path, skipped[i])) return 1;
    for (int i = 0; i < n_temps; i++)
        if (starts(path, temps[i])) {
            struct stat st;
            return syscall(SYS_newfstatat, AT_FDCWD, path, &st, 0) == 0 &&
                   st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec >= since_ns;
        }
    return 0;
}

/* whether a file is in a folder of Python's compiled caches */
static int in_cache_folder(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash != NULL && slash - path >= 12 && strncmp(slash - 12, "/__pycache__", 12) == 0;
}

/* a module's compiled cache stands for its source (pkg/__pycache__/m.cpython-311.pyc -> pkg/m.py): 1 where
 * it did, and the state recorded is then the source's, as the Python observer's is (the cache's own changes
 * each time a Python writes it anew) */
static int source_of(char *path) {
    size_t n = strlen(path);
    if (n < 4 || strcmp(path + n - 4, ".pyc") != 0 || !in_cache_folder(path))
        return 0;
    char *slash = strrchr(path, '/');
    char *dot = strchr(slash + 1, '.');
    char name[PT_MAX];
    snprintf(name, sizeof name, "%.*s.py", (int)(dot - slash - 1), slash + 1);
    strcpy(slash - 11, name);
    return 1;
}

/* ---- what is recorded ---- */

/* a path made absolute to go on a line: one that cannot be (too long, no working directory) or that would
 * break its line (a line break in its name) is said instead, and its stage makes no skip promise */
static int line_path(int dirfd, const char *path, char *full) {
    if (path == NULL || !path[0])
        return 0;  /* (names nothing: open("") fails, and reads nothing) */
    if (!absolute(dirfd, path, full)) {
        busy = 1;
        emit_now("x", "a path that could not be made absolute (too long, or the working directory gone) was used");
        busy = 0;
        return 0;
    }
    if (strchr(full, '\n')) {
        busy = 1;
        emit_now("x", "a path whose name holds a line break was used");
        busy = 0;
        return 0;
    }
    return 1;
}

/* whether to record here and now: a Python records from its observer's start (what it reads before is
 * the interpreter's own start; and a Python whose observer never starts must leave no file of its own,
 * which would say that it was observed) */
static int active(void) {
    return folder[0] && !busy && !quiet && (!in_python || python_ready);
}

static void opened(int dirfd, const char *path, int flags, int fd, int error) {
    char full[PT_MAX];
    int how = flags & O_ACCMODE;
    if (!line_path(dirfd, path, full))
        return;
    int cache_folder = in_cache_folder(full);
    int cache = source_of(full);
    if (ignored(full))
        return;
    busy = 1;
    if (fd < 0) {
        if (error == ENOENT && how != O_WRONLY && !(flags & O_DIRECTORY))
            emit("f", full);  /* looked for and not found: its appearing later is a change */
    } else if (how == O_RDONLY && !(flags & (O_CREAT | O_TRUNC)) && known("f", full)) {
        /* read before: said already */
    } else {
        struct stat st;
        if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) {
            if (!cache_folder && (how != O_RDONLY || (flags & (O_CREAT | O_TRUNC))))
                emit("w", full);  /* (a module's cache, or its temporary, written is Python's: no output) */
            if (how != O_WRONLY && cache && syscall(SYS_newfstatat, AT_FDCWD, full, &st, 0) != 0) {
                emit("f", full);  /* a cache without its source: read, with no state to compare */
            } else if (how != O_WRONLY) {
                char state[PT_MAX + 80];
                snprintf(state, sizeof state, "%lld:%lld:%llu %s",
                         (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
                         (long long)st.st_size, (unsigned long long)st.st_ino, full);
                emit_two("t", state, "f", full);
            }
        }
    }
    busy = 0;
}

/* a path looked up (stat, access) outside a Python (whose lookups are the Python observer's to judge): not
 * found, it is read ("f": its appearing later is a change); found, its metadata was read ("m"; "k" from access, which learns its existence only) */
static void looked_up(int dirfd, const char *path, int result, const char *found) {
    if ((result == 0 || errno == ENOENT) && active() && !in_python) {
        int saved = errno;
        char full[PT_MAX];
        if (line_path(dirfd, path, full) && !ignored(full)) {
            busy = 1;
            emit(result == 0 ? found : "f", full);
            busy = 0;
        }
        errno = saved;
    }
}

/* a listing: in a Python, those that Python announced are the Python observer's to judge (the import
 * system's are no input), and so is every listing before it runs (the interpreter's start) */
static void listed(const char *path, int by_fd) {
    char full[PT_MAX];
    int python = in_python && (!python_ready || (by_fd ? python_lists_fd : strcmp(path, python_lists) == 0));
    python_lists[0] = 0, python_lists_fd = 0;
    if (!python && line_path(AT_FDCWD, path, full) && !ignored(full)) {
        busy = 1;
        emit("d", full);
        busy = 0;
    }
}

/* ---- opening ---- */

static int do_open(int dirfd, const char *path, int flags, mode_t mode) {
    int fd = (int)syscall(SYS_openat, dirfd, path, flags, mode);
    if (active() && !(flags & O_PATH) && (flags & O_TMPFILE) != O_TMPFILE) {
        int saved = errno;
        opened(dirfd, path, flags, fd, saved);
        errno = saved;
    }
    return fd;
}

static mode_t mode_of(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

EXPORT int open(const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t mode = mode_of(flags, ap); va_end(ap);
    return do_open(AT_FDCWD, path, flags, mode);
}
EXPORT int open64(const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t mode = mode_of(flags, ap); va_end(ap);
    return do_open(AT_FDCWD, path, flags, mode);
}
EXPORT int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t mode = mode_of(flags, ap); va_end(ap);
    return do_open(dirfd, path, flags, mode);
}
EXPORT int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t mode = mode_of(flags, ap); va_end(ap);
    return do_open(dirfd, path, flags, mode);
}
/* the fortified forms (_FORTIFY_SOURCE): no mode */
EXPORT int __open_2(const char *path, int flags) { return do_open(AT_FDCWD, path, flags, 0); }
EXPORT int __open64_2(const char *path, int flags) { return do_open(AT_FDCWD, path, flags, 0); }
EXPORT int __openat_2(int dirfd, const char *path, int flags) { return do_open(dirfd, path, flags, 0); }
EXPORT int __openat64_2(int dirfd, const char *path, int flags) { return do_open(dirfd, path, flags, 0); }
EXPORT int creat(const char *path, mode_t mode) { return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode); }
EXPORT int creat64(const char *path, mode_t mode) { return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode); }

/* fopen opens inside glibc (not through open): its mode says how */
static int fopen_flags(const char *mode) {
    int plus = strchr(mode, '+') != NULL;
    if (mode[0] == 'r') return plus ? O_RDWR : O_RDONLY;
    return (plus ? O_RDWR : O_WRONLY) | O_CREAT;
}

static FILE *fopened(const char *path, const char *mode, FILE *f) {
    if (active() && path != NULL && mode != NULL) {
        int saved = errno;
        opened(AT_FDCWD, path, fopen_flags(mode), f ? fileno(f) : -1, saved);
        errno = saved;
    }
    return f;
}

EXPORT FILE *fopen(const char *path, const char *mode) {
    REAL(FILE *, fopen, (const char *, const char *));
    return fopened(path, mode, real_fopen(path, mode));
}
EXPORT FILE *fopen64(const char *path, const char *mode) {
    REAL(FILE *, fopen64, (const char *, const char *));
    return fopened(path, mode, real_fopen64(path, mode));
}
EXPORT FILE *freopen(const char *path, const char *mode, FILE *stream) {
    REAL(FILE *, freopen, (const char *, const char *, FILE *));
    return fopened(path, mode, real_freopen(path, mode, stream));
}
EXPORT FILE *freopen64(const char *path, const char *mode, FILE *stream) {
    REAL(FILE *, freopen64, (const char *, const char *, FILE *));
    return fopened(path, mode, real_freopen64(path, mode, stream));
}

/* ---- looking up ---- */

/* whether a call names a path (not AT_EMPTY_PATH's ""; apart, so that no nonnull attribute is assumed) */
__attribute__((noinline)) static int named(const char *path, int flags) {
    return path != NULL && (path[0] || !(flags & AT_EMPTY_PATH));
}

#define STAT_LIKE(name, type)                                              \
    EXPORT int name(const char *path, type *st) {                          \
        REAL(int, name, (const char *, type *));                           \
        int r = real_##name(path, st);                                     \
        looked_up(AT_FDCWD, path, r, "m");                                        \
        return r;                                                          \
    }
STAT_LIKE(stat, struct stat)
STAT_LIKE(stat64, struct stat64)
STAT_LIKE(lstat, struct stat)
STAT_LIKE(lstat64, struct stat64)

EXPORT int fstatat(int dirfd, const char *path, struct stat *st, int flags) {
    REAL(int, fstatat, (int, const char *, struct stat *, int));
    int r = real_fstatat(dirfd, path, st, flags);
    if (named(path, flags)) looked_up(dirfd, path, r, "m");
    return r;
}
EXPORT int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags) {
    REAL(int, fstatat64, (int, const char *, struct stat64 *, int));
    int r = real_fstatat64(dirfd, path, st, flags);
    if (named(path, flags)) looked_up(dirfd, path, r, "m");
    return r;
}
/* binaries built against glibc before 2.33 call these */
#define XSTAT_LIKE(name, type)                                             \
    EXPORT int name(int ver, const char *path, type *st) {                 \
        REAL(int, name, (int, const char *, type *));                      \
        int r = real_##name(ver, path, st);                                \
        looked_up(AT_FDCWD, path, r, "m");                                        \
        return r;                                                          \
    }
XSTAT_LIKE(__xstat, struct stat)
XSTAT_LIKE(__xstat64, struct stat64)
XSTAT_LIKE(__lxstat, struct stat)
XSTAT_LIKE(__lxstat64, struct stat64)

EXPORT int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *st) {
    REAL(int, statx, (int, const char *, int, unsigned int, struct statx *));
    int r = real_statx(dirfd, path, flags, mask, st);
    if (named(path, flags)) looked_up(dirfd, path, r, "m");
    return r;
}
EXPORT int access(const char *path, int how) {
    REAL(int, access, (const char *, int));
    int r = real_access(path, how);
    looked_up(AT_FDCWD, path, r, "k");
    return r;
}
EXPORT int faccessat(int dirfd, const char *path, int how, int flags) {
    REAL(int, faccessat, (int, const char *, int, int));
    int r = real_faccessat(dirfd, path, how, flags);
    looked_up(dirfd, path, r, "k");
    return r;
}

/* a link read (readlink): its target is metadata the program now knows */
EXPORT ssize_t readlink(const char *path, char *buf, size_t size) {
    REAL(ssize_t, readlink, (const char *, char *, size_t));
    ssize_t r = real_readlink(path, buf, size);
    looked_up(AT_FDCWD, path, r >= 0 ? 0 : -1, "m");
    return r;
}
EXPORT ssize_t readlinkat(int dirfd, const char *path, char *buf, size_t size) {
    REAL(ssize_t, readlinkat, (int, const char *, char *, size_t));
    ssize_t r = real_readlinkat(dirfd, path, buf, size);
    if (named(path, 0)) looked_up(dirfd, path, r >= 0 ? 0 : -1, "m");
    return r;
}

/* ---- listing ---- */

EXPORT DIR *opendir(const char *path) {
    REAL(DIR *, opendir, (const char *));
    DIR *d = real_opendir(path);
    if (d != NULL && named(path, 0) && active())
        listed(path, 0);
    return d;
}
/* a folder listed by its descriptor: its path, from /proc */
static void listed_fd(int fd) {
    char link[64], path[PT_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = (ssize_t)syscall(SYS_readlinkat, AT_FDCWD, link, path, sizeof path - 1);
    if (n > 0) {
        path[n] = 0;
        listed(path, 1);
    }
}
EXPORT DIR *fdopendir(int fd) {
    REAL(DIR *, fdopendir, (int));
    DIR *d = real_fdopendir(fd);
    if (d != NULL && active())
        listed_fd(fd);
    return d;
}

/* the C library lists folders through its own internal functions, not opendir: its listing calls are
 * taken at their entry points (run-parts, find's and du's walks, a tool's globs) */
static void listed_at(int dirfd, const char *path) {
    char full[PT_MAX];
    if (path != NULL && active() && line_path(dirfd, path, full))
        listed(full, 0);
}

#define SCANDIR_LIKE(name, entry)                                                                          \
    EXPORT int name(const char *path, struct entry ***list, int (*keep)(const struct entry *),               \
                    int (*order)(const struct entry **, const struct entry **)) {                           \
        REAL(int, name, (const char *, struct entry ***, int (*)(const struct entry *),                     \
                         int (*)(const struct entry **, const struct entry **)));                           \
        int r = real_##name(path, list, keep, order);                                                       \
        if (r >= 0) { int saved = errno; listed_at(AT_FDCWD, path); errno = saved; }                       \
        return r;                                                                                           \
    }
SCANDIR_LIKE(scandir, dirent)
SCANDIR_LIKE(scandir64, dirent64)

#define SCANDIRAT_LIKE(name, entry)                                                                        \
    EXPORT int name(int dirfd, const char *path, struct entry ***list, int (*keep)(const struct entry *),   \
                    int (*order)(const struct entry **, const struct entry **)) {                           \
        REAL(int, name, (int, const char *, struct entry ***, int (*)(const struct entry *),                \
                         int (*)(const struct entry **, const struct entry **)));                           \
        int r = real_##name(dirfd, path, list, keep, order);                                                \
        if (r >= 0) { int saved = errno; listed_at(dirfd, path); errno = saved; }                          \
        return r;                                                                                           \
    }
SCANDIRAT_LIKE(scandirat, dirent)
SCANDIRAT_LIKE(scandirat64, dirent64)

/* the folders a pattern's wildcards list: each folder before a component with a wildcard, for the
 * pattern itself (nothing matched there yet is a listing too) and for each match */
static int wild(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] == '*' || s[i] == '?' || s[i] == '[') return 1;
    return 0;
}
static void globbed(const char *pattern, const char *match) {
    char folder_of[PT_MAX];
    const char *p = pattern, *m = match;
    size_t o = 0;
    if (*p == '/') { folder_of[o++] = '/'; p++; m += (*m == '/'); }
    while (*p && *m && o < PT_MAX - 2) {
        const char *pe = strchr(p, '/'), *me = strchr(m, '/');
        size_t pn = pe ? (size_t)(pe - p) : strlen(p), mn = me ? (size_t)(me - m) : strlen(m);
        if (wild(p, pn)) {
            folder_of[o ? o : 0] = 0;
            listed_at(AT_FDCWD, o ? folder_of : ".");
        }
        if (o + mn + 2 >= PT_MAX) return;
        if (o && folder_of[o - 1] != '/') folder_of[o++] = '/';
        memcpy(folder_of + o, m, mn);
        o += mn;
        if (!pe || !me) break;
        p = pe + 1, m = me + 1;
    }
}
#define GLOB_LIKE(name, type)                                                                              \
    EXPORT int name(const char *pattern, int flags, int (*err)(const char *, int), type *found) {           \
        REAL(int, name, (const char *, int, int (*)(const char *, int), type *));                            \
        size_t before = (flags & GLOB_APPEND) ? found->gl_pathc : 0;                                          \
        int r = real_##name(pattern, flags, err, found);                                                      \
        if (pattern != NULL && active() && (r == 0 || r == GLOB_NOMATCH)) {                                   \
            int saved = errno;                                                                                \
            globbed(pattern, pattern);                                                                        \
            size_t offs = (flags & GLOB_DOOFFS) ? found->gl_offs : 0;  /* (else gl_offs may be unset) */    \
            for (size_t i = before; r == 0 && i < found->gl_pathc; i++)                                       \
                globbed(pattern, found->gl_pathv[offs + i]);                                                  \
            errno = saved;                                                                                    \
        }                                                                                                     \
        return r;                                                                                             \
    }
GLOB_LIKE(glob, glob_t)
GLOB_LIKE(glob64, glob64_t)

/* a walk (nftw, ftw): each folder it enters is listed, each file's metadata read; the caller's function is
 * called as it was (one walk at a time per thread: a walk inside a walk's function is not seen into) */
static __thread int (*walk_nftw)(const char *, const struct stat *, int, struct FTW *);
static __thread int (*walk_ftw)(const char *, const struct stat *, int);
static void walked(const char *path, int kind) {
    char full[PT_MAX];
    if (!active() || !line_path(AT_FDCWD, path, full) || ignored(full))
        return;
    busy = 1;
    emit(kind == FTW_D || kind == FTW_DP || kind == FTW_DNR ? "d" : "m", full);
    busy = 0;
}
static int nftw_step(const char *path, const struct stat *st, int kind, struct FTW *at) {
    int saved = errno;
    walked(path, kind);
    errno = saved;
    return walk_nftw(path, st, kind, at);
}
static int ftw_step(const char *path, const struct stat *st, int kind) {
    int saved = errno;
    walked(path, kind);
    errno = saved;
    return walk_ftw(path, st, kind);
}
EXPORT int nftw(const char *dir, int (*fn)(const char *, const struct stat *, int, struct FTW *), int fds, int flags) {
    REAL(int, nftw, (const char *, int (*)(const char *, const struct stat *, int, struct FTW *), int, int));
    if (!active() || walk_nftw != NULL)
        return real_nftw(dir, fn, fds, flags);
    walk_nftw = fn;
    int r = real_nftw(dir, nftw_step, fds, flags);
    walk_nftw = NULL;
    return r;
}
EXPORT int ftw(const char *dir, int (*fn)(const char *, const struct stat *, int), int fds) {
    REAL(int, ftw, (const char *, int (*)(const char *, const struct stat *, int), int));
    if (!active() || walk_ftw != NULL)
        return real_ftw(dir, fn, fds);
    walk_ftw = fn;
    int r = real_ftw(dir, ftw_step, fds);
    walk_ftw = NULL;
    return r;
}

/* fts (the C library's): each folder it enters is listed, each file's metadata read */
EXPORT FTSENT *fts_read(FTS *walk) {
    REAL(FTSENT *, fts_read, (FTS *));
    FTSENT *e = real_fts_read(walk);
    if (e != NULL && e->fts_info != FTS_DP && active()) {  /* (a folder's second visit, on the way out: said) */
        int saved = errno;
        walked(e->fts_path, e->fts_info == FTS_D ? FTW_D : FTW_F);
        errno = saved;
    }
    return e;
}

/* a folder listed by its descriptor through the system call's own wrapper */
EXPORT ssize_t getdents64(int fd, void *buf, size_t size) {
    REAL(ssize_t, getdents64, (int, void *, size_t));
    ssize_t r = real_getdents64(fd, buf, size);
    if (r >= 0 && active()) {
        int saved = errno;
        listed_fd(fd);
        errno = saved;
    }
    return r;
}

/* ---- starting programs ---- */

/* the program a name runs (a name without "/" is looked for on PATH, as execvp does) */
static int program_path(const char *file, int search, char *out) {
    if (!search || strchr(file, '/'))
        return absolute(AT_FDCWD, file, out);
    const char *path = getenv("PATH");
    for (const char *p = path ? path : "/usr/bin:/bin"; p;) {
        const char *e = strchr(p, ':');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char candidate[PT_MAX];
        if (len + strlen(file) + 2 < PT_MAX) {
            snprintf(candidate, sizeof candidate, "%.*s/%s", (int)len, len ? p : ".", file);
            if (syscall(SYS_faccessat, AT_FDCWD, candidate, X_OK) == 0)
                return absolute(AT_FDCWD, candidate, out);
        }
        p = e ? e + 1 : NULL;
    }
    return 0;
}

/* a Python's one-letter options that drop its observer (isolated, no site, no PYTHON* variables), as
 * watches.drops_observer reads them: "" if none */
static void dropping_options(char *const argv[], char *flags) {
    int n = 0;
    flags[0] = 0;
    for (int i = 1; argv && argv[i]; i++) {
        const char *arg = argv[i];
        if (arg[0] != '-' || !arg[1] || arg[1] == '-')
            return;
        for (const char *c = arg + 1; *c; c++) {
            if (*c == 'c' || *c == 'm')
                return;  /* (the rest is its value: the code or the module) */
            if ((*c == 'I' || *c == 'S' || *c == 'E') && !strchr(flags, *c) && n < 3)
                flags[n++] = *c, flags[n] = 0;
            if (*c == 'X' || *c == 'W') {
                if (!c[1]) i++;  /* (-X dev: its value is the next word) */
                break;
            }
        }
    }
}

/* why a Python child will not load its observer ("": it will): as watches.drops_observer says it */
static void python_why(const char *program, char *const argv[], char *const envp[], char *why, size_t size) {
    char flags[4], boot[PT_MAX + 8];
    dropping_options(argv, flags);
    if (flags[0]) {
        snprintf(why, size, "a Python child started with -%s, which does not load the observer: %s", flags, program);
        return;
    }
    snprintf(boot, sizeof boot, "%sboot", folder);
    for (char *const *e = envp; e && *e; e++)
        if (strncmp(*e, "PYTHONPATH=", 11) == 0)
            for (const char *p = *e + 11; p;) {
                const char *end = strchr(p, ':');
                size_t len = end ? (size_t)(end - p) : strlen(p);
                if (len == strlen(boot) && strncmp(p, boot, len) == 0)
                    return;
                p = end ? end + 1 : NULL;
            }
    snprintf(why, size, "a Python child started with a PYTHONPATH without the observer's folder: %s", program);
}

/* a Go program (a ".go.buildinfo" section): Go reads files through its own system calls, not the C library */
static int go_program(int fd, const Elf64_Ehdr *eh) {
    Elf64_Shdr names, sh;
    char name[14];
    if (eh->e_shoff == 0 || eh->e_shstrndx == SHN_UNDEF || eh->e_shstrndx >= eh->e_shnum ||
        pread(fd, &names, sizeof names, (off_t)(eh->e_shoff + (Elf64_Off)eh->e_shstrndx * eh->e_shentsize)) !=
            (ssize_t)sizeof names)
        return 0;
    for (int i = 0; i < eh->e_shnum && i < 256; i++)
        if (pread(fd, &sh, sizeof sh, (off_t)(eh->e_shoff + (Elf64_Off)i * eh->e_shentsize)) == (ssize_t)sizeof sh &&
            sh.sh_name + sizeof name <= names.sh_size &&
            pread(fd, name, sizeof name, (off_t)(names.sh_offset + sh.sh_name)) == (ssize_t)sizeof name &&
            memcmp(name, ".go.buildinfo", sizeof name) == 0)
            return 1;
    return 0;
}

/* a static program of the system's that reads only the system's state: ldconfig (ctypes.util.find_library
 * and Triton run "ldconfig -p", which reads /etc/ld.so.cache), no stage's input */
static int system_tool(const char *program) {
    static const char *const tools[] = {"/sbin/ldconfig", "/usr/sbin/ldconfig", "/bin/ldconfig", "/usr/bin/ldconfig"};
    for (size_t i = 0; i < sizeof tools / sizeof *tools; i++)
        if (strcmp(program, tools[i]) == 0) return 1;
    return 0;
}

/* why what a program will read is unseen ("": it loads this library, and a Python its observer too): an
 * environment without the library, an ELF without an interpreter (static), set-user-ID (which ignores
 * LD_PRELOAD); a "#!" script's interpreter is what runs. In a Python, its observer judges its Python
 * children first (what it says is not said twice). */
static void unseen_why(const char *program, char *const argv[], char *const envp[], char *why, size_t size) {
    why[0] = 0;
    const char *name = strrchr(program, '/');
    if (strncmp(name ? name + 1 : program, "python", 6) == 0) {
        python_why(program, argv, envp, why, size);
        if (why[0] && in_python) {
            why[0] = 0;  /* (the Python observer said it) */
            return;
        }
        if (why[0])
            return;
    }
    if (system_tool(program))
        return;
    int preloads = 0;
    for (char *const *e = envp; e && *e; e++)
        if (strncmp(*e, "LD_PRELOAD=", 11) == 0 && strstr(*e, "parsl-torch-observe")) preloads = 1;
    struct stat st;
    if (syscall(SYS_newfstatat, AT_FDCWD, program, &st, 0) != 0)
        return;
    if (!preloads) {
        snprintf(why, size, "a program started with an environment without the observer: %s", program);
        return;
    }
    if (st.st_mode & (S_ISUID | S_ISGID)) {
        snprintf(why, size, "a set-user-ID program, which does not load the observer: %s", program);
        return;
    }
    int fd = (int)syscall(SYS_openat, AT_FDCWD, program, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return;
    Elf64_Ehdr eh;
    int is_static = 0, is_go = 0;
    if (pread(fd, &eh, sizeof eh, 0) == (ssize_t)sizeof eh && memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
        eh.e_ident[EI_CLASS] == ELFCLASS64) {
        is_static = 1;
        for (int i = 0; i < eh.e_phnum; i++) {
            Elf64_Phdr ph;
            if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + (Elf64_Off)i * eh.e_phentsize)) != (ssize_t)sizeof ph)
                break;
            if (ph.p_type == PT_INTERP) { is_static = 0; break; }
        }
        is_go = !ignored(program) && go_program(fd, &eh);  /* (an installed package's Go helper: the package's) */
    }
    close(fd);
    if (is_static)
        snprintf(why, size, "a static program, which does not load the observer: %s", program);
    else if (is_go)
        snprintf(why, size, "a Go program, which reads through its own system calls, unseen: %s", program);
}

/* before a program replaces this process (or starts as its child): the program is read (an edited
 * tool or script is a change), what it would read unseen is said, and a program other than Python reads
 * its whole environment (it needs no call to read a variable: "e *"; a Python's observer sees its reads, and
 * says it of the programs your code starts) */
static void starting(const char *file, int search, char *const argv[], char *const envp[]) {
    char program[PT_MAX], why[PT_MAX + 100];
    if (!folder[0] || busy || quiet || (in_python && !python_ready) || file == NULL ||
        !program_path(file, search, program))
        return;
    unseen_why(program, argv, envp, why, sizeof why);
    if (why[0])
        emit_now("x", why);
    const char *name = strrchr(program, '/');  /* (in a Python, its observer tells your code's starts from a package's) */
    if (!in_python && strncmp(name ? name + 1 : program, "python", 6) != 0 && !system_tool(program))
        emit_now("e", "*");
    if (!ignored(program)) {
        struct stat st;
        if (syscall(SYS_newfstatat, AT_FDCWD, program, &st, 0) == 0) {
            char state[PT_MAX + 80];
            snprintf(state, sizeof state, "%lld:%lld:%llu %s",
                     (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
                     (long long)st.st_size, (unsigned long long)st.st_ino, program);
            emit_now("t", state);
            emit_now("f", program);
        }
    }
}

EXPORT int execve(const char *file, char *const argv[], char *const envp[]) {
    REAL(int, execve, (const char *, char *const[], char *const[]));
    starting(file, 0, argv, envp);
    return real_execve(file, argv, envp);
}
EXPORT int execv(const char *file, char *const argv[]) {
    REAL(int, execv, (const char *, char *const[]));
    starting(file, 0, argv, environ);
    return real_execv(file, argv);
}
EXPORT int execvp(const char *file, char *const argv[]) {
    REAL(int, execvp, (const char *, char *const[]));
    starting(file, 1, argv, environ);
    return real_execvp(file, argv);
}
EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
    REAL(int, execvpe, (const char *, char *const[], char *const[]));
    starting(file, 1, argv, envp);
    return real_execvpe(file, argv, envp);
}

/* the execl family: their arguments gathered into an array on the stack (no malloc in a vfork child) */
#define PT_ARGS 4096

static char *const *gather(const char *first, va_list *ap, char **argv) {
    int n = 0;
    for (const char *arg = first; arg != NULL && n < PT_ARGS - 1; arg = va_arg(*ap, const char *))
        argv[n++] = (char *)arg;
    argv[n] = NULL;
    return argv;
}

EXPORT int execl(const char *file, const char *arg, ...) {
    char *argv[PT_ARGS];
    va_list ap; va_start(ap, arg); gather(arg, &ap, argv); va_end(ap);
    return execv(file, argv);
}
EXPORT int execlp(const char *file, const char *arg, ...) {
    char *argv[PT_ARGS];
    va_list ap; va_start(ap, arg); gather(arg, &ap, argv); va_end(ap);
    return execvp(file, argv);
}
EXPORT int execle(const char *file, const char *arg, ...) {
    char *argv[PT_ARGS];
    va_list ap; va_start(ap, arg); gather(arg, &ap, argv);
    char *const *envp = va_arg(ap, char *const *);  /* (after the NULL that ends the arguments) */
    va_end(ap);
    return execve(file, argv, envp);
}

EXPORT int posix_spawn(pid_t *pid, const char *file, const posix_spawn_file_actions_t *actions,
                       const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    REAL(int, posix_spawn, (pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
                            char *const[], char *const[]));
    starting(file, 0, argv, envp);
    return real_posix_spawn(pid, file, actions, attr, argv, envp);
}
EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *actions,
                        const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    REAL(int, posix_spawnp, (pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
                             char *const[], char *const[]));
    starting(file, 1, argv, envp);
    return real_posix_spawnp(pid, file, actions, attr, argv, envp);
}

/* ---- what the Python observer calls (ctypes) ---- */

/* the Python observer runs in this process (from now on, Python announces its listings) */
EXPORT void parsl_torch_observe_python(void) { in_python = python_ready = 1; }

/* what this thread reads from now on (until called with 0) is parsl-torch's own, not the stage's */
EXPORT void parsl_torch_observe_quiet(int on) { quiet = on; }

/* Python is about to list this folder (NULL: by a descriptor): the Python observer judges that listing */
EXPORT void parsl_torch_observe_lists(const char *path) {
    if (path == NULL) python_lists_fd = 1;
    else if (strlen(path) < PT_MAX) strcpy(python_lists, path);
}

/* a warm rank's next call: what was seen is forgotten; the call's places (one per line) and its start */
EXPORT void parsl_torch_observe_begin(const char *skip, const char *temp, double since) {
    pthread_mutex_lock(&lock);
    if (seen) memset(seen, 0, seen_size * sizeof *seen);
    seen_used = 0;
    if (out_fd >= 0) close(out_fd);
    out_fd = -1;
    places_are(skip, temp, since);
    pthread_mutex_unlock(&lock);
}

static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork(void) { pthread_mutex_unlock(&lock); }

__attribute__((constructor)) static void start(void) {
    char exe[PT_MAX];
    ssize_t n = (ssize_t)syscall(SYS_readlinkat, AT_FDCWD, "/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        const char *name = strrchr(exe, '/');
        in_python = strncmp(name ? name + 1 : exe, "python", 6) == 0;
    }
    configure();
    pthread_atfork(before_fork, after_fork, after_fork);  /* (a fork while another thread writes a line) */
    if (folder[0] && !in_python)
        emit("s", NULL);  /* (this process was observed; a Python's observer says so itself) */
}
