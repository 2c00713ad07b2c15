/* Shared by nsexec.c and gvisor_agent.c: isolation/launcher.py copies it beside the
 * source it builds and hashes it with that source. */
#ifndef AGENTBOX_CLOSEFDS_H
#define AGENTBOX_CLOSEFDS_H

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

/* gVisor before 2023 (the gvisor tier's runsc) has no close_range: close what
 * /proc/self/fd lists but `keep` (-1: none), one by one, until it lists only its own fd.
 * -1 when /proc/self/fd cannot be read. */
static int close_fds_but(int keep) {
  for (int pass = 0; pass < 4; pass++) {
    DIR *fds = opendir("/proc/self/fd");
    if (!fds) return -1;
    int own = dirfd(fds), closed = 0;
    struct dirent *entry;
    while ((entry = readdir(fds)) != NULL) {
      int fd = atoi(entry->d_name);
      if (entry->d_name[0] != '.' && fd != own && fd != keep && close(fd) == 0) closed++;
    }
    closedir(fds);
    if (!closed) break;
  }
  return 0;
}

#endif
