/*
 * The slow file system emulator's C engine: a read-only FUSE passthrough
 * that sleeps a fixed latency in every open and shares one bandwidth cap
 * among all reads. Same behaviour and command line as the Python engine
 * (stager/slowfs.py); it exists because the emulator must deliver the
 * latency and bandwidth it is given: in Python its own CPU time (about
 * 0.6 ms a file) capped a 2-core machine near 1,000 files/s, below the
 * rates the benchmark's bound assumes.
 *
 * Usage: slowfsd SRC MNT [--open-ms F] [--mbps F] [--ready-fd N]
 *                [--owner-fd N] [--remove-mountpoint] [--ignore-interrupts]
 *
 * --ready-fd: "ready\n" is written there once the kernel has answered
 *   INIT, i.e. the mount is usable, and the descriptor is closed.
 * The mount's source name is "stager-slowfs:<pid>", so that `stager slowfs
 * umount` finds the daemon in /proc/self/mounts.
 * --owner-fd: read end of a pipe held by the owner; at end-of-file (the
 *   owner died or closed it) the daemon lazily unmounts itself and, with
 *   --remove-mountpoint, removes the mount point. Lines written on it change
 *   the settings while mounted: "open-ms F" or "mbps F" (a source that gets
 *   slower mid-run).
 * --ignore-interrupts: a sleeping open or read never gives up when its
 *   caller is interrupted, as a hung server never answers: a reader killed
 *   meanwhile stays in the kernel until the daemon answers or dies. By
 *   default the sleep ends with EINTR once the kernel forwards the caller's
 *   signal (FUSE_INTERRUPT), so a killed reader is gone at once.
 * Built by stager.slowfs with: cc -O2 slowfsd.c $(pkg-config --cflags --libs fuse3)
 */

#define FUSE_USE_VERSION 312
#define _GNU_SOURCE

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static struct {
    char root[PATH_MAX];
    char mountpoint[PATH_MAX];
    volatile double open_s;       /* changed by the owner's lines while serving */
    volatile double bytes_per_s;
    int ready_fd;
    int owner_fd;
    int remove_mountpoint;
    int ignore_interrupts;
    volatile int owner_gone;
} opt = {.ready_fd = -1, .owner_fd = -1};

static pthread_mutex_t throttle_lock = PTHREAD_MUTEX_INITIALIZER;
static double free_at;  /* when the shared link is next idle, CLOCK_MONOTONIC seconds */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* How late nanosleep wakes up, on average: 0.1 to 0.7 ms here, the
 * daemon's own scheduling delay on a busy machine, which a remote server's
 * latency would not include. Sleeps are shortened by it, by at most a tenth
 * of their length, so that the latency delivered is the one asked for and a
 * burst of late wake-ups can never cancel the latency altogether. */
static pthread_mutex_t lateness_lock = PTHREAD_MUTEX_INITIALIZER;
static double lateness;

/* The longest single nanosleep: a request the kernel interrupts is
 * noticed within this (libfuse sets a flag; polling it needs no signal, so
 * an interrupt that arrives before the sleep starts is not lost). */
#define INTERRUPT_POLL_S 0.02

/* Sleeps until `deadline`; -EINTR if the caller's request was interrupted
 * meanwhile (and interrupts are honoured), else 0. */
static int sleep_until(double deadline)
{
    double now = now_s();
    if (deadline <= now)
        return 0;
    pthread_mutex_lock(&lateness_lock);
    double early = lateness;
    pthread_mutex_unlock(&lateness_lock);
    if (early > (deadline - now) / 10)
        early = (deadline - now) / 10;
    double wake = deadline - early;
    for (;;) {
        if (!opt.ignore_interrupts && fuse_interrupted())
            return -EINTR;
        double seconds = wake - now_s();
        if (seconds <= 0)
            break;
        if (seconds > INTERRUPT_POLL_S)
            seconds = INTERRUPT_POLL_S;
        struct timespec ts;
        ts.tv_sec = (time_t)seconds;
        ts.tv_nsec = (long)((seconds - ts.tv_sec) * 1e9);
        nanosleep(&ts, NULL);
    }
    double late = now_s() - wake;
    pthread_mutex_lock(&lateness_lock);
    lateness += (late - lateness) / 16;
    pthread_mutex_unlock(&lateness_lock);
    return 0;
}

/* Each read books the next free slot on one shared timeline, then waits
 * until its bytes would have arrived: concurrent readers share the rate. */
static int throttle(size_t nbytes)
{
    if (opt.bytes_per_s <= 0 || nbytes == 0)
        return 0;
    pthread_mutex_lock(&throttle_lock);
    double now = now_s();
    double start = free_at > now ? free_at : now;
    double rate = opt.bytes_per_s;  /* read again under the lock: the owner may change it */
    free_at = start + (rate > 0 ? nbytes / rate : 0);
    double done = free_at;
    pthread_mutex_unlock(&throttle_lock);
    return sleep_until(done);
}

