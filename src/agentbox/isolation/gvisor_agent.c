/*
 * agentbox-gvisor-agent: the first process of a gVisor-tier sandbox, and its exec agent.
 *
 * A `runsc exec` per command starts a new Go process on the host (~60 ms); this agent,
 * started once with the sandbox, makes a command one round trip on a unix socket.
 *
 *   agentbox-gvisor-agent READY_FD LIFETIME_S SOCKET
 *   agentbox-gvisor-agent exec COMMAND [ARG...]
 *
 * The second form wraps a command that the host starts with `runsc exec` (background
 * processes, PTY commands): see run_wrapped below.
 *
 * It does what the namespaces tier's init does (nsexec.c, `init`): it is not dumpable,
 * reaps orphans, ends the sandbox after LIFETIME_S (0 = never), and as the sandbox's
 * PID 1 with no handler for a fatal signal it cannot be killed from inside. Before the
 * readiness byte it listens on SOCKET, a path on a directory the host bound into the
 * sandbox: with runsc --host-uds=create the listening socket is a host socket there,
 * which the host connects to (the directory is the host's to own once we are ready).
 *
 * It runs as the sandbox user with the privilege a `runsc exec` of the same tier has:
 * CAP_SYS_ADMIN (for a new PID namespace per command) and CAP_SETPCAP (to empty a
 * command's bounding set) and nothing else, no_new_privs, inside gVisor. Each connection is one request, served by a forked worker:
 *
 *   host -> agent  frames [type u8][len u32 LE][data]:
 *     'A' an argv item, 'E' an environment entry K=V, 'C' the cwd, 'I' all of stdin
 *     (without one: /dev/null), 'G' go (ends the request); later 'K' (kill).
 *     A request of only 'Z' then 'G': kill every running command (a task's cancel).
 *   agent -> host  frames: 'O' stdout / 'R' stderr chunks, 'F' could not start (a
 *     message), 'X' the status (i32 LE: the exit code, or minus the signal number).
 *
 * The command is the init of a PID namespace of its own (`unshare --pid --fork` on the
 * runsc exec path): killing it (a 'K', the host hanging up, a 'Z') ends its whole tree,
 * setsid daemons included. It runs with no capability, none in its bounding set either
 * (nothing it execs can regain one), and no_new_privs. The host treats
 * every frame as untrusted (sizes bounded, types checked): code in the sandbox can only
 * lie about its own sandbox's commands.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "closefds.h"

#define MAX_REQUEST (8u << 20)
#define MAX_ITEMS 65536
#define CHUNK 65536
#define DRAIN_MS 1000

extern char **environ;

static void die(const char *what) {
  dprintf(2, "agentbox-gvisor-agent: %s: %s\n", what, strerror(errno));
  _exit(1);
}

/* ---- frames ---------------------------------------------------------------------- */

/* All `n` bytes, read or (`out`) written, past EINTR; -1 on an error or end of file. */
static int move_full(int fd, char *p, size_t n, int out) {
  while (n) {
    ssize_t moved = out ? write(fd, p, n) : read(fd, p, n);
    if (moved < 0 && errno == EINTR) continue;
    if (moved <= 0) return -1;
    p += moved;
    n -= (size_t)moved;
  }
  return 0;
}

static int read_full(int fd, void *buf, size_t n) { return move_full(fd, buf, n, 0); }

static int write_full(int fd, const void *buf, size_t n) {
  return move_full(fd, (char *)buf, n, 1); /* written from, never to */
}

static int send_frame(int fd, char type, const void *data, uint32_t len) {
  unsigned char head[5] = {(unsigned char)type, len & 0xff, (len >> 8) & 0xff,
                           (len >> 16) & 0xff, (len >> 24) & 0xff};
  if (write_full(fd, head, 5) < 0) return -1;
  return len ? write_full(fd, data, len) : 0;
}

struct request {
  char **argv, **env, *cwd, *stdin_data;
  size_t argc, envc, stdin_len;
  int killall;
};

