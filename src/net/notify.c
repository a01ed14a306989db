#include "net/notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/log.h"
#include "core/util.h"

int sd_notify_send(const char *state, sd_err *err)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path)
        return 0;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || n >= sizeof sa.sun_path)
        return sd_err_set(err, SD_EINVAL, "$NOTIFY_SOCKET '%s' is not an absolute or '@' path",
                          path);
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@')
        sa.sun_path[0] = 0; /* abstract namespace: the name is not NUL-terminated */
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n +
                                  (path[0] == '@' ? 0 : 1));
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return sd_err_set(err, SD_EIO, "sd_notify: socket: %s", strerror(errno));
    ssize_t w = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen);
    int e = errno;
    close(fd);
    if (w < 0)
        return sd_err_set(err, SD_EIO, "sd_notify %s: sendto %s: %s", state, path, strerror(e));
    return 1;
}

uint64_t sd_notify_watchdog_usec(void)
{
    const char *us = getenv("WATCHDOG_USEC");
    if (!us || !*us)
        return 0;
    const char *pid = getenv("WATCHDOG_PID");
    int64_t v;
    if (pid && *pid && (sd_parse_i64(pid, &v) || v != (int64_t)getpid()))
        return 0;
    if (sd_parse_i64(us, &v) || v <= 0)
        return 0;
    return (uint64_t)v;
}

void sd_notify_state(const char *state)
{
    sd_err err = {0};
    if (sd_notify_send(state, &err) < 0)
        sd_log_warn("systemd notify: %s", err.msg);
}
