
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

extern char **environ;

static int fail(const char *what, const char *arg) {
    fprintf(stderr, "palaestra-exec: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    return 125;
}

static int set_limit(const char *spec) {
    const char *eq = strchr(spec, '=');
    if (!eq) { errno = EINVAL; return -1; }
    size_t n = (size_t)(eq - spec);
    int res;
    if (n == 5 && !strncmp(spec, "fsize", 5)) res = RLIMIT_FSIZE;
    else if (n == 4 && !strncmp(spec, "core", 4)) res = RLIMIT_CORE;
    else if (n == 6 && !strncmp(spec, "nofile", 6)) res = RLIMIT_NOFILE;
    else if (n == 2 && !strncmp(spec, "as", 2)) res = RLIMIT_AS;
    else { errno = EINVAL; return -1; }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(eq + 1, &end, 10);
    if (errno || *end) { errno = EINVAL; return -1; }
    struct rlimit rl = {(rlim_t)v, (rlim_t)v};
    return setrlimit(res, &rl);
}

static int launch(int argc, char **argv) {
    long uid = -1, gid = -1;
    int i = 2;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--")) { i++; break; }
        if (i + 1 >= argc) { errno = EINVAL; return fail("missing value for", argv[i]); }
        const char *opt = argv[i], *val = argv[++i];
        if (!strcmp(opt, "--cg")) {
            int fd = open(val, O_WRONLY | O_CLOEXEC);
            char buf[32];
            int len = snprintf(buf, sizeof buf, "%ld", (long)getpid());
            if (fd < 0 || write(fd, buf, (size_t)len) != len) {
                fprintf(stderr, "palaestra: cannot join the sandbox cgroup\n");
                return 125;
            }
            close(fd);
        } else if (!strcmp(opt, "--rl")) {
            if (set_limit(val) != 0) return fail("setrlimit", val);
        } else if (!strcmp(opt, "--ids")) {
            if (sscanf(val, "%ld:%ld", &uid, &gid) != 2) {
                errno = EINVAL;
                return fail("--ids", val);
            }
        } else {
            errno = EINVAL;
            return fail("unknown option", opt);
        }
    }
    if (i >= argc) { errno = EINVAL; return fail("no program to run", NULL); }
    if (gid >= 0) {
        if (setgroups(0, NULL) != 0) return fail("setgroups", NULL);
        if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0) return fail("setresgid", NULL);
    }
    if (uid >= 0 && setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0)
        return fail("setresuid", NULL);
    execv(argv[i], argv + i);
    return fail("cannot run", argv[i]);
}

static int read_all(int fd, char *buf, size_t n) {
    while (n) {
        ssize_t r = read(fd, buf, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        buf += r;
        n -= (size_t)r;
    }
    return 0;
}

static void close_above_2(void) {
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 3U, ~0U, 0U) == 0) return;
#endif
    long max = sysconf(_SC_OPEN_MAX);
    for (long fd = 3; fd < (max > 0 ? max : 65536); fd++) close((int)fd);
}

/* The next NUL-terminated field of [*p, end), or NULL when the request is malformed. */
static char *field(char **p, char *end) {
    char *s = *p;
    char *z = memchr(s, 0, (size_t)(end - s));
    if (!z) return NULL;
    *p = z + 1;
    return s;
}

/* The request's 8-byte header, and the descriptors sent with it (SCM_RIGHTS). */
static int recv_header(int fd, char *hdr, int *fds, int *nfds) {
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * 3)];
    } u;
    struct iovec iov = {hdr, 8};
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = u.buf;
    msg.msg_controllen = sizeof u.buf;
    ssize_t r;
    do r = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC); while (r < 0 && errno == EINTR);
    if (r <= 0) return -1;
    *nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            if (n > 3) n = 3;
            memcpy(fds, CMSG_DATA(c), n * sizeof(int));
            *nfds = (int)n;
        }
    }
    if (r < 8 && read_all(fd, hdr + r, (size_t)(8 - r)) != 0) return -1;
    return 0;
}

static int stub(int argc, char **argv) {
    if (argc < 3) return 125;
    int fd = atoi(argv[2]);
    char hdr[8];
    int fds[3], nfds = 0;
    if (write(fd, "R", 1) != 1) return 125;
    if (recv_header(fd, hdr, fds, &nfds) != 0) return 0; /* closed without a request */
    if (memcmp(hdr, "PXR1", 4) != 0) return 125;
    uint32_t len = (uint32_t)(unsigned char)hdr[4] | (uint32_t)(unsigned char)hdr[5] << 8 |
                   (uint32_t)(unsigned char)hdr[6] << 16 | (uint32_t)(unsigned char)hdr[7] << 24;
    char *body = malloc((size_t)len + 1);
    if (!body || read_all(fd, body, len) != 0) return 125;
    body[len] = 0;
    if (write(fd, "S", 1) != 1) return 125; /* took it: from here on, the command's outcome */
    char *p = body, *end = body + len;
    char *nul = field(&p, end), *cwd = field(&p, end), *cnt = field(&p, end);
    if (!nul || !cwd || !cnt) return 125;
    long envc = atol(cnt);
    if (envc < 0 || envc > (long)len) return 125;
    char **envp = calloc((size_t)envc + 1, sizeof(char *));
    if (!envp) return 125;
    for (long k = 0; k < envc; k++) if (!(envp[k] = field(&p, end))) return 125;
    if (!(cnt = field(&p, end))) return 125;
    long args = atol(cnt);
    if (args < 1 || args > (long)len) return 125;
    char **av = calloc((size_t)args + 1, sizeof(char *));
    if (!av) return 125;
    for (long k = 0; k < args; k++) if (!(av[k] = field(&p, end))) return 125;
    /* stdio sent with the request: [stdin,] stdout, stderr (never bwrap's own) */
    int first = nul[0] == '1' ? 1 : 0;
    if (nfds == 3 - first) {
        for (int k = 0; k < nfds; k++)
            if (dup2(fds[k], first + k) < 0) return 125;
    }
    if (nul[0] == '1') {
        int dn = open("/dev/null", O_RDONLY);
        if (dn < 0 || dup2(dn, 0) < 0) return fail("open", "/dev/null");
        if (dn != 0) close(dn);
    }
    close_above_2();
    if (chdir(cwd) != 0) {
        fprintf(stderr, "palaestra: can't chdir to %s: %s\n", cwd, strerror(errno));
        return 1;
    }
    environ = envp;
    execvp(av[0], av);
    if (errno == E2BIG) {
        fprintf(stderr, "palaestra: argument list too long (an argument over 128 KiB?)\n");
        return 126;
    }
    fprintf(stderr, "palaestra: execvp %s: %s\n", av[0], strerror(errno));
    return 127;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "launch")) return launch(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "stub")) return stub(argc, argv);
    fprintf(stderr, "usage: palaestra-exec launch|stub ...\n");
    return 2;
}
