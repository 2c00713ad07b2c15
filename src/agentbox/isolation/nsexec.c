/*
 * agentbox-nsexec: the small trusted launcher between the daemon and a sandbox.
 *
 * Python cannot safely join namespaces (setns of a user or mount namespace is refused
 * in a multi-threaded process) and starting an interpreter per command costs ~15 ms,
 * so this helper does the few syscalls that must happen between fork and exec.
 *
 * Three modes:
 *
 *   init READY_FD LIFETIME_S  (the sandbox's PID 1, started by bubblewrap --as-pid-1)
 *     Signal readiness by writing one byte to READY_FD, close every fd, then reap orphans
 *     forever. As a PID-namespace init with no handlers installed, it cannot be
 *     killed from inside the sandbox, so the agent cannot take its own sandbox down
 *     half-way; only the host (cgroup.kill) ends it, or its LIFETIME_S (0 = none).
 *
 *   spawn  --cgroup DIR... [--view PATH...] [--wait-fd N] --uid U --gid G -- ARGV
 *     Join the cgroups, detach (fork, parent exits 0), drop to the unprivileged host
 *     uid/gid, exec ARGV (bubblewrap). With --wait-fd, it first waits for one byte 'g'
 *     on fd N (and exits 125 on anything else, EOF included): the host starts it while
 *     the sandbox's disk and root are being mounted and says go once they are; nothing
 *     is joined or looked at before. (The joins come after the go, not during the wait:
 *     the first command's own cgroup moves then come soon enough after them to skip the
 *     RCU grace period a move after a quiet spell waits for.) With --view, first
 *     move into a mount namespace of its own whose root is a small tmpfs showing only
 *     what bubblewrap needs: the host's /usr, /etc, /proc, /dev (and the /bin, /lib...
 *     beside them) and each PATH (a sandbox's directory, the init tmpfs), bound at the
 *     same path. bubblewrap's start costs O(mounts it can see) (it copies the namespace
 *     and parses mountinfo for each bind); this way it sees a dozen, not every other
 *     sandbox's disk and root.
 *
 *   enter  --leaf DIR [--cgroup DIR...] --ns-pid PID --uid U --gid G --seccomp FILE [--cwd DIR]
 *          [--exit-file FILE] [--hold-stdin FIFO] [--detach] [--setsid] [--ctty]
 *          [--keep-fds N] -- ARGV
 *     Three processes: the launcher forks a middle process that joins the v1 cgroups
 *     (--cgroup, hybrid hosts) and every namespace of PID (user namespace last, so
 *     nested user namespaces are handled) and clones the command straight into the
 *     v2 cgroup --leaf (a pid namespace applies only to children); the command joins
 *     the cgroup namespace. The command closes every fd above 2, sets uid/gid, clears the
 *     capability bounding/ambient/permitted sets, sets no_new_privs, loads the seccomp
 *     filter, chdirs and execs. Each parent waits for its child and ends the same way
 *     (a signal is re-raised), so the status the daemon sees comes from waitpid, never
 *     from anything the sandboxed program can write. The launcher itself stays out of
 *     the sandbox's cgroups: killing a command's cgroup cannot kill the process that
 *     records its end. With --exit-file the status is also written there (background
 *     processes that outlive their creator). With --keep-fds N the command also keeps fds
 *     3..3+N-1 as the caller passed them (the browser's DevTools pipe: a pipe or socket
 *     each, checked before anything else is opened; nothing else is allowed there).
 *     With --hold-stdin FIFO (stdin is that FIFO's read end) the launcher holds its write
 *     end while the command runs, so the command sees EOF only when SIGUSR1 asks the
 *     launcher to let go (close_stdin), or never: a restart of the daemon changes nothing.
 *
 *   resident --socket PATH --leaf DIR [--cgroup DIR...] --ns-pid PID --uid U --gid G
 *            --seccomp FILE
 *     The middle process of enter, made resident (one per sandbox, started with it, or
 *     by a command that finds none): it listens on the host unix socket PATH (bound before it joins anything,
 *     mode 0600 in the sandbox's host directory, which no sandbox mount shows), forks
 *     into cgroup leaf DIR, joins the v1 cgroups and the ipc/uts/net/pid/mnt namespaces
 *     once, and then, per connection from host root (SO_PEERCRED uid 0), clones one
 *     command straight into the leaf whose directory fd the request carries and runs
 *     exactly enter's confinement (exec_confined: cgroup and user namespaces, fds, ids,
 *     caps, no_new_privs, seccomp, exec). It saves the per-command exec of this program,
 *     two forks, seven setns and the v1 cgroup moves, whose RCU grace period (8-21 ms
 *     after idle on hybrid hosts) dominated a command. It stays host root outside the
 *     sandbox's user and PID namespaces: the sandbox cannot see, signal or ptrace it, and
 *     it never resolves a path in the sandbox (the child does, after dropping to the
 *     sandbox user). It is in the sandbox's cgroups, so the sandbox's kill ends it; it
 *     also exits when the sandbox's init does.
 *     Request: [u32 LE body length] then the body, "A<arg>\0"... "E<VAR=value>\0"...
 *     "C<cwd>\0" and optionally "T\0" (a controlling tty: setsid + TIOCSCTTY), with
 *     SCM_RIGHTS on the first bytes: stdin, stdout, stderr, the leaf directory.
 *     Replies: "P" with the command's pidfd (SCM_RIGHTS), later "S" + its wait status
 *     (i32 LE) once it is reaped; or "S" alone when it could not be started (status
 *     125 << 8, the reason on its stderr, as enter would have said it).
 *
 * Order follows NOTES-linux: cgroup -> setns -> ids -> caps -> no_new_privs ->
 * seccomp -> exec. Any failure before exec exits 125 with a message on stderr
 * prefixed "agentbox-nsexec:", so the daemon can tell launcher errors from the
 * program's own exit codes; 127 means the program was not found, 126 not executable.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <grp.h>

#include "closefds.h"

#define LAUNCH_FAIL 125
#define MAX_CGROUPS 16
#define MAX_KEEP_FDS 8

/* With --exit-file, a launch failure is recorded there too, so nobody waits forever. */
static int g_exit_fd = -1;

