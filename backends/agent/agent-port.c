/* agent-port.c - virtio-serial ports: one host connection at a time, reopened when it leaves */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "backends/agent/agent-int.h"

#define PORT_WAIT_MS 10000 /* how long --port-name waits for its port to appear */

/* (Re)open the port and watch it edge-triggered: an event on every change of the host's
 * connection (and on input), never a spin on the level POLLHUP of an unconnected port. */
void dsec__agent_port_open(struct port *p)
{
    p->fd = open(p->path, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (p->fd < 0) {
        dsec__agent_logmsg("opening port %s: %s (retrying)", p->path, strerror(errno));
        return;
    }
    dsec__agent_ep_ctl(EPOLL_CTL_ADD, p->fd, EPOLLIN | EPOLLOUT | EPOLLET, p);
}

/* The host connection served on p ended (its fd is closed). Reopening discards whatever the
 * host sent that was not read. */
void dsec__agent_port_lost(struct port *p)
{
    p->conn = NULL;
    p->fd = -1;
    if (!dsec__agent_g.terminating)
        dsec__agent_port_open(p);
}

/* An edge on a port no connection is served on: see where the host stands now. */
void dsec__agent_on_port(struct port *p)
{
    if (p->fd < 0 || p->conn)
        return;
    struct pollfd pfd = {.fd = p->fd, .events = POLLIN | POLLOUT};
    if (poll(&pfd, 1, 0) < 0 || pfd.revents == 0)
        return;
    if (pfd.revents & (POLLHUP | POLLERR | POLLNVAL)) /* no host connected */
        return;
    /* From now on the fd is level-triggered and its events go to the connection. */
    p->conn = dsec__agent_conn_new(p->fd, p, EPOLL_CTL_MOD);
    if (p->conn == NULL) { /* out of memory: try again on the next edge */
        dsec__agent_ep_ctl(EPOLL_CTL_MOD, p->fd, EPOLLIN | EPOLLOUT | EPOLLET, p);
    }
}

/* Ports that could not be reopened are retried once a second. */
void dsec__agent_ports_retry(void)
{
    for (size_t i = 0; i < dsec__agent_g.nports; i++)
        if (dsec__agent_g.ports[i].fd < 0 && dsec__agent_g.ports[i].conn == NULL)
            dsec__agent_port_open(&dsec__agent_g.ports[i]);
}

/* The /dev path of the virtio-serial port named name (/sys/class/virtio-ports/vportNpM/name),
 * waiting up to PORT_WAIT_MS for the driver to create it. */
static int port_by_name(const char *name, char *path, size_t size)
{
    uint64_t until = dsec__agent_now_ns() + (uint64_t)PORT_WAIT_MS * 1000000u;
    for (;;) {
        DIR *d = opendir("/sys/class/virtio-ports");
        struct dirent *de;
        while (d && (de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.')
                continue;
            char file[PATH_MAX], buf[256];
            snprintf(file, sizeof file, "/sys/class/virtio-ports/%s/name", de->d_name);
            int fd = open(file, O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                continue;
            ssize_t n = read(fd, buf, sizeof buf - 1);
            close(fd);
            if (n <= 0)
                continue;
            buf[n] = 0;
            buf[strcspn(buf, "\n")] = 0;
            if (strcmp(buf, name) == 0) {
                snprintf(path, size, "/dev/%s", de->d_name);
                closedir(d);
                return 0;
            }
        }
        if (d)
            closedir(d);
        if (dsec__agent_now_ns() >= until)
            return -1;
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
}

/* Open the ports of --port (a path) and --port-name (a name, waited for): args and is_name,
 * one each per port (dsec__agent_g.nports). -1 (said) when one is not there. */
int dsec__agent_ports_start(const char *const *args, const bool *is_name)
{
    for (size_t i = 0; i < dsec__agent_g.nports; i++) {
        struct port *p = &dsec__agent_g.ports[i];
        p->kind = K_PORT;
        if (!is_name[i]) {
            if ((size_t)snprintf(p->path, sizeof p->path, "%s", args[i]) >= sizeof p->path) {
                dsec__agent_logmsg("--port %s: path too long", args[i]);
                return -1;
            }
        } else if (port_by_name(args[i], p->path, sizeof p->path) < 0) {
            dsec__agent_logmsg("--port-name %s: no virtio-serial port of that name in "
                               "/sys/class/virtio-ports after %d ms",
                               args[i], PORT_WAIT_MS);
            return -1;
        }
        dsec__agent_port_open(p);
        if (p->fd < 0) /* a port that is not there at all is a configuration error */
            return -1;
    }
    return 0;
}