static int full_path(char *out, const char *path)
{
    int n = snprintf(out, PATH_MAX, "%s%s", opt.root, path);
    return n >= PATH_MAX ? -ENAMETOOLONG : 0;
}

/* Coherent attributes, as on Lustre. The kernel keeps names and attributes
 * (sfs_init), yet a file changed in the tree beneath must not keep showing
 * its old size and times: on Lustre a writer revokes every client's lock on
 * the file, and the client's next stat asks the servers again. Here inotify
 * reports each change in the tree and the daemon drops the kernel's cached
 * attributes of that path. Each open first applies the changes already
 * reported, so an fstat after an open always sees a change made before it
 * (Lustre's open returns the file's current attributes); a change during
 * an open file's reads is applied by the watcher thread within moments. */
static struct fuse *the_fuse;
static int changes_fd = -1;
static pthread_mutex_t changes_lock = PTHREAD_MUTEX_INITIALIZER;
static char **watched;  /* by watch descriptor: the directory's path under the root ("" is the root) */
static int watched_len;

#define CHANGES (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO)

/* Watches `rel` (a directory under the root) and every directory below it. */
static void watch_tree(const char *rel)
{
    char full[PATH_MAX];
    if (snprintf(full, sizeof full, "%s%s", opt.root, rel[0] ? rel : "/") >= (int)sizeof full)
        return;
    int wd = inotify_add_watch(changes_fd, full, CHANGES | IN_ONLYDIR);
    if (wd < 0) {
        static int warned;
        if (!warned++)
            fprintf(stderr, "slowfsd: cannot watch %s (%s): files changed in the tree may show their old "
                            "attributes\n", full, strerror(errno));
        return;
    }
    if (wd >= watched_len) {
        int len = wd * 2 + 16;
        char **grown = realloc(watched, (size_t)len * sizeof *watched);
        if (grown == NULL)
            return;
        memset(grown + watched_len, 0, (size_t)(len - watched_len) * sizeof *watched);
        watched = grown;
        watched_len = len;
    }
    free(watched[wd]);
    watched[wd] = strdup(rel);
    DIR *dir = opendir(full);
    if (dir == NULL)
        return;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0)
            continue;
        char sub[PATH_MAX];
        if (snprintf(sub, sizeof sub, "%s/%s", rel, entry->d_name) >= (int)sizeof sub)
            continue;
        int is_dir = entry->d_type == DT_DIR;
        if (entry->d_type == DT_UNKNOWN) {
            struct stat st;
            char path[PATH_MAX];
            is_dir = snprintf(path, sizeof path, "%s%s", opt.root, sub) < (int)sizeof path
                     && lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
        }
        if (is_dir)
            watch_tree(sub);
    }
    closedir(dir);
}

/* Applies every change reported so far. Called with changes_lock held. */
static void apply_changes(void)
{
    char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t n;
    while ((n = read(changes_fd, buf, sizeof buf)) > 0) {
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            p += sizeof *ev + ev->len;
            if (ev->wd < 0 || ev->wd >= watched_len || watched[ev->wd] == NULL)
                continue;
            if (ev->mask & IN_IGNORED) {
                free(watched[ev->wd]);
                watched[ev->wd] = NULL;
                continue;
            }
            if (ev->len == 0)
                continue;
            char rel[PATH_MAX];
            if (snprintf(rel, sizeof rel, "%s/%s", watched[ev->wd], ev->name) >= (int)sizeof rel)
                continue;
            if ((ev->mask & IN_ISDIR) && (ev->mask & (IN_CREATE | IN_MOVED_TO)))
                watch_tree(rel);
            fuse_invalidate_path(the_fuse, rel);  /* -ENOENT when the kernel holds nothing of it */
        }
    }
}

static void take_changes(void)
{
    if (changes_fd < 0)
        return;
    pthread_mutex_lock(&changes_lock);
    apply_changes();
    pthread_mutex_unlock(&changes_lock);
}

static void *watch_changes(void *unused)
{
    (void)unused;
    struct pollfd pfd = {.fd = changes_fd, .events = POLLIN};
    while (poll(&pfd, 1, -1) >= 0 || errno == EINTR)
        take_changes();
    return NULL;
}

static void start_watching(struct fuse *fuse)
{
    the_fuse = fuse;
    changes_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (changes_fd < 0) {
        fprintf(stderr, "slowfsd: inotify: %s: files changed in the tree may show their old attributes\n",
                strerror(errno));
        return;
    }
    pthread_mutex_lock(&changes_lock);
    watch_tree("");
    pthread_mutex_unlock(&changes_lock);
    pthread_t thread;
    if (pthread_create(&thread, NULL, watch_changes, NULL) == 0)
        pthread_detach(thread);
}