/* --hold-stdin: the write end of the command's stdin FIFO; SIGUSR1 closes it (EOF). */
static volatile int g_stdin_fd = -1;

static void release_held_stdin(int sig) {
  (void)sig;
  int fd = g_stdin_fd;
  g_stdin_fd = -1;
  if (fd >= 0) close(fd);
}

static void record_launch_failure(void) {
  if (g_exit_fd >= 0) {
    char buf[8];
    int n = snprintf(buf, sizeof buf, "%d\n", LAUNCH_FAIL);
    if (write(g_exit_fd, buf, n) == n) fsync(g_exit_fd);
  }
}

static void die(const char *what) {
  int e = errno;
  dprintf(2, "agentbox-nsexec: %s: %s\n", what, strerror(e));
  record_launch_failure();
  _exit(LAUNCH_FAIL);
}

static void die_msg(const char *what) {
  dprintf(2, "agentbox-nsexec: %s\n", what);
  record_launch_failure();
  _exit(LAUNCH_FAIL);
}

static void join_cgroup(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/cgroup.procs", dir);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) die(path);
  /* "0" means the writing process itself. */
  if (write(fd, "0", 1) != 1) die(path);
  close(fd);
}

/* --view: the launcher's own mount namespace, rooted in a tmpfs. */
#define MAX_VIEWS 8
/* Shown whole (recursively bound) in every view; a view PATH may not lie under them. */
static const char *VIEW_BASE[] = {"/usr", "/etc", "/proc", "/dev"};
/* Beside /usr: symlinks on a merged-/usr host (copied as symlinks), directories elsewhere. */
static const char *VIEW_LINKS[] = {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"};
#define VIEW_ROOT "/tmp" /* covered by the tmpfs only inside the new namespace */

static int under(const char *path, const char *dir) {
  size_t n = strlen(dir);
  return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == 0);
}

/* mkdir -p of PATH (absolute) below the directory fd ROOT; returns an O_PATH fd on it. */
static int make_dirs(int root, const char *path) {
  char buf[4096];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) die_msg("--view path too long");
  int dir = dup(root);
  if (dir < 0) die("dup");
  for (char *name = strtok(buf, "/"); name; name = strtok(NULL, "/")) {
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) die_msg("--view path is not canonical");
    if (mkdirat(dir, name, 0755) < 0 && errno != EEXIST) die("mkdir in the launcher's root");
    int next = openat(dir, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) die("open in the launcher's root");
    close(dir);
    dir = next;
  }
  return dir;
}

static void bind_at(int source, int target) {
  char from[64], to[64];
  snprintf(from, sizeof from, "/proc/self/fd/%d", source);
  snprintf(to, sizeof to, "/proc/self/fd/%d", target);
  if (mount(from, to, NULL, MS_BIND | MS_REC, NULL) < 0) die("bind into the launcher's root");
}