/* Reads frames until 'G'; every item NUL-terminated. -1: a malformed request. */
static int read_request(int fd, struct request *r) {
  size_t total = 0;
  r->argv = calloc(MAX_ITEMS + 1, sizeof(char *));
  r->env = calloc(MAX_ITEMS + 1, sizeof(char *));
  if (!r->argv || !r->env) return -1;
  for (;;) {
    unsigned char head[5];
    if (read_full(fd, head, 5) < 0) return -1;
    uint32_t len = head[1] | head[2] << 8 | head[3] << 16 | (uint32_t)head[4] << 24;
    if (len > MAX_REQUEST || (total += len) > MAX_REQUEST) return -1;
    if (head[0] == 'G') return len == 0 && (r->argc > 0 || r->killall) ? 0 : -1;
    char *data = malloc(len + 1);
    if (!data || read_full(fd, data, len) < 0) return -1;
    data[len] = 0;
    switch (head[0]) {
      case 'A':
        if (r->argc == MAX_ITEMS) return -1;
        r->argv[r->argc++] = data;
        break;
      case 'E':
        if (r->envc == MAX_ITEMS) return -1;
        r->env[r->envc++] = data;
        break;
      case 'C': r->cwd = data; break;
      case 'I':
        r->stdin_data = data;
        r->stdin_len = len;
        break;
      case 'Z': r->killall = 1; break;
      default: return -1;
    }
  }
}

/* ---- one command ----------------------------------------------------------------- */

static volatile sig_atomic_t kill_requested;
static void on_killall(int sig) {
  (void)sig;
  kill_requested = 1;
}
static void on_child(int sig) { (void)sig; }

/* Every capability gone, the bounding set's too: exec as a non-root uid clears the
 * permitted set but keeps the bounding set, from which a file capability could give
 * one back. EINVAL past the kernel's last capability ends the loop. */
static void drop_capabilities(void) {
  for (int cap = 0;; cap++) {
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0) continue;
    if (errno == EINVAL) break;
    die("drop the bounding set");
  }
  struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  if (syscall(SYS_capset, &head, data) < 0) die("capset");
}

/* The command: PID 1 of its namespace, stdio on our pipes; errors go to `report`. */
_Noreturn static void exec_command(struct request *r, int in, int out, int err, int report) {
  if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) die("dup2");
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) die("pdeathsig");
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  signal(SIGCHLD, SIG_DFL);
  signal(SIGUSR1, SIG_DFL);
  setpgid(0, 0); /* out of the agent's group: a 'Z' signals workers, not commands */
  drop_capabilities();
  if (chdir(r->cwd ? r->cwd : "/workspace") < 0) {
    dprintf(report, "cwd %s: %s", r->cwd ? r->cwd : "/workspace", strerror(errno));
    _exit(125);
  }
  environ = r->env; /* execvp looks the program up on the request's PATH */
  execvp(r->argv[0], r->argv);
  int e = errno;
  dprintf(2, "agentbox: %s: %s\n", r->argv[0], strerror(e));
  _exit(e == ENOENT ? 127 : 126);
}