static void *sfs_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
    (void)conn;
    /* The tree is read-only and must not change under a run (the catalog
     * checks sizes and times), so the kernel may keep names and attributes:
     * an open then costs one OPEN round trip, as an open on Lustre costs one
     * intent RPC, not a LOOKUP and a GETATTR first. The open latency is
     * still paid on every open, and data is never cached across opens. */
    cfg->entry_timeout = 3600;
    cfg->attr_timeout = 3600;  /* dropped when the file changes (watch_changes) */
    cfg->negative_timeout = 1;
    if (opt.ready_fd >= 0) {
        ssize_t ignored = write(opt.ready_fd, "ready\n", 6);
        (void)ignored;
        close(opt.ready_fd);
        opt.ready_fd = -1;
    }
    return NULL;
}

static int sfs_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
    char full[PATH_MAX];
    int rc;
    if (fi != NULL)
        rc = fstat((int)fi->fh, st);
    else if ((rc = full_path(full, path)) == 0)
        rc = lstat(full, st);
    if (rc == -1)
        return -errno;
    if (rc < 0)
        return rc;
    st->st_mode &= ~0222;  /* read only */
    return 0;
}

static int sfs_readlink(const char *path, char *buf, size_t size)
{
    char full[PATH_MAX];
    int rc = full_path(full, path);
    if (rc)
        return rc;
    ssize_t n = readlink(full, buf, size - 1);
    if (n == -1)
        return -errno;
    buf[n] = '\0';
    return 0;
}

static int sfs_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t offset,
                       struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
    (void)offset; (void)fi; (void)flags;
    char full[PATH_MAX];
    int rc = full_path(full, path);
    if (rc)
        return rc;
    DIR *dir = opendir(full);
    if (dir == NULL)
        return -errno;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        struct stat st = {.st_ino = entry->d_ino, .st_mode = (mode_t)DTTOIF(entry->d_type)};
        if (filler(buf, entry->d_name, &st, 0, 0))
            break;
    }
    closedir(dir);
    return 0;
}

static int sfs_open(const char *path, struct fuse_file_info *fi)
{
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & (O_APPEND | O_TRUNC | O_CREAT)))
        return -EROFS;
    char full[PATH_MAX];
    int rc = full_path(full, path);
    if (rc)
        return rc;
    take_changes();
    double open_s = opt.open_s;  /* once: the owner may change it meanwhile */
    if (open_s > 0 && (rc = sleep_until(now_s() + open_s)) != 0)
        return rc;
    int fd = open(full, O_RDONLY);
    if (fd == -1)
        return -errno;
    fi->fh = (uint64_t)fd;
    return 0;
}

static int sfs_read(const char *path, char *buf, size_t size, off_t offset, struct fuse_file_info *fi)
{
    (void)path;
    ssize_t n = pread((int)fi->fh, buf, size, offset);
    if (n == -1)
        return -errno;
    int rc = throttle((size_t)n);
    return rc ? rc : (int)n;
}

static int sfs_release(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    close((int)fi->fh);
    return 0;
}

static int sfs_statfs(const char *path, struct statvfs *sv)
{
    char full[PATH_MAX];
    int rc = full_path(full, path);
    if (rc)
        return rc;
    return statvfs(full, sv) == -1 ? -errno : 0;
}

static const struct fuse_operations operations = {
    .init = sfs_init,
    .getattr = sfs_getattr,
    .readlink = sfs_readlink,
    .readdir = sfs_readdir,
    .open = sfs_open,
    .read = sfs_read,
    .release = sfs_release,
    .statfs = sfs_statfs,
};

static void lazy_unmount(void)
{
    char *argv[] = {"fusermount3", "-u", "-z", opt.mountpoint, NULL};
    pid_t pid;
    if (posix_spawnp(&pid, "fusermount3", NULL, NULL, argv, environ) == 0)
        waitpid(pid, NULL, 0);
}

/* Blocks until the owner closes its end of the pipe, which the kernel does
 * when the owner dies, however it dies; a clean owner unmounts first. */
static void apply_setting(const char *line)
{
    char name[32];
    double value;
    if (sscanf(line, "%31s %lf", name, &value) != 2 || value < 0) {
        fprintf(stderr, "slowfsd: ignoring setting '%s'\n", line);
        return;
    }
    if (strcmp(name, "open-ms") == 0)
        opt.open_s = value / 1000.0;
    else if (strcmp(name, "mbps") == 0)
        opt.bytes_per_s = value * 1e6;
    else
        fprintf(stderr, "slowfsd: unknown setting '%s'\n", name);
}