static void private_view(const char **views, int nviews) {
  int base = sizeof VIEW_BASE / sizeof *VIEW_BASE, links = sizeof VIEW_LINKS / sizeof *VIEW_LINKS;
  int sources[MAX_VIEWS + 4];
  if (unshare(CLONE_NEWNS) < 0) die("unshare the mount namespace");
  /* Slave: unmounts on the host (a sandbox's teardown) still reach the copies here. */
  if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0) die("make / a slave");
  /* Opened in the new namespace (a bind's source must be in it) and before anything is
   * covered (a PATH may lie under VIEW_ROOT). */
  for (int v = 0; v < nviews; v++) {
    if (views[v][0] != '/') die_msg("--view needs an absolute path");
    for (int b = 0; b < base; b++)
      if (under(views[v], VIEW_BASE[b])) die_msg("--view path lies under /usr, /etc, /proc or /dev");
    for (int l = 0; l < links; l++)
      if (under(views[v], VIEW_LINKS[l])) die_msg("--view path lies under /bin, /sbin or /lib*");
    sources[v] = open(views[v], O_PATH | O_CLOEXEC);
    if (sources[v] < 0) die(views[v]);
  }
  for (int b = 0; b < base; b++) {
    sources[nviews + b] = open(VIEW_BASE[b], O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (sources[nviews + b] < 0) die(VIEW_BASE[b]);
  }
  if (mount("agentbox-launch", VIEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k") < 0)
    die("mount the launcher's root");
  int root = open(VIEW_ROOT, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) die(VIEW_ROOT);
  for (int v = 0; v < nviews + base; v++) {
    const char *path = v < nviews ? views[v] : VIEW_BASE[v - nviews];
    struct stat st;
    if (fstat(sources[v], &st) < 0) die(path);
    int target;
    if (S_ISDIR(st.st_mode)) {
      target = make_dirs(root, path);
    } else { /* a file: its directory, then an empty file to bind over */
      char dir[4096];
      snprintf(dir, sizeof dir, "%s", path);
      char *slash = strrchr(dir, '/');
      *slash = 0;
      int parent = make_dirs(root, dir);
      int fd = openat(parent, slash + 1, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
      if (fd < 0) die("create in the launcher's root");
      close(fd);
      target = openat(parent, slash + 1, O_PATH | O_NOFOLLOW | O_CLOEXEC);
      if (target < 0) die("open in the launcher's root");
      close(parent);
    }
    bind_at(sources[v], target);
    close(target);
    close(sources[v]);
  }
  for (int l = 0; l < links; l++) {
    char link[4096];
    ssize_t n = readlink(VIEW_LINKS[l], link, sizeof link - 1);
    if (n >= 0) {
      link[n] = 0;
      if (symlinkat(link, root, VIEW_LINKS[l] + 1) < 0) die("symlink in the launcher's root");
      continue;
    }
    int source = open(VIEW_LINKS[l], O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (source < 0) continue; /* the host has none: neither do we */
    int target = make_dirs(root, VIEW_LINKS[l]);
    bind_at(source, target);
    close(target);
    close(source);
  }
  /* bubblewrap mounts its staging tmpfs there (it exists already when a PATH lies under it) */
  if (mkdirat(root, "tmp", 01777) < 0 && errno != EEXIST) die("mkdir /tmp in the launcher's root");
  close(root);
  /* pivot_root(".", "."): the old root is stacked under the new one; detach it whole. */
  if (chdir(VIEW_ROOT) < 0) die(VIEW_ROOT);
  if (syscall(SYS_pivot_root, ".", ".") < 0) die("pivot_root");
  if (umount2(".", MNT_DETACH) < 0) die("detach the host's root");
  if (chdir("/") < 0) die("chdir /");
}

/* The namespaces of PID, opened while host paths still resolve. */
static const char *NS_NAMES[] = {"ipc", "uts", "net", "pid", "mnt", "cgroup", "user"};
enum { NS_COUNT = 7, NS_CGROUP = 5, NS_USER = 6 };

static void open_namespaces(int pid, int fds[NS_COUNT]) {
  char path[64];
  for (int i = 0; i < NS_COUNT; i++) {
    snprintf(path, sizeof path, "/proc/%d/ns/%s", pid, NS_NAMES[i]);
    fds[i] = open(path, O_RDONLY | O_CLOEXEC);
    if (fds[i] < 0) die(path);
  }
}

/* Joins namespaces [from, to) of fds. The cgroup and user namespaces are joined by the
 * command itself, after it was cloned into its cgroup (from inside the sandbox's cgroup
 * namespace the command's cgroup could not be named), cgroup first while still host
 * root, user last (a nested user namespace holds no rights over outer ones). */
static void join_namespaces(int fds[NS_COUNT], int from, int to) {
  for (int i = from; i < to; i++) {
    struct stat a, b;
    char self[64];
    snprintf(self, sizeof self, "/proc/self/ns/%s", NS_NAMES[i]);
    /* setns into the namespace we are already in fails for user namespaces. */
    if (!(stat(self, &a) == 0 && fstat(fds[i], &b) == 0 && a.st_ino == b.st_ino &&
          a.st_dev == b.st_dev)) {
      if (setns(fds[i], 0) < 0) die(NS_NAMES[i]);
    }
    close(fds[i]);
  }
}

/* fork() that puts the child straight into the cgroup directory LEAF_FD (clone3 with
 * CLONE_INTO_CGROUP): the parent itself never joins it, so killing that cgroup kills the
 * command's whole tree but never its waiting parent. */
struct clone_args_v2 {
  uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls,
      set_tid, set_tid_size, cgroup;
};
#define AB_CLONE_INTO_CGROUP 0x200000000ULL

static pid_t fork_into_cgroup(int leaf_fd) {
  struct clone_args_v2 args;
  memset(&args, 0, sizeof args);
  args.flags = AB_CLONE_INTO_CGROUP;
  args.exit_signal = SIGCHLD;
  args.cgroup = (uint64_t)leaf_fd;
  return (pid_t)syscall(435 /* clone3 */, &args, sizeof args);
}

static void drop_capabilities(void) {
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0) die("clear ambient caps");
  for (int cap = 0; cap <= 63; cap++) {
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) die("drop bounding cap");
  }
}

static void clear_capability_sets(void) {
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  if (syscall(SYS_capset, &hdr, data) < 0) die("capset");
}

/* Read before joining the sandbox's mount namespace, where host paths do not exist. */
static struct sock_fprog read_seccomp(const char *file) {
  int fd = open(file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) die(file);
  struct stat st;
  if (fstat(fd, &st) < 0) die(file);
  if (st.st_size <= 0 || st.st_size % sizeof(struct sock_filter) != 0 || st.st_size > 65536)
    die_msg("seccomp filter file has an invalid size");
  struct sock_filter *filter = malloc(st.st_size);
  if (!filter) die("malloc");
  ssize_t got = 0;
  while (got < st.st_size) {
    ssize_t n = read(fd, (char *)filter + got, st.st_size - got);
    if (n <= 0) die("read seccomp filter");
    got += n;
  }
  close(fd);
  struct sock_fprog prog = {(unsigned short)(st.st_size / sizeof(struct sock_filter)), filter};
  return prog;
}

static int parse_int(const char *s, const char *what) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < 0 || v > 0x7fffffff) {
    dprintf(2, "agentbox-nsexec: bad %s: %s\n", what, s);
    _exit(LAUNCH_FAIL);
  }
  return (int)v;
}