static int status_code(int status) {
  return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

static void pump(int sock, pid_t child, int in, int out, int err, struct request *r) {
  size_t fed = 0;
  int status = 0, exited = 0, host_gone = 0;
  struct timespec exited_at = {0, 0};
  char buf[CHUNK];
  sigset_t unblocked;
  sigemptyset(&unblocked);
  if (in >= 0 && r->stdin_len == 0) {
    close(in);
    in = -1;
  }
  for (;;) {
    if (exited && out < 0 && err < 0) break;
    if (kill_requested) {
      kill(child, SIGKILL);
      kill_requested = 0;
    }
    struct pollfd p[4] = {{out, POLLIN, 0}, {err, POLLIN, 0}, {in, POLLOUT, 0},
                          {host_gone ? -1 : sock, POLLIN, 0}};
    int wait_ms = -1;
    if (exited) {
      struct timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      long gone = (now.tv_sec - exited_at.tv_sec) * 1000 +
                  (now.tv_nsec - exited_at.tv_nsec) / 1000000;
      if (gone >= DRAIN_MS) break; /* a pipe held open past the end: stop */
      wait_ms = (int)(DRAIN_MS - gone);
    }
    struct timespec t = {wait_ms / 1000, (wait_ms % 1000) * 1000000L};
    int n = ppoll(p, 4, wait_ms < 0 ? NULL : &t, &unblocked);
    if (!exited && waitpid(child, &status, WNOHANG) == child) {
      exited = 1;
      clock_gettime(CLOCK_MONOTONIC, &exited_at);
      if (in >= 0) close(in);
      in = -1;
    }
    if (n <= 0) continue;
    for (int i = 0; i < 2; i++) {
      int *fd = i ? &err : &out;
      if (*fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t got = read(*fd, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        close(*fd);
        *fd = -1;
      } else if (!host_gone && send_frame(sock, i ? 'R' : 'O', buf, (uint32_t)got) < 0) {
        host_gone = 1;
        kill(child, SIGKILL);
      }
    }
    if (in >= 0 && p[2].revents) {
      ssize_t put = write(in, r->stdin_data + fed, r->stdin_len - fed);
      if (put > 0) fed += (size_t)put;
      if (put < 0 && errno != EAGAIN && errno != EINTR) fed = r->stdin_len; /* EPIPE */
      if (fed == r->stdin_len) {
        close(in);
        in = -1;
      }
    }
    if (!host_gone && p[3].revents) {
      unsigned char head[5];
      /* 'K', or the host hung up (a timeout, a cancel): the command's tree dies. */
      int hung_up = read_full(sock, head, 5) < 0;
      if (hung_up || head[0] == 'K') kill(child, SIGKILL);
      if (hung_up) host_gone = 1;
    }
  }
  if (!exited) {
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
  }
  int32_t code = status_code(status);
  unsigned char le[4] = {code & 0xff, (code >> 8) & 0xff, (code >> 16) & 0xff,
                         (code >> 24) & 0xff};
  if (!host_gone) send_frame(sock, 'X', le, 4);
}

_Noreturn static void serve(int sock) {
  struct request r;
  memset(&r, 0, sizeof r);
  if (read_request(sock, &r) < 0) {
    send_frame(sock, 'F', "malformed request", 17);
    _exit(1);
  }
  if (r.killall) {
    /* Every worker is in our process group (commands left it): they kill theirs. */
    signal(SIGUSR1, SIG_IGN);
    int32_t zero = 0;
    kill(0, SIGUSR1);
    send_frame(sock, 'X', &zero, 4);
    _exit(0);
  }
  int in[2] = {-1, -1}, out[2], err[2], report[2];
  if ((r.stdin_len && pipe2(in, O_CLOEXEC) < 0) || pipe2(out, O_CLOEXEC) < 0 ||
      pipe2(err, O_CLOEXEC) < 0 || pipe2(report, O_CLOEXEC) < 0)
    die("pipe");
  if (!r.stdin_len && (in[0] = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) die("/dev/null");
  /* A PID namespace per command: the child is its init, and its death ends the tree. */
  if (unshare(CLONE_NEWPID) < 0) {
    char msg[256];
    int n = snprintf(msg, sizeof msg, "new pid namespace: %s", strerror(errno));
    send_frame(sock, 'F', msg, (uint32_t)n);
    _exit(1);
  }
  /* vfork: no copy of our address space for a child that execs at once (under the
   * ptrace platform every new address space is a new host stub process). */
  pid_t child = vfork();
  if (child < 0) die("vfork");
  if (child == 0) exec_command(&r, in[0], out[1], err[1], report[1]);
  close(in[0]);
  close(out[1]);
  close(err[1]);
  close(report[1]);
  char msg[512];
  ssize_t n = read(report[0], msg, sizeof msg);
  close(report[0]);
  if (n > 0) {
    waitpid(child, NULL, 0);
    send_frame(sock, 'F', msg, (uint32_t)n);
    _exit(0);
  }
  if (in[1] >= 0) fcntl(in[1], F_SETFL, O_NONBLOCK);
  pump(sock, child, in[1], out[0], err[0], &r);
  _exit(0);
}

/* ---- a command started with runsc exec ------------------------------------------- */

/* What `runsc exec` runs (see isolation/gvisor.py, exec_process): the command as the init
 * of a PID namespace of its own, so SIGKILL to this process (whose pid runsc writes to
 * the host) ends the whole tree. Any other signal sent to this process is passed to the
 * command (SIGWINCH: to its terminal's foreground process group), so the host signals one pid it knows from the start: no lookup of a child
 * that may not exist yet. A signal from the terminal (SI_KERNEL: ^C, a resize) already
 * reached the command, which shares our process group: not passed twice. Our status is
 * the command's (a signal that killed it kills us). */
static volatile pid_t wrapped_child;

/* SIGWINCH to every process of the command's PID namespace. A child of ours is born in
 * it (the unshare below applies to our later children), so a helper forked here signals
 * all of it (-1) and its init, the command (which -1 leaves out). */
static void winch_namespace(void) {
  pid_t helper = fork();
  if (helper == 0) {
    kill(-1, SIGWINCH);
    kill(1, SIGWINCH);
    _exit(0);
  }
  if (helper > 0) waitpid(helper, NULL, 0);
}

static void pass_on(int sig, siginfo_t *info, void *context) {
  (void)context;
  if (info->si_code == SI_KERNEL || info->si_pid == getpid()) return;
  if (sig != SIGWINCH) {
    kill(wrapped_child, sig);
    return;
  }
  /* The Sentry does not see a host terminal's resize: the host sends SIGWINCH here,
   * for the terminal's foreground process group (a program run from the shell). When
   * the terminal names no group but ours (no job control below) or none at all, as
   * gVisor can leave a shell's terminal while a job runs (under load, 1 resize in 20-40
   * was lost), every process of the command gets it: they all share the terminal. */
  int saved = errno;
  pid_t foreground = tcgetpgrp(0);
  if (foreground > 0 && foreground != getpgrp())
    kill(-foreground, sig);
  else
    winch_namespace();
  errno = saved;
}

_Noreturn static void run_wrapped(char **argv) {
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old); /* pending until the child's pid is known */
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) die("dumpable");
  struct sigaction forward = {.sa_sigaction = pass_on, .sa_flags = SA_SIGINFO | SA_RESTART};
  for (int sig = 1; sig < NSIG; sig++)
    if (sig != SIGKILL && sig != SIGSTOP && sig != SIGCHLD) sigaction(sig, &forward, NULL);
  /* On a terminal, make it ours (runsc leaves a session leader without one): its
   * foreground process group can then be read, for SIGWINCH. No error is fatal. */
  if (isatty(0)) ioctl(0, TIOCSCTTY, 0);
  if (unshare(CLONE_NEWPID) < 0) die("new pid namespace");
  pid_t child = fork();
  if (child < 0) die("fork");
  if (child == 0) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) die("pdeathsig");
    for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);
    drop_capabilities();
    sigprocmask(SIG_SETMASK, &old, NULL);
    execvp(argv[0], argv);
    int e = errno;
    dprintf(2, "agentbox: %s: %s\n", argv[0], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
  }
  wrapped_child = child;
  sigprocmask(SIG_SETMASK, &old, NULL);
  int status;
  while (waitpid(child, &status, 0) < 0)
    if (errno != EINTR) die("wait");
  if (WIFSIGNALED(status)) {
    signal(WTERMSIG(status), SIG_DFL);
    sigprocmask(SIG_BLOCK, &all, NULL);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, WTERMSIG(status));
    sigprocmask(SIG_UNBLOCK, &only, NULL);
    kill(getpid(), WTERMSIG(status));
  }
  _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