static void *watch_owner(void *unused)
{
    (void)unused;
    char line[256];
    size_t used = 0;
    ssize_t n;
    while ((n = read(opt.owner_fd, line + used, sizeof line - 1 - used)) > 0) {
        used += (size_t)n;
        line[used] = '\0';
        char *start = line, *end;
        while ((end = strchr(start, '\n')) != NULL) {
            *end = '\0';
            apply_setting(start);
            start = end + 1;
        }
        used = strlen(start);
        memmove(line, start, used);
        if (used == sizeof line - 1)
            used = 0;  /* a line too long to be a setting */
    }
    opt.owner_gone = 1;
    lazy_unmount();
    return NULL;
}

static double number(const char *flag, const char *text)
{
    char *end;
    double value = strtod(text, &end);
    if (*text == '\0' || *end != '\0' || value < 0) {
        fprintf(stderr, "slowfsd: %s needs a non-negative number, got '%s'\n", flag, text);
        exit(2);
    }
    return value;
}

int main(int argc, char **argv)
{
    const char *positional[2] = {NULL, NULL};
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (strcmp(a, "--open-ms") == 0 && has_value)
            opt.open_s = number(a, argv[++i]) / 1000.0;
        else if (strcmp(a, "--mbps") == 0 && has_value)
            opt.bytes_per_s = number(a, argv[++i]) * 1e6;
        else if (strcmp(a, "--ready-fd") == 0 && has_value)
            opt.ready_fd = (int)number(a, argv[++i]);
        else if (strcmp(a, "--owner-fd") == 0 && has_value)
            opt.owner_fd = (int)number(a, argv[++i]);
        else if (strcmp(a, "--remove-mountpoint") == 0)
            opt.remove_mountpoint = 1;
        else if (strcmp(a, "--ignore-interrupts") == 0)
            opt.ignore_interrupts = 1;
        else if (a[0] != '-' && npos < 2)
            positional[npos++] = a;
        else {
            fprintf(stderr, "slowfsd: unexpected argument '%s'\n"
                            "usage: slowfsd SRC MNT [--open-ms F] [--mbps F] [--ready-fd N] [--owner-fd N] "
                            "[--remove-mountpoint] [--ignore-interrupts]\n", a);
            return 2;
        }
    }
    if (npos != 2) {
        fprintf(stderr, "slowfsd: need SRC and MNT\n");
        return 2;
    }
    if (realpath(positional[0], opt.root) == NULL) {
        fprintf(stderr, "slowfsd: source %s: %s\n", positional[0], strerror(errno));
        return 1;
    }
    if (realpath(positional[1], opt.mountpoint) == NULL) {
        fprintf(stderr, "slowfsd: mount point %s: %s\n", positional[1], strerror(errno));
        return 1;
    }
    if (strcmp(opt.root, "/") == 0)
        opt.root[0] = '\0';  /* paths from FUSE start with '/' */

    char fsname_opt[PATH_MAX];
    snprintf(fsname_opt, sizeof fsname_opt, "-ofsname=stager-slowfs:%d", (int)getpid());
    char *fuse_argv[] = {argv[0], "-oro", "-odefault_permissions", fsname_opt, NULL};
    struct fuse_args args = FUSE_ARGS_INIT(4, fuse_argv);
    struct fuse *fuse = fuse_new(&args, &operations, sizeof operations, NULL);
    if (fuse == NULL)
        return 1;
    if (fuse_mount(fuse, opt.mountpoint) != 0) {
        fuse_destroy(fuse);
        return 1;
    }
    if (fuse_set_signal_handlers(fuse_get_session(fuse)) != 0) {
        fuse_unmount(fuse);
        fuse_destroy(fuse);
        return 1;
    }
    start_watching(fuse);
    pthread_t watcher;
    if (opt.owner_fd >= 0)
        pthread_create(&watcher, NULL, watch_owner, NULL);

    /* libfuse serves 10 requests at once by default: fewer than the opens a
     * parallel file system takes at once, and than 16 prefetchers. */
    struct fuse_loop_config *loop = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(loop, 128);
    fuse_loop_cfg_set_idle_threads(loop, 32);
    int rc = fuse_loop_mt(fuse, loop);
    fuse_loop_cfg_destroy(loop);

    fuse_remove_signal_handlers(fuse_get_session(fuse));
    fuse_unmount(fuse);
    fuse_destroy(fuse);
    if (opt.owner_gone && opt.remove_mountpoint)
        rmdir(opt.mountpoint);  /* the owner made it and can no longer remove it */
    return rc == 0 ? 0 : 1;
}