static void write_exit_file(int fd, int code) {
  if (fd < 0) return;
  /* One write of "CODE\n": a reader that finds no newline knows it is not finished. */
  char buf[16];
  int n = snprintf(buf, sizeof buf, "%d\n", code);
  if (write(fd, buf, n) == n) fsync(fd);
  close(fd);
}

/* A connected AF_UNIX stream socket: its peer is fixed for good. An unconnected or
 * datagram socket could be (re)connected, and an AF_UNIX or INET socket made on the host
 * reaches the host's abstract sockets and network from inside the sandbox. */
static int connected_unix_stream(int fd) {
  int domain = -1, type = -1;
  socklen_t len = sizeof domain;
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0 || domain != AF_UNIX) return 0;
  len = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_STREAM) return 0;
  struct sockaddr_un peer;
  len = sizeof peer;
  return getpeername(fd, (struct sockaddr *)&peer, &len) == 0;
}

/* --keep-fds N: fds 3..3+N-1 must already be open when we start, so that no fd we open
 * later (seccomp file, leaf directory, namespace fds, exit file: all O_CLOEXEC anyway)
 * can take one of those numbers. Each must be a pipe or a connected AF_UNIX stream
 * socket (what Playwright's --remote-debugging-pipe is): a directory or file of the host
 * handed to the sandbox is a way out of its mount namespace (CVE-2024-21626). */
static void check_kept_fds(int keep_fds) {
  for (int fd = 3; fd < 3 + keep_fds; fd++) {
    struct stat st;
    if (fstat(fd, &st) < 0) {
      dprintf(2, "agentbox-nsexec: --keep-fds: fd %d is not open\n", fd);
      _exit(LAUNCH_FAIL);
    }
    if (!S_ISFIFO(st.st_mode) && !(S_ISSOCK(st.st_mode) && connected_unix_stream(fd))) {
      dprintf(2, "agentbox-nsexec: --keep-fds: fd %d is not a pipe or a connected unix "
                 "stream socket\n", fd);
      _exit(LAUNCH_FAIL);
    }
  }
}

/* The waiting parents drop their copies of the kept fds: only the command holds the
 * pipe, so the caller sees EOF as soon as the command ends. */
static void close_kept_fds(int keep_fds) {
  if (keep_fds > 0) syscall(SYS_close_range, 3, 3 + keep_fds - 1, 0);
}

_Noreturn static void run_init(int ready_fd, int lifetime_s) {
  /* Not dumpable: the sandbox user (our uid) cannot open /proc/1/mem and friends. */
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) die("dumpable");
  if (write(ready_fd, "r", 1) != 1) die("readiness pipe");
  if (syscall(SYS_close_range, 0, ~0U, 0) < 0 && close_fds_but(-1) < 0) die("/proc/self/fd");
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  /* A blocked SIGCHLD stays pending, so sigwaitinfo wakes on every child exit. */
  sigprocmask(SIG_BLOCK, &chld, NULL);
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    siginfo_t info;
    struct timespec wait = {1, 0};
    if (lifetime_s > 0) {
      struct timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      long left = lifetime_s - (now.tv_sec - start.tv_sec);
      /* Max lifetime holds even with no daemon running: when a PID namespace's init
       * exits, the kernel kills every process in it. The host sweeps the rest. */
      if (left <= 0) _exit(0);
      wait.tv_sec = left;
    } else {
      wait.tv_sec = 3600;
    }
    sigtimedwait(&chld, &info, &wait);
  }
}

/* No blocked or ignored signal, whatever the host process that started us had: a gateway
 * started by `nohup ... &` ignores SIGHUP, SIGINT and SIGQUIT, and every command would
 * inherit that (an agent's Ctrl-C, a `kill -INT` of its own, did nothing). The raw call:
 * glibc refuses its own two (32, 33), which a posix_spawn'ed resident got ignored. An
 * all-zero kernel sigaction is SIG_DFL on every layout. */