/* ---- the agent ------------------------------------------------------------------- */

#define QUIET_NAME "agent-quiet" /* gvisor_host.QUIET_NAME */
static volatile sig_atomic_t quiesce, relisten;
static void on_quiesce(int sig) { (void)sig; quiesce = 1; }
static void on_relisten(int sig) { (void)sig; relisten = 1; }

static int listen_on(const char *path) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof addr.sun_path) return -1;
  strcpy(addr.sun_path, path);
  unlink(path); /* a stale one from before a stop or a checkpoint */
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 64) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int main(int argc, char **argv) {
  if (argc > 2 && strcmp(argv[1], "exec") == 0) run_wrapped(argv + 2);
  if (argc != 4) {
    dprintf(2, "usage: agentbox-gvisor-agent READY_FD LIFETIME_S SOCKET | exec COMMAND...\n");
    return 2;
  }
  int ready_fd = atoi(argv[1]), lifetime_s = atoi(argv[2]);
  /* Not dumpable: the sandbox user (our uid) cannot ptrace us or open /proc/1/mem. */
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) die("dumpable");
  int listener = listen_on(argv[3]);
  if (listener < 0) die("listen");
  if (write(ready_fd, "r", 1) != 1) die("readiness pipe");
  if (close_fds_but(listener) < 0) die("/proc/self/fd");
  sigset_t blocked;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGCHLD);
  sigaddset(&blocked, SIGUSR1);
  sigaddset(&blocked, SIGUSR2);
  sigaddset(&blocked, SIGHUP);
  sigprocmask(SIG_BLOCK, &blocked, NULL);
  /* From the host only (`runsc kill`: no command shares our PID namespace): SIGUSR2
   * closes the listener, whose host socket gVisor cannot checkpoint; SIGHUP opens it
   * again (after a checkpoint or a restore). */
  struct sigaction quiesce_action = {.sa_handler = on_quiesce};
  sigaction(SIGUSR2, &quiesce_action, NULL);
  struct sigaction relisten_action = {.sa_handler = on_relisten};
  sigaction(SIGHUP, &relisten_action, NULL);
  /* A handler only so that ppoll wakes. SIGUSR1 ('Z') is for the workers, which
   * install theirs: one set here would be inherited as a pending kill by every worker. */
  struct sigaction child_action = {.sa_handler = on_child};
  sigaction(SIGCHLD, &child_action, NULL);
  signal(SIGUSR1, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  sigset_t unblocked;
  sigemptyset(&unblocked);
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    struct timespec wait = {3600, 0};
    if (lifetime_s > 0) {
      struct timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      long left = lifetime_s - (now.tv_sec - start.tv_sec);
      if (left <= 0) _exit(0); /* the sandbox's max lifetime, even with no daemon */
      wait.tv_sec = left;
    }
    if (quiesce && listener >= 0) {
      close(listener);
      listener = -1;
      /* The host's acknowledgement (`runsc ps` shows PID 1's name): a connect to the
       * socket cannot tell, gVisor keeps the host socket listening, with no one to
       * accept, until it drops the path's cached dentry (seconds to minutes later). No
       * command can rename us: they are in a PID namespace of their own. */
      prctl(PR_SET_NAME, QUIET_NAME, 0, 0, 0);
    }
    if (relisten && listener < 0) {
      listener = listen_on(argv[3]);
      if (listener >= 0) prctl(PR_SET_NAME, "agent", 0, 0, 0);
    }
    quiesce = relisten = 0;
    struct pollfd p = {listener, POLLIN, 0};
    if (ppoll(&p, 1, &wait, &unblocked) <= 0 || !(p.revents & POLLIN)) continue;
    int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0) continue;
    pid_t worker = fork();
    if (worker == 0) {
      struct sigaction kill_action = {.sa_handler = on_killall};
      sigaction(SIGUSR1, &kill_action, NULL);
      signal(SIGUSR2, SIG_DFL);
      signal(SIGHUP, SIG_DFL);
      close(listener);
      serve(conn);
    }
    close(conn);
  }
}