static void default_signals(void) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  uint64_t dfl[8];
  memset(dfl, 0, sizeof dfl);
  for (int sig = 1; sig <= 64; sig++) syscall(SYS_rt_sigaction, sig, dfl, NULL, 8);
}

/* In the sandbox's namespaces, as the last step before the program runs. */
_Noreturn static void exec_confined(char **prog, int uid, int gid, const char *cwd,
                                    struct sock_fprog *filter, int want_setsid, int want_ctty,
                                    int ns_fds[NS_COUNT], int keep_fds) {
  default_signals();
  join_namespaces(ns_fds, NS_CGROUP, NS_COUNT);
  /* No host fd may reach the sandbox (CVE-2024-21626): keep only stdio, plus the
   * --keep-fds pipes (checked in check_kept_fds; every fd this program opened itself is
   * above them and O_CLOEXEC, and goes here too). */
  if (syscall(SYS_close_range, 3 + keep_fds, ~0U, 0) < 0) die("close_range");
  if (want_setsid || want_ctty) {
    if (setsid() < 0) die("setsid");
  }
  if (want_ctty && ioctl(0, TIOCSCTTY, 0) < 0) die("TIOCSCTTY");
  drop_capabilities();
  if (setresgid(gid, gid, gid) < 0) die("setresgid");
  if (setresuid(uid, uid, uid) < 0) die("setresuid");
  /* Set after the uid change, which clears it: the command dies with its launcher. */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) die("pdeathsig");
  clear_capability_sets();
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) die("no_new_privs");
  if (chdir(cwd ? cwd : "/") < 0) {
    dprintf(2, "agentbox-nsexec: cwd %s: %s\n", cwd ? cwd : "/", strerror(errno));
    _exit(LAUNCH_FAIL);
  }
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, filter, 0, 0) < 0) die("load seccomp filter");
  execvp(prog[0], prog);
  int e = errno;
  dprintf(2, "agentbox: %s: %s\n", prog[0], strerror(e));
  _exit(e == ENOENT ? 127 : 126);
}

/* Only the command needs stdio: drop our copies so readers see EOF when it ends. */
static void release_stdio(void) {
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0) return;
  dup2(devnull, 0);
  dup2(devnull, 1);
  dup2(devnull, 2);
  close(devnull);
}

static int wait_for(pid_t pid) {
  int status;
  for (;;) {
    pid_t r = waitpid(pid, &status, 0);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) die("waitpid");
  }
}

/* End the way the waited process ended: a signal is re-raised, not turned into a code. */
_Noreturn static void exit_like(int status) {
  if (WIFSIGNALED(status)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(WTERMSIG(status), &sa, NULL);
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    kill(getpid(), WTERMSIG(status));
  }
  _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

/* ---- resident ---------------------------------------------------------------------- */
#define MAX_COMMANDS 256
#define MAX_REQUEST (4 << 20) /* argv + environment: ARG_MAX-sized, with room */
#define REQUEST_FDS 4         /* stdin, stdout, stderr, the command's leaf directory */
#define AB_CLONE_PIDFD 0x1000ULL

extern char **environ;

struct command { int conn; pid_t pid; };

/* The length prefix and the fds that ride on it; 0 on success. */
static int receive_head(int conn, uint32_t *len, int fds[REQUEST_FDS]) {
  char control[CMSG_SPACE(sizeof(int) * REQUEST_FDS)];
  struct iovec iov = {len, sizeof *len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                       .msg_controllen = sizeof control};
  ssize_t got = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  int nfds = 0;
  if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
    nfds = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    memcpy(fds, CMSG_DATA(c), sizeof(int) * (nfds < REQUEST_FDS ? nfds : REQUEST_FDS));
  }
  if (got == (ssize_t)sizeof *len && nfds == REQUEST_FDS && !(msg.msg_flags & MSG_CTRUNC) &&
      *len > 0 && *len <= MAX_REQUEST)
    return 0;
  for (int i = 0; i < nfds && i < REQUEST_FDS; i++) close(fds[i]);
  return -1;
}

static void reply(int conn, char kind, const void *data, size_t len, int fd) {
  char buf[8] = {kind};
  memcpy(buf + 1, data, len);
  struct iovec iov = {buf, 1 + len};
  char control[CMSG_SPACE(sizeof(int))];
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  /* A few bytes into an empty socket buffer: never blocks; a host that left gets none. */
  (void)sendmsg(conn, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
}

struct request { char **argv, **envp; const char *cwd; int ctty; };

/* Splits the body into argv/envp (pointers into BODY); 0 on success. */
static int parse_request(char *body, uint32_t len, struct request *r) {
  if (body[len - 1] != 0) return -1;
  size_t nargs = 0, nenv = 0;
  for (char *p = body; p < body + len; p += strlen(p) + 1) {
    if (*p == 'A') nargs++;
    else if (*p == 'E') nenv++;
  }
  r->argv = calloc(nargs + 1, sizeof(char *));
  r->envp = calloc(nenv + 1, sizeof(char *));
  if (!r->argv || !r->envp) return -1;
  r->cwd = NULL;
  r->ctty = 0;
  nargs = nenv = 0;
  for (char *p = body; p < body + len; p += strlen(p) + 1) {
    if (*p == 'A') r->argv[nargs++] = p + 1;
    else if (*p == 'E') r->envp[nenv++] = p + 1;
    else if (*p == 'C') r->cwd = p + 1;
    else if (*p == 'T' && p[1] == 0) r->ctty = 1;
    else return -1;
  }
  return nargs > 0 && r->argv[0][0] ? 0 : -1;
}

/* The command: as enter's, from the point where the middle has cloned it. */
_Noreturn static void resident_child(struct request *r, int fds[REQUEST_FDS], int uid, int gid,
                                     struct sock_fprog *filter, int ns_fds[NS_COUNT]) {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) die("pdeathsig");
  /* The received fds are all above 2 (our 0-2 are /dev/null), so no dup2 clobbers one. */
  for (int i = 0; i < 3; i++)
    if (dup2(fds[i], i) < 0) die("dup2");
  environ = r->envp;
  exec_confined(r->argv, uid, gid, r->cwd, filter, r->ctty, r->ctty, ns_fds, 0);
}

/* One request on CONN: clone its command into its leaf, or say why not. */
static pid_t serve_request(int conn, int uid, int gid, struct sock_fprog *filter,
                           int ns_fds[NS_COUNT]) {
  uint32_t len;
  int fds[REQUEST_FDS];
  /* Bounded: a stuck request must not hold up every other command of the sandbox. */
  struct timeval limit = {5, 0};
  setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  if (receive_head(conn, &len, fds) < 0) return -1;
  char *body = malloc(len);
  struct request r = {0};
  pid_t child = -1;
  int failed = 0;
  /* Whole (the sender is host root, writing it at once), else no request. */
  if (!body || recv(conn, body, len, MSG_WAITALL) != (ssize_t)len ||
      parse_request(body, len, &r) < 0) {
    failed = -1; /* malformed: no command, no reply */
  } else {
    int pidfd = -1;
    struct clone_args_v2 args;
    memset(&args, 0, sizeof args);
    args.flags = AB_CLONE_INTO_CGROUP | AB_CLONE_PIDFD;
    args.pidfd = (uint64_t)(uintptr_t)&pidfd;
    args.exit_signal = SIGCHLD;
    args.cgroup = (uint64_t)fds[3];
    child = (pid_t)syscall(435 /* clone3 */, &args, sizeof args);
    if (child == 0) resident_child(&r, fds, uid, gid, filter, ns_fds);
    if (child < 0) {
      dprintf(fds[2], "agentbox-nsexec: clone3 into the command's cgroup: %s\n",
              strerror(errno));
      int32_t status = LAUNCH_FAIL << 8;
      reply(conn, 'S', &status, sizeof status, -1);
    } else {
      reply(conn, 'P', NULL, 0, pidfd);
      close(pidfd);
    }
  }
  free(r.argv);
  free(r.envp);
  free(body);
  for (int i = 0; i < REQUEST_FDS; i++) close(fds[i]);
  return failed ? -1 : child;
}

/* Only root of the host's user namespace: the runtime, the gateway, the CLI. */
static int from_host_root(int conn) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  return getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == 0;
}

_Noreturn static void serve(int listener, int init_pidfd, int uid, int gid,
                            struct sock_fprog *filter, int ns_fds[NS_COUNT]) {
  struct command running[MAX_COMMANDS];
  int count = 0;
  signal(SIGPIPE, SIG_IGN);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) die("signalfd");
  for (;;) {
    struct pollfd p[3] = {{listener, POLLIN, 0}, {sfd, POLLIN, 0}, {init_pidfd, POLLIN, 0}};
    if (poll(p, 3, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if (p[2].revents) _exit(0); /* the sandbox's init ended: so does the sandbox */
    if (p[1].revents) {
      struct signalfd_siginfo info;
      while (read(sfd, &info, sizeof info) > 0) {
      }
      int status;
      pid_t pid;
      while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < count; i++) {
          if (running[i].pid != pid) continue;
          int32_t s = status;
          reply(running[i].conn, 'S', &s, sizeof s, -1);
          close(running[i].conn);
          running[i] = running[--count];
          break;
        }
      }
    }
    if (p[0].revents) {
      int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
      if (conn < 0) continue;
      pid_t child = -1;
      if (count < MAX_COMMANDS && from_host_root(conn))
        child = serve_request(conn, uid, gid, filter, ns_fds);
      if (child > 0) {
        running[count].conn = conn;
        running[count].pid = child;
        count++;
      } else {
        close(conn); /* refused, malformed, or answered already (not started) */
      }
    }
  }
}

/* Binds PATH (a long one through its directory's fd: sun_path holds 108 bytes). */
static int listen_at(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) die("socket");
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) die_msg("--socket path too long");
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) die_msg("--socket needs an absolute path in a directory");
  *slash = 0;
  int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) die(dir);
  snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/%s", dfd, slash + 1);
  /* One resident per sandbox: starters that race (two first commands) take turns, and
   * one that finds a resident answering leaves it be. */
  int lock = openat(dfd, "launcher.lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock < 0 || flock(lock, LOCK_EX) < 0) die("lock the launcher socket");
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) _exit(0);
  close(fd);
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) die("socket");
  if (unlinkat(dfd, slash + 1, 0) < 0 && errno != ENOENT) die("remove the old socket");
  mode_t old = umask(0177); /* 0600 from birth: no moment where another uid may connect */
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0) die("bind the launcher socket");
  umask(old);
  if (listen(fd, 128) < 0) die("listen");
  close(lock); /* the next starter finds us listening */
  close(dfd);
  return fd;
}

_Noreturn static void run_resident(const char *socket_path, const char *leaf,
                                   const char **cgroups, int ncgroups, int ns_pid, int uid,
                                   int gid, const char *seccomp) {
  struct sock_fprog filter = read_seccomp(seccomp);
  /* Pins the sandbox's init: if its pid were reused after this, the pidfd says so. */
  int init_pidfd = (int)syscall(SYS_pidfd_open, ns_pid, 0);
  if (init_pidfd < 0) die("pidfd_open of the sandbox's init");
  int ns_fds[NS_COUNT];
  open_namespaces(ns_pid, ns_fds);
  struct pollfd alive = {init_pidfd, POLLIN, 0};
  if (poll(&alive, 1, 0) != 0) die_msg("the sandbox's init is gone");
  int listener = listen_at(socket_path);
  int leaf_fd = open(leaf, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (leaf_fd < 0) die(leaf);
  /* Detach into the sandbox's cgroup leaf: its kill ends us; the caller returns now
   * (the socket already listens: a request waits in its backlog until we serve). */
  pid_t pid = fork_into_cgroup(leaf_fd);
  if (pid < 0) die("clone3 into the launcher's cgroup");
  if (pid > 0) _exit(0);
  close(leaf_fd);
  if (setsid() < 0) die("setsid");
  for (int c = 0; c < ncgroups; c++) join_cgroup(cgroups[c]);
  release_stdio();
  join_namespaces(ns_fds, 0, NS_CGROUP);
  if (chdir("/") < 0) die("chdir /");
  serve(listener, init_pidfd, uid, gid, &filter, ns_fds);
}

int main(int argc, char **argv) {
  if (argc < 2) die_msg("usage: agentbox-nsexec init|spawn|enter|resident [options] [-- ARGV]");
  if (strcmp(argv[1], "init") == 0) {
    if (argc != 4) die_msg("usage: agentbox-nsexec init READY_FD LIFETIME_SECONDS");
    run_init(parse_int(argv[2], "fd"), parse_int(argv[3], "lifetime"));
  }
  int enter = strcmp(argv[1], "enter") == 0, resident = strcmp(argv[1], "resident") == 0;
  if (!enter && !resident && strcmp(argv[1], "spawn") != 0)
    die_msg("mode must be spawn, enter or resident");

  const char *cgroups[MAX_CGROUPS];
  int ncgroups = 0, ns_pid = -1, uid = -1, gid = -1, want_setsid = 0, want_ctty = 0;
  int want_detach = 0, keep_fds = 0, wait_fd = -1;
  const char *cwd = NULL, *seccomp = NULL, *exit_file = NULL, *leaf = NULL, *hold = NULL;
  const char *socket_path = NULL;
  const char *views[MAX_VIEWS];
  int nviews = 0;
  int i = 2;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) { i++; break; }
    int is_flag = !strcmp(a, "--setsid") || !strcmp(a, "--ctty") || !strcmp(a, "--detach");
    if (i + 1 >= argc && !is_flag) die_msg("option needs a value");
    if (strcmp(a, "--cgroup") == 0) {
      if (ncgroups == MAX_CGROUPS) die_msg("too many cgroups");
      cgroups[ncgroups++] = argv[++i];
    } else if (strcmp(a, "--view") == 0) {
      if (nviews == MAX_VIEWS) die_msg("too many --view paths");
      views[nviews++] = argv[++i];
    } else if (strcmp(a, "--ns-pid") == 0) ns_pid = parse_int(argv[++i], "pid");
    else if (strcmp(a, "--uid") == 0) uid = parse_int(argv[++i], "uid");
    else if (strcmp(a, "--gid") == 0) gid = parse_int(argv[++i], "gid");
    else if (strcmp(a, "--cwd") == 0) cwd = argv[++i];
    else if (strcmp(a, "--leaf") == 0) leaf = argv[++i];
    else if (strcmp(a, "--seccomp") == 0) seccomp = argv[++i];
    else if (strcmp(a, "--exit-file") == 0) exit_file = argv[++i];
    else if (strcmp(a, "--hold-stdin") == 0) hold = argv[++i];
    else if (strcmp(a, "--socket") == 0) socket_path = argv[++i];
    else if (strcmp(a, "--setsid") == 0) want_setsid = 1;
    else if (strcmp(a, "--ctty") == 0) want_ctty = 1;
    else if (strcmp(a, "--detach") == 0) want_detach = 1;
    else if (strcmp(a, "--keep-fds") == 0) keep_fds = parse_int(argv[++i], "--keep-fds");
    else if (strcmp(a, "--wait-fd") == 0) wait_fd = parse_int(argv[++i], "--wait-fd");
    else { dprintf(2, "agentbox-nsexec: unknown option %s\n", a); _exit(LAUNCH_FAIL); }
  }
  if (i >= argc && !resident) die_msg("no program given after --");
  if (uid < 0 || gid < 0) die_msg("--uid and --gid are required");
  char **prog = &argv[i];

  /* Supplementary groups are host groups: drop them while we may. */
  if (setgroups(0, NULL) < 0) die("setgroups");
  /* When the host runs out of memory, its OOM killer takes sandbox processes first, never
   * the gateway or another host daemon; inherited by everything started from here, and
   * without CAP_SYS_RESOURCE nothing inside can lower it. */
  int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom < 0 || write(oom, "1000", 4) != 4) die("oom_score_adj");
  close(oom);

  if ((enter || resident) && wait_fd >= 0) die_msg("--wait-fd is for spawn only");
  if (resident) {
    if (!socket_path || !leaf || !seccomp || ns_pid <= 0)
      die_msg("resident needs --socket, --leaf, --seccomp and --ns-pid");
    run_resident(socket_path, leaf, cgroups, ncgroups, ns_pid, uid, gid, seccomp);
  }
  if (!enter && keep_fds) die_msg("--keep-fds is for enter only");
  if (enter && nviews) die_msg("--view is for spawn only");
  if (!enter) {
    if (wait_fd >= 0) {
      char go = 0;
      ssize_t n;
      do n = read(wait_fd, &go, 1); while (n < 0 && errno == EINTR);
      if (n != 1 || go != 'g') die_msg("the host gave up on this launch before its go");
      close(wait_fd);
    }
    for (int c = 0; c < ncgroups; c++) join_cgroup(cgroups[c]);
    /* Detach: the sandbox must outlive whoever created it, and that process must not
     * inherit a zombie to reap; the host's init adopts the sandbox's monitor. */
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid > 0) _exit(0);
    if (setsid() < 0) die("setsid");
    if (nviews) private_view(views, nviews);
    if (setresgid(gid, gid, gid) < 0) die("setresgid");
    if (setresuid(uid, uid, uid) < 0) die("setresuid");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) die("no_new_privs");
    execvp(prog[0], prog);
    die(prog[0]);
  }

  if (ns_pid <= 0) die_msg("enter needs --ns-pid");
  if (!seccomp) die_msg("enter needs --seccomp");
  if (!leaf) die_msg("enter needs --leaf (the command's cgroup v2 directory)");
  if (keep_fds > MAX_KEEP_FDS) die_msg("--keep-fds is at most 8");
  if (keep_fds && want_detach) die_msg("--keep-fds and --detach do not go together");
  /* Before any open() below: see check_kept_fds. */
  check_kept_fds(keep_fds);
  int exit_fd = -1;
  if (exit_file) {
    exit_fd = open(exit_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (exit_fd < 0) die(exit_file);
    g_exit_fd = exit_fd;
  }
  if (want_detach) {
    /* Background processes: the waiter must outlive the caller without becoming a
     * zombie it has to reap, so the caller's child exits at once. */
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid > 0) _exit(0);
    if (setsid() < 0) die("setsid");
  }
  if (hold) {
    /* Opened by the waiting half (after --detach), which lives exactly as long as the
     * command; non-blocking: the FIFO's reader is our stdin, so this never waits. The
     * handler is installed first: a SIGUSR1 can only come once the command runs. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = release_held_stdin;
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGUSR1, &sa, NULL) < 0) die("sigaction");
    g_stdin_fd = open(hold, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (g_stdin_fd < 0) die(hold);
  }
  struct sock_fprog filter = read_seccomp(seccomp);
  /* The launcher stays outside the sandbox's cgroup, so killing a command's cgroup
   * (timeout, kill) never kills the process that records how the command ended. */
  pid_t middle = fork();
  if (middle < 0) die("fork");
  if (middle == 0) {
    g_exit_fd = -1; /* only the launcher records the exit */
    signal(SIGUSR1, SIG_DFL);
    release_held_stdin(0); /* only the launcher holds the command's stdin open */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) die("pdeathsig");
    /* v1 hierarchies (hybrid hosts): the middle joins them and the command inherits. */
    for (int c = 0; c < ncgroups; c++) join_cgroup(cgroups[c]);
    int leaf_fd = open(leaf, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (leaf_fd < 0) die(leaf);
    int ns_fds[NS_COUNT];
    open_namespaces(ns_pid, ns_fds);
    join_namespaces(ns_fds, 0, NS_CGROUP);
    pid_t child = fork_into_cgroup(leaf_fd);
    if (child < 0) die("clone3 into the command's cgroup");
    if (child == 0)
      exec_confined(prog, uid, gid, cwd, &filter, want_setsid, want_ctty, ns_fds, keep_fds);
    close_kept_fds(keep_fds);
    release_stdio();
    exit_like(wait_for(child));
  }
  close_kept_fds(keep_fds);
  release_stdio();
  int status = wait_for(middle);
  write_exit_file(exit_fd, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  exit_like(status);
}
